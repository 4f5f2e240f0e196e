"""A request the gateway refuses: its HTTP status, message and OpenAI error type (``rollout/gateway.py`` answers it as
``{"error": {message, type, code}}``; ``rollout/responses_api.py`` raises it too)."""

from __future__ import annotations


class RequestError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code = status, code
