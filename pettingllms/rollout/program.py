"""The rollout of an agent program (``core/program.py``): K runs of the user's program per task against the
gateway (``rollout/gateway.py``), then one sample per call, credited with its agent's return.

Reads top to bottom (``arun``):
1. the gateway serves each agent with this rollout's sampling (training or validation);
2. every run (``problems`` x K) plays in a thread of its own with its own event loop (``asyncio.run``), up to
   ``MAX_CONCURRENT_RUNS`` at once, with its own API key, under ``env.timeout_s``;
3. a run that raised, timed out, or returned unusable rewards is recorded (``EpisodeRecord.error``, the traceback
   in the log) and its calls are dropped; if every run of the rollout failed, the rollout raises the first failure;
4. each call of a finished run becomes a sample of its agent with the agent's return as reward, in the group
   (task slot, ``WHOLE_EPISODE``, agent): trajectory GRPO over the task's K runs. An agent that made no call
   contributes nothing (logged the first time it happens in training); one that made calls but got no reward fails
   its run. A rollout whose finished runs made no call at all has nothing to train and raises.

A program is not forkable: tree sampling needs an env whose state can be copied, so programs train in
``rollout.mode=trajectory`` (the plan refuses another mode).
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pettingllms.core.env import Problem
from pettingllms.core.errors import ConfigError, EnvError
from pettingllms.core.program import AgentProgram, checked_rewards, episode_success
from pettingllms.core.types import FINISH_LENGTH, EpisodeRecord, Sample
from pettingllms.rollout.executor import (
    MAX_ABS_REWARD, WHOLE_EPISODE, AgentSpec, Executor, ExecutorConfig, RolloutResult, usable_reward,
)
from pettingllms.rollout.gateway import GENERATE, Call, Gateway, Route
from pettingllms.rollout.policy_client import LocalPolicyClient, PolicyClient

if TYPE_CHECKING:
    from pettingllms.core.checker import CheckReport

log = logging.getLogger(__name__)
MAX_CONCURRENT_RUNS = 64


class ProgramFailed(EnvError):
    """Every run of a rollout failed: the first one's error and traceback."""


@dataclass
class _Run:
    slot: int
    problem: Problem
    episode: str
    branch: int
    key: str  # the run's id at the gateway
    rewards: dict[str, float] | None = None
    error: str | None = None  # one line: what failed
    trace: str | None = None  # the program's traceback, when it raised
    calls: list[Call] = field(default_factory=list)  # answered while it ran (Gateway.end)


