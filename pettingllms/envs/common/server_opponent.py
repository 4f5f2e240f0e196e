"""A game's opponent served elsewhere: a model behind any OpenAI-compatible endpoint plays the seats the trained agent
does not hold (``env.options.opponent=server`` of the OpenSpiel and TextArena adapters).

The env sends it the prompt that seat would see and plays its answer; the answer's move is part of the game's
history, so a replayed or forked game never asks again. A failed request (``chat_client.chat_once``: bounded in time
and size) is the env's to replace with a fallback move, which it counts in ``info/opponent_fallbacks``; the first
cause is logged once per env.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping, Sequence

from pettingllms.core.errors import ConfigError
from pettingllms.envs.common.chat_client import ChatError, chat_once

log = logging.getLogger("pettingllms.envs")


class ServerOpponent:
    """``env.options``' opponent_url, opponent_model, opponent_key_env, opponent_temperature, opponent_timeout."""

    def __init__(self, url: str, model: str, key_env: str = "OPENAI_API_KEY", temperature: float = 0.0,
                 timeout_s: float = 60.0, *, env_name: str) -> None:
        if not (url and model):
            raise ConfigError("env.options.opponent=server needs env.options.opponent_url (an OpenAI-compatible API "
                              "root, /v1 included) and env.options.opponent_model")
        if timeout_s <= 0:
            raise ConfigError(f"env.options.opponent_timeout={timeout_s:g}: must be > 0 seconds")
        self.url, self.model, self.key_env = url, model, key_env
        self.temperature, self.timeout_s = float(temperature), float(timeout_s)
        self.env_name = env_name
        self._warned = False

    def ask(self, messages: Sequence[Mapping[str, str]], max_tokens: int = 32) -> tuple[str, None] | tuple[None, str]:
        """(the served model's answer, None), or (None, why there is none)."""
        try:
            return chat_once(self.url, self.model, messages, api_key=os.environ.get(self.key_env),
                             max_tokens=max_tokens, temperature=self.temperature, timeout_s=self.timeout_s), None
        except ChatError as exc:
            return None, f"the request failed: {exc}"

    def fell_back(self, cause: str, fallback: str) -> None:
        """Log the first fallback's cause (the rest are counted by the env)."""
        if not self._warned:
            self._warned = True
            log.warning("%s opponent %s at %s: %s; %s instead (counted in info/opponent_fallbacks; logged once)",
                        self.env_name, self.model, self.url, cause, fallback)
