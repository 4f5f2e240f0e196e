"""Built-in environments. Each registers lazily here, through the same public API a user's package uses."""

from pettingllms.core.registry import register_agent, register_env

register_env("toy_targets", "envs.toy.env:TargetsEnv")
register_agent("toy.target_writer", "envs.toy.env:TargetWriter")