def run_bounded(coroutine: Any, timeout_s: float) -> Any:
    """``asyncio.run(asyncio.wait_for(coroutine, timeout_s))``, except that at the end it does not wait for the threads
    the program started with ``asyncio.to_thread`` (a synchronous client, a tool that hangs): ``asyncio.run`` joins
    them without a limit, so one blocked thread held the whole rollout past the timeout. Such a thread is left to end
    on its own; its calls are refused (``Gateway.end``)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # as asyncio.run does: the program may ask for "the" loop
    threads = ThreadPoolExecutor(thread_name_prefix="pettingllms-program-thread")
    loop.set_default_executor(threads)
    try:
        return loop.run_until_complete(asyncio.wait_for(coroutine, timeout_s))
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            threads.shutdown(wait=False, cancel_futures=True)
            asyncio.set_event_loop(None)
            loop.close()


class ProgramRollout:
    """The executor of an ``AgentProgram`` env: the same ``run``/``arun`` and ``RolloutResult`` as ``Executor``.
    Its samples are trajectory mode's whatever ``config.mode`` says (training refuses another mode in the plan)."""

    def __init__(self, env: AgentProgram, agents: Mapping[str, AgentSpec], clients: Mapping[str, PolicyClient],
                 config: ExecutorConfig) -> None:
        self.env, self.agents, self.clients, self.config = env, dict(agents), dict(clients), config
        self.gateway = Gateway(clients, config.max_prompt_length, config.max_response_length).start()
        self._rollouts = 0
        self._silent_logged: set[str] = set()  # agents already logged as having made no call in a training rollout

    def close(self) -> None:
        self.gateway.close()
        close_env = getattr(self.env, "close", None)  # an env holding servers of its own (verifiers' serving)
        if callable(close_env):
            close_env()

    def run(self, problems: Sequence[Problem], seeds: Sequence[int], validation: bool = False,
            n: int | None = None, opponents: Sequence[Any] | None = None) -> RolloutResult:
        """As ``Executor.run``; ``opponents`` (the opponent pool's seating) must be None: a program's calls reach the
        live agents only (the plan refuses a pool for programs)."""
        if opponents is not None:
            raise ConfigError("the opponent pool is not built for agent programs (set self_play.pool_size=0)")
        return asyncio.run(self.arun(problems, seeds, validation=validation, n=n))

    async def arun(self, problems: Sequence[Problem], seeds: Sequence[int], validation: bool = False,
                   n: int | None = None) -> RolloutResult:
        """``seeds`` are the trainer's; a program seeds itself from its task."""
        del seeds
        start = time.perf_counter()
        k = n or self.config.branching
        # 1. The agents, with this rollout's sampling.
        routes = {role: Route(spec.policy, spec.adapter, spec.val_sampling if validation else spec.train_sampling)
                  for role, spec in self.agents.items()}
        self._rollouts += 1  # a run's gateway id is unique across rollouts, so a straggler cannot join a later one
        runs = [_Run(slot, problem, f"p{slot}e{e}", e, f"{self._rollouts}/p{slot}e{e}")
                for slot, problem in enumerate(problems) for e in range(k)]
        self.gateway.open(routes, [run.key for run in runs])
        generating = self.gateway.clock.seconds(GENERATE)
        requests = self.gateway.requests
        # 2. Every run, each in its own thread and event loop.
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=min(MAX_CONCURRENT_RUNS, max(1, len(runs))),
                                thread_name_prefix="pettingllms-program") as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, self._play, run) for run in runs))
        # 3. Failures: recorded; all of them failing stops the run.
        calls = {run.episode: run.calls for run in runs}
        for run in runs:
            if run.error is None:
                self._check_rewarded(run, calls[run.episode])
        failed = [run for run in runs if run.error is not None]
        if failed:
            first = failed[0]
            if len(failed) == len(runs):
                raise ProgramFailed(f"every one of the {len(runs)} program runs failed; the first ({first.episode}, "
                                    f"task {first.problem.problem_id!r}): {first.error}\n{first.trace or ''}".rstrip())
            dropped = "left out of the scores" if validation else "their calls are not trained on"
            log.warning("%d of %d program runs failed (%s); the first, %s (task %r): %s%s", len(failed), len(runs),
                        dropped, first.episode, first.problem.problem_id, first.error,
                        f"\n{first.trace}" if first.trace else "")
        self._check_called(runs, calls, validation)
        # 4. Samples from the finished runs' calls.
        samples, episodes = [], []
        for run in runs:
            if run.error is None:
                samples.extend(self._samples(run, calls[run.episode]))
            episodes.append(self._record(run, calls[run.episode]))
        timings = {
            "rollout_s": time.perf_counter() - start,
            "generate_s": self.gateway.clock.seconds(GENERATE) - generating,
            "env_s": 0.0,  # the programs' own time is theirs; the rollout's wall time is rollout_s
            "generate_calls": float(self.gateway.requests - requests),
            "generated_sequences": float(self.gateway.requests - requests),
        }
        return RolloutResult(samples=samples, episodes=episodes, timings=timings)

    # -------------------------------------------------------------------------------------------- one run
    def _play(self, run: _Run) -> None:
        key = self.gateway.key_for(run.key)
        start = time.perf_counter()
        try:
            value = run_bounded(self.env.play(dict(run.problem.data), self.gateway.base_url, key), self.env.timeout_s)
            run.rewards = checked_rewards(value, list(self.agents))
        except asyncio.TimeoutError:
            run.error = f"the program did not finish within env.options.timeout={self.env.timeout_s:g} s"
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the program's own failure (sys.exit included): recorded, the run goes on
            run.error = f"the program raised {type(exc).__name__}: {exc}"
            run.trace = "".join(traceback.format_exception(exc)).rstrip()
        finally:  # what the program does from now on (a thread it left running) is refused, and never trained
            run.calls = self.gateway.end(run.key)
        took = time.perf_counter() - start
        if run.error is None and took > self.env.timeout_s:  # wait_for cannot stop a call that blocks the loop
            run.error = (f"the program took {took:.1f} s, past env.options.timeout={self.env.timeout_s:g} s: a "
                         f"blocking call inside async def run holds its event loop (await it, or run it with "
                         f"asyncio.to_thread)")

    def _check_called(self, runs: Sequence[_Run], calls: Mapping[str, Sequence[Call]], validation: bool) -> None:
        """A rollout whose finished runs made no call trains nothing: refused. In training, an agent that made no
        call in any run is logged the first time (it is not trained while it makes none)."""
        finished = [run for run in runs if run.error is None]
        made = {c.agent for run in finished for c in calls[run.episode]}
        if finished and not made:
            raise EnvError(f"the program made no model call in any of the {len(finished)} runs that finished: there "
                           f"is nothing to train or score. Its calls must reach the run's gateway: the base_url and "
                           f"api_key run() is given, with model=<agent name> ({sorted(self.agents)}); "
                           f"`pettingllms check-env program --option program=<module>` shows what it does")
        silent = sorted(set(self.agents) - made - self._silent_logged)
        if finished and silent and not validation:
            self._silent_logged.update(silent)
            log.warning("agent(s) %s made no call in any of this step's %d finished program runs, so they are not "
                        "trained this step (logged once per agent); the program's calls name an agent with "
                        "model=<agent name>", silent, len(finished))

    def _check_rewarded(self, run: _Run, calls: Sequence[Call]) -> None:
        """A run whose agent made calls but got no reward fails; a non-finite reward follows reward.non_finite."""
        unrewarded = sorted({c.agent for c in calls} - set(run.rewards or {}))
        if unrewarded:
            run.error = (f"the program returned no reward for {unrewarded}, which made calls; return every calling "
                         f"agent's reward (got {run.rewards})")
            return
        bad = {agent: r for agent, r in (run.rewards or {}).items() if not usable_reward(r)}
        if bad and self.config.non_finite == "error":
            raise EnvError(f"program run {run.episode} (task {run.problem.problem_id!r}) returned non-finite or "
                           f"overflowing rewards {bad}. Rewards must be finite numbers within ±{MAX_ABS_REWARD:g}, "
                           "or set reward.non_finite=drop to leave such samples out of training")

    def _samples(self, run: _Run, calls: Sequence[Call]) -> list[Sample]:
        out = []
        for call in calls:
            spec = self.agents[call.agent]
            reward = run.rewards[call.agent]
            usable = usable_reward(reward)
            out.append(Sample(
                policy=spec.policy, agent=call.agent, turn=call.index, group=(run.slot, WHOLE_EPISODE, call.agent),
                episode=run.episode, problem_id=run.problem.problem_id, branch=run.branch,
                prompt_ids=call.prompt_ids, response_ids=call.completion.token_ids,
                response_logprobs=call.completion.logprobs, reward=reward if usable else 0.0,
                local_reward=reward if usable else 0.0,  # a program's reward is its agent's own
                temperature=call.sampling.temperature, adapter=spec.adapter, failed=call.completion.failed,
                nonfinite_reward=not usable, truncated=call.completion.finish_reason == FINISH_LENGTH,
                response_text=call.completion.text,
            ))
        return out

    def _decode(self, call: Call) -> str:
        return self.clients[self.agents[call.agent].policy].codec.decode(call.prompt_ids)

    def _record(self, run: _Run, calls: Sequence[Call]) -> EpisodeRecord:
        rewards = run.rewards if run.error is None else {}
        usable = {a: r for a, r in (rewards or {}).items() if usable_reward(r)}
        return EpisodeRecord(
            episode=run.episode, problem_id=run.problem.problem_id, turns=len(calls), terminated=run.error is None,
            truncated=False, success=run.error is None and episode_success(usable),
            team_reward=sum(usable.values()) / len(usable) if usable else 0.0, agent_rewards=dict(usable),
            error=run.error, nonfinite_rewards=len(rewards or {}) - len(usable),
            transcript=[{"turn": c.index, "agent": c.agent, "prompt": self._decode(c), "response": c.completion.text,
                         "reward": usable.get(c.agent, 0.0), "team_reward": 0.0,
                         "local_reward": usable.get(c.agent, 0.0)}
                        for c in calls],
        )


