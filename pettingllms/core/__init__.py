"""Public API: types, the Env and Agent protocols, the agent graph and the registries. Standard library only."""

from pettingllms.core.env import Agent, Env, Problem
from pettingllms.core.errors import (
    ConfigError,
    DataError,
    DiskFullError,
    EnvError,
    InfrastructureError,
    PettingLLMsError,
    PromptTooLongError,
    RegistryError,
    NonFiniteGradientError,
    RolloutMismatchError,
    UnsafeCheckpointError,
)
from pettingllms.core.graph import AgentGraph
from pettingllms.core.registry import (
    AGENTS,
    ENVS,
    get_agent_class,
    get_env_class,
    register_agent,
    register_env,
)
from pettingllms.core.types import (
    Completion,
    EpisodeRecord,
    GenerationRequest,
    GenerationResult,
    GroupKey,
    Message,
    Sample,
    SamplingParams,
    Transition,
)

__all__ = [
    "AGENTS",
    "ENVS",
    "Agent",
    "AgentGraph",
    "Completion",
    "ConfigError",
    "DataError",
    "DiskFullError",
    "Env",
    "EnvError",
    "EpisodeRecord",
    "GenerationRequest",
    "GenerationResult",
    "GroupKey",
    "InfrastructureError",
    "Message",
    "PettingLLMsError",
    "Problem",
    "PromptTooLongError",
    "RegistryError",
    "NonFiniteGradientError",
    "RolloutMismatchError",
    "UnsafeCheckpointError",
    "Sample",
    "SamplingParams",
    "Transition",
    "get_agent_class",
    "get_env_class",
    "register_agent",
    "register_env",
]
