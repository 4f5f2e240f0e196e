"""Plan-Path (grid path planning) with a tool agent and a plan agent."""