def rollout_for(env: Any, agents: Mapping[str, AgentSpec], clients: Mapping[str, PolicyClient],
                config: ExecutorConfig) -> Executor | ProgramRollout:
    """The env's executor: ``ProgramRollout`` for an agent program, the ``Executor`` for every other env."""
    if isinstance(env, AgentProgram):
        return ProgramRollout(env, agents, clients, config)
    return Executor(env, agents, clients, config)


# ----------------------------------------------------------------------------------------------------- check-env
def check_program(env: AgentProgram, seed: int = 0, name: str | None = None, runs: int = 2) -> "CheckReport":
    """check-env for an agent program: its tasks, then runs against a scripted endpoint through this module's
    rollout and gateway (the run's own): with a plain answer and with garbage, every run must finish and reward each
    agent that called, with finite rewards; each agent must call in some run. Never raises for a failing program."""
    from pettingllms.core.checker import (CheckContext, CheckReport, CheckResult, check_splits_are_disjoint,
                                          random_responses)

    report = CheckReport(name or type(env).__name__)
    try:
        train, test = env.procedural_problems("train", 4), env.procedural_problems("test", 4)
        shared = check_splits_are_disjoint(CheckContext(env))  # over the counts a run asks for
    except Exception as exc:  # noqa: BLE001 - the program's own failure is the report
        report.results.append(CheckResult("tasks", False, f"{type(exc).__name__}: {exc}"))
        return report
    empty = [split for split, tasks in (("train", train), ("test", test)) if not tasks]
    report.results.append(CheckResult("tasks", not shared and not empty,
                                      shared or (f"no {' and no '.join(empty)} tasks" if empty else "")))
    garbage = random_responses(64, seed)
    scripts = {"runs finish on plain answers": lambda prompt, k, request: "42",
               "runs finish on garbage answers": lambda prompt, k, request: garbage[len(prompt) % len(garbage)]}
    called: set[str] | None = None  # the agents that called in any run, failed runs included
    for check, script in scripts.items():
        try:
            result = _scripted_rollout(env, script, test[:2], runs)
        except Exception as exc:  # noqa: BLE001 - reported
            report.results.append(CheckResult(check, False, f"{type(exc).__name__}: {exc}"))
            continue
        failures = [e for e in result.episodes if e.error is not None]
        nonfinite = sum(e.nonfinite_rewards for e in result.episodes)
        detail = (f"{len(failures)} of {len(result.episodes)} runs failed; the first: {failures[0].error}" if failures
                  else f"{nonfinite} non-finite reward(s)" if nonfinite else "")
        report.results.append(CheckResult(check, not detail, detail))
        called = (called or set()) | {entry["agent"] for e in result.episodes for entry in e.transcript}
    if called is None:
        report.results.append(CheckResult("every agent calls", False, "not checked: every run failed (above)"))
        return report
    silent = [agent for agent in env.graph.agents if agent not in called]
    report.results.append(CheckResult(
        "every agent calls", not silent, f"{silent} made no call in any run: is each the `model` name the program "
                                         "uses?" if silent else ""))
    return report


def _scripted_rollout(env: AgentProgram, script, problems: Sequence[Problem], runs: int) -> RolloutResult:
    from pettingllms.core.registry import make_agents
    from pettingllms.core.types import SamplingParams
    from pettingllms.rollout.scripted import ScriptedEngine

    engine = ScriptedEngine(script)
    sampling = SamplingParams(max_tokens=256)
    specs = {role: AgentSpec(agent, "policy_0", sampling, sampling) for role, agent in make_agents(env).items()}
    config = ExecutorConfig(mode="trajectory", branching=runs, select="first", alpha=1.0,
                            max_prompt_length=1_000_000, max_response_length=256, non_finite="drop", playouts=1,
                            streaming=False, streaming_wait_s=0.0)
    rollout = ProgramRollout(env, specs, {"policy_0": LocalPolicyClient(engine, engine.codec)}, config)
    try:
        return rollout.run(problems, list(range(len(problems))))
    finally:
        rollout.close()
