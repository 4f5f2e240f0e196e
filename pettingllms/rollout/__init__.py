"""Rollout: the engine protocol, the transformers engine, the request batcher and the agent-graph executor."""
