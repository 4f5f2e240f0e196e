"""Errors that name the problem. Each says what was wrong and what to do about it."""


class PettingLLMsError(Exception):
    """Base class: every error this library raises on purpose."""


class RegistryError(PettingLLMsError, KeyError):
    """Unknown name, or a different object registered again under an existing name."""

    def __str__(self) -> str:  # KeyError would otherwise print the message in quotes
        return str(self.args[0]) if self.args else ""


class ConfigError(PettingLLMsError, ValueError):
    """A configuration that cannot work (bad value, impossible layout, missing piece)."""


class UnsafeCheckpointError(PettingLLMsError, ValueError):
    """A checkpoint file refers to something a checkpoint never needs (a function to call, a path outside its
    folder): it was tampered with or is foreign, and is not loaded."""


class DamagedCheckpointError(PettingLLMsError, ValueError):
    """A checkpoint file is truncated or unreadable (a full disk, an interrupted copy, an edit): it is not loaded."""


class DataError(PettingLLMsError, ValueError):
    """A missing, empty or malformed dataset."""


class PromptTooLongError(PettingLLMsError, ValueError):
    """A prompt exceeds ``training.max_prompt_length``."""


class EnvError(PettingLLMsError, RuntimeError):
    """An environment crashed or broke its contract."""


class DiskFullError(PettingLLMsError, OSError):
    """A write failed for lack of room: a full disk, a quota, or a file size limit. The message names which, the
    path and the free bytes there."""


class InfrastructureError(PettingLLMsError, RuntimeError):
    """Something outside the model's control failed (sandbox, engine). Never scored as a wrong answer."""


class RolloutMismatchError(PettingLLMsError, RuntimeError):
    """The rollout engine's logprobs disagree with the learner's on the same tokens: the engine is not sampling
    from the policy the learner trains (stale weights, a wrong adapter, a precision mismatch)."""


class NonFiniteGradientError(PettingLLMsError, RuntimeError):
    """The gradient norm was NaN or infinite in too many training steps in a row (``optim.max_nonfinite_grad_steps``):
    the weights have stopped moving, so the run stops instead of going on without learning."""


class StoppedBySignal(PettingLLMsError, RuntimeError):
    """A run stopped by SIGTERM (a scheduler's preemption, ``kill``): raised in the main thread so that the run
    releases what it started and stays resumable; the command exits with ``exit_code`` (128 + the signal)."""

    def __init__(self, message: str, signum: int = 15) -> None:
        # signum defaults to SIGTERM's: a library that catches the exception where the signal landed and re-raises
        # one of the same type from its message alone (omegaconf does, inside its config code) must still give the
        # run its exit code, not a TypeError
        super().__init__(message)
        self.exit_code = 128 + signum
