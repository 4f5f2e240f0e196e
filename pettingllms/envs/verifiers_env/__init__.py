"""``env.name=verifiers``: an environment written for verifiers (PrimeIntellect's library, its v1 API) trained as an
agent program (``core/program.py``): each episode is the verifiers env's own ``run_episode``, its roles' model calls
go to the run's gateway with each role's name as its ``model``, and each role's reward is its traces' reward.

    env.name=verifiers env.options.config='{taskset: {id: my_taskset}}'     # the env's [env] block, as a dict

``config`` is what ``vf.resolve_env_config`` takes (the TOML ``[env]`` block of a verifiers run): ``id``, ``taskset``
and one section per role. Each role's ``model`` is set to its name (the gateway routes it to the role's policy or
adapter); a role without a ``runtime`` runs as a local subprocess (verifiers' default is a Prime sandbox). A taskset
has no splits: the last ``test_size`` tasks are the test split, the others train.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
import uuid
from typing import Any, Mapping, Sequence

from pettingllms.core.env import Problem
from pettingllms.core.errors import EnvError
from pettingllms.core.program import AgentProgram

log = logging.getLogger("pettingllms.envs")
# verifiers imports a taskset by its id as a top-level module name: the example is known to it as pettingllms_sums.
EXAMPLE_ID = "pettingllms-sums"
EXAMPLE = {"taskset": {"id": EXAMPLE_ID}}
KEY_VARIABLE = "PETTINGLLMS_GATEWAY_API_KEY"  # verifiers reads a client's key from the environment variable it names
INSTALL = ("verifiers is not installed: pip install -e '.[verifiers]' (verifiers==0.4.0; it needs openai<3, so not "
           "beside the `programs` extra: scripts/install_verifiers.sh builds such a venv)")


def verifiers_installed() -> bool:
    return importlib.util.find_spec("verifiers") is not None


class VerifiersEnv(AgentProgram):
    """A verifiers v1 env. ``config``: its ``[env]`` block; ``agents``: its roles (``env.agents``; default every
    role, each must be trained); ``test_size``: the last tasks held out for validation; ``timeout``: seconds per
    episode."""

    known_options = ()
    takes_config_agents = True
    requires = "verifiers"  # check-env --all skips it where the package is missing, saying so

    def __init__(self, config: Mapping[str, Any] | None = None, agents: Sequence[str] = (), test_size: int = 50,
                 timeout: float = 600.0, max_turns: int = 1) -> None:
        if not verifiers_installed():
            raise EnvError(INSTALL)
        _register_example()
        self.config, roles = _with_local_roles(dict(EXAMPLE if config is None else config))
        self._vf_env: Any = None
        self._lock = threading.Lock()
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._serving: asyncio.Task | None = None  # the task holding serving(), where the env needs it
        vf_env = self._env()
        unknown = sorted(set(agents) - set(roles))
        if unknown:
            raise EnvError(f"env.agents names {unknown}, which are not roles of this verifiers env: {roles}")
        if not vf_env.taskset.bounded:
            raise EnvError("the taskset of env.options.config is endless (INFINITE): bound it in its config (e.g. a "
                           "count of tasks) so that its tasks can be split into train and test")
        self.roles = roles
        self.tasks = list(vf_env.taskset)
        if not 0 < test_size < len(self.tasks):
            raise EnvError(f"env.options.test_size={test_size}: the taskset holds {len(self.tasks)} tasks; hold out "
                           f"at least one and leave at least one to train on")
        if not timeout > 0:
            raise EnvError(f"env.options.timeout must be > 0 seconds, got {timeout}")
        self.test_size = int(test_size)
        super().__init__(list(agents) or roles, max_turns=max_turns)
        self.timeout_s = float(timeout)
        untrained = [r for r in roles if r not in self.graph.agents]
        if untrained:  # their calls are served by the gateway too, so they must be agents of the run
            raise EnvError(f"every role of a verifiers env calls the model: list them all in env.agents "
                           f"({roles}); {untrained} were left out")
        # serving() only where the env needs it (shared tool servers, its own start/stop): verifiers' interception
        # held by serving() keeps one client per endpoint config until it ends, and each run has its own key, so it
        # would hold one per episode for the whole run; without it each episode's server and client end with it.
        own_hooks = [hook for hook in ("start", "stop") if getattr(type(vf_env), hook) is not getattr(_vf_base(), hook)]
        self._needs_serving = bool(vf_env.taskset.toolsets(vf_env.taskset.config)) or bool(own_hooks)
        if self._needs_serving:
            log.warning("verifiers env: its shared tools or start()/stop() need serving(), held for the whole run; "
                        "verifiers' interception then keeps one HTTP client per episode (each run has its own key) "
                        "until the run ends")

    def _env(self):
        """The verifiers Env, loaded once. Every episode runs on one event loop (``_loop``): verifiers' servers and
        locks are bound to the loop they start on (two episodes on two loops hung)."""
        if self._vf_env is None:
            import verifiers.v1 as vf

            try:
                self._vf_env = vf.load_environment(vf.resolve_env_config(self.config))
            except Exception as exc:  # noqa: BLE001 - verifiers' own config and import errors, said in one line
                raise EnvError(f"env.options.config: verifiers could not load it: {type(exc).__name__}: {exc}") from exc
        return self._vf_env

    async def play(self, task: Mapping[str, Any], base_url: str, api_key: str) -> Mapping[str, float]:
        # The key names the run: one variable per run. "API_KEY" in its name keeps it out of the harnesses'
        # subprocesses (verifiers' subprocess runtime drops such variables), so no harness sees another run's key.
        variable = f"{KEY_VARIABLE}_{uuid.uuid4().hex}"
        os.environ[variable] = api_key
        try:
            episode = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self._episode(task["index"], base_url, variable), self._loop()))
        finally:
            os.environ.pop(variable, None)
        frozen = sorted({t.agent.name for t in episode.traces if not t.agent.trainable})
        if frozen:
            raise EnvError(f"the verifiers env marks {frozen} untrainable (trainable=False), but each role's calls "
                           f"are trained here; make them trainable in the env, or leave them out of it")
        if not self._vf_env.complete(episode):
            errors = [f"{e.type}: {e.message}" for e in episode.errors]
            errors += [f"{t.agent.name}: {e.type}: {e.message}" for t in episode.traces for e in t.errors]
            raise EnvError(f"the verifiers episode failed: {'; '.join(errors)[:2000] or 'a trace did not finish'}")
        return role_rewards(episode.traces)

    async def _episode(self, index: int, base_url: str, key_variable: str) -> Any:
        """One episode on the verifiers loop, with no retry (a retried episode's first calls would be trained with
        the retry's reward: a failed episode is a failed run)."""
        import verifiers.v1 as vf

        vf_env = self._env()
        if self._needs_serving:
            if self._serving is None:  # no await before this: the first episode on the loop starts it
                self._serving = asyncio.get_running_loop().create_task(self._serve(vf_env))
            await self._served.wait()
            if self._serving.done():  # serving() failed to start (or ended): its error is every episode's
                self._serving.result()
                raise EnvError("the verifiers env's serving() ended")
        context = vf.ModelContext(model=self.roles[0], client=vf.EvalClientConfig(base_url=base_url,
                                                                                   api_key_var=key_variable))
        return await vf_env.run_episode(self.tasks[index], context)

    async def _serve(self, vf_env: Any) -> None:
        """Hold ``serving()`` in one task, entered and left there (its servers' scopes are bound to that task)."""
        try:
            async with vf_env.serving():
                self._served.set()
                await self._stop.wait()
        finally:
            self._served.set()

    def _loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._event_loop is None:
                self._event_loop = asyncio.new_event_loop()
                self._served, self._stop = asyncio.Event(), asyncio.Event()
                threading.Thread(target=self._event_loop.run_forever, name="verifiers-loop", daemon=True).start()
            return self._event_loop

    def close(self) -> None:
        """Leave ``serving()``, let every episode still unwinding finish (cancelled), stop the loop; the rollout
        calls it at its end. A later episode starts afresh."""
        with self._lock:
            loop, self._event_loop = self._event_loop, None
            serving, self._serving = self._serving, None
            stop = getattr(self, "_stop", None)
        if loop is None:
            return
        try:
            if serving is not None:
                loop.call_soon_threadsafe(stop.set)
            asyncio.run_coroutine_threadsafe(_cancel_all(), loop).result(timeout=120)
        finally:
            loop.call_soon_threadsafe(loop.stop)

    def procedural_problems(self, split: str, count: int) -> Sequence[Problem]:
        held_out = len(self.tasks) - self.test_size
        indices = range(held_out, len(self.tasks)) if split == "test" else range(held_out)
        return [Problem(_task_id(self.tasks[i], i), {"index": i, "prompt": self.tasks[i].data.prompt_text})
                for i in list(indices)[:count]]

    @classmethod
    def example_problems(cls, n: int = 2) -> Sequence[Problem]:
        return VerifiersEnv().procedural_problems("test", n)


async def _cancel_all() -> None:
    """Every other task on this loop (serving's, after its stop; episodes a timeout abandoned), ended and awaited."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    done, pending = await asyncio.wait(others, timeout=60) if others else (set(), set())
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=30)


def _vf_base() -> type:
    import verifiers.v1 as vf

    return vf.Env


def role_rewards(traces: Sequence[Any]) -> dict[str, float]:
    """Each role's reward: its trace's (a role that ran several times in the episode, as best-of-n's, gets their
    mean: one reward per role and episode is what a program's samples carry)."""
    by_role: dict[str, list[float]] = {}
    for trace in traces:
        by_role.setdefault(trace.agent.name, []).append(float(trace.reward))
    return {role: sum(values) / len(values) for role, values in by_role.items()}


def _with_local_roles(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Each role's ``model`` set to its name and, unless given, a local subprocess runtime (verifiers' default, a
    Prime sandbox, needs an account and a tunnel). Roles are the config's sections the env class declares."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields

    try:
        declared = agent_config_fields(vf.resolve_env_config(config))
    except Exception as exc:  # noqa: BLE001
        raise EnvError(f"env.options.config: verifiers refused it: {type(exc).__name__}: {exc}") from exc
    out = dict(config)
    for role, resolved in declared.items():  # the role as the env class and the config declare it
        section = dict(out.get(role) or {})
        if "model" in resolved.model_fields_set and resolved.model not in (None, role):
            log.warning("verifiers role %r: its model %r is replaced by %r (the gateway routes a call to the "
                        "role's policy by that name)", role, resolved.model, role)
        section["model"] = role
        if "runtime" not in resolved.model_fields_set:  # verifiers' default (a Prime sandbox): a local subprocess
            section["runtime"] = {"type": "subprocess"}
        out[role] = section
    return out, list(declared)


def _register_example() -> None:
    import sys

    from pettingllms.envs.verifiers_env import example

    sys.modules.setdefault(EXAMPLE_ID.replace("-", "_"), example)


def _task_id(task: Any, index: int) -> str:
    return str(task.data.id) if task.data.id else f"task-{index}"
