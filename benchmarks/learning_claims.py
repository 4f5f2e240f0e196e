"""The paper's claim at CPU scale: AT-GRPO against trajectory GRPO and single-agent GRPO, on held-out problems.

    python benchmarks/learning_claims.py                   # pre-registration 2: 3 methods x 16 paired seeds, vault
    python benchmarks/learning_claims.py --quick           # a short end-to-end check (1 seed, tiny random model and budget; bench lane)
    python benchmarks/learning_claims.py --seeds 0 1       # some of the seeds; runs already finished are kept (below)
    python benchmarks/learning_claims.py --record benchmarks/results/learning_claims_paired_vault_runs.jsonl
                                                           # resume from the committed runs (how it is run in pieces)
    python benchmarks/learning_claims.py --protocol first  # pre-registration 1, as it ran (3 seeds)
    python benchmarks/learning_claims.py --env cpu_sudoku --quick   # a built-in game, through its cpu_<env> preset
    python benchmarks/learning_claims.py --protocol early --record benchmarks/results/learning_claims_early_vault_runs.jsonl
                                                           # pre-registration 4: AT-GRPO vs trajectory at 1,000 tokens
    python benchmarks/learning_claims.py --protocol paired_outcome --env cpu_tictactoe \
        --record benchmarks/results/learning_claims_paired_outcome_cpu_tictactoe_runs.jsonl
                                                           # pre-registration 5: outcome credit on tic-tac-toe

Every finished run is appended to ``<log-dir>/runs.jsonl`` at once, with the protocol it ran under; a later
invocation reads it and runs only the (method, seed) pairs missing there under the same protocol, env and
overrides, so a comparison can be stopped and resumed, and a run cut off mid-way loses at most the run in progress.
A full run of an (protocol, env) pair that is not pre-registered (``REGISTERED``) is refused; ``--quick`` runs any.

Writes ``benchmarks/results/learning_claims_paired_vault.json`` and ``.png`` (pre-registration 2: the command, the
machine, the protocol, every run's curve and timing, the per-method summary and the paired comparisons; the figure:
per method a thin line per seed and the mean thick, and AT-GRPO's paired differences with their intervals), or
``benchmarks/results/learning_claims.json`` and ``.png`` under ``--protocol first``.

PRE-REGISTRATION 2: PAIRED SEEDS (``--protocol paired``, the default; ``PAIRED`` and ``VAULT`` below. Written and
committed in its own commit before the first full run; not to be changed after seeing results; if it must change,
the first result is kept and both are reported.)

- Question: at equal generated training tokens, does AT-GRPO learn the vault task faster than trajectory GRPO (the
  comparison pre-registration 1 left open: its 3 seeds spread as widely as the difference), and than single-agent
  GRPO?
- Task, model, learner, sampling and the three methods: exactly as in pre-registration 1 (below), with one change
  that leaves the maths alone: the learner's micro-batches hold at most 1,024 tokens
  (``optim.micro_batch_max_tokens``, as in the quickstart, where it made updates faster with the same loss and
  gradient norm).
- Budget: 3,000 generated training tokens per run, as before (steps of 4 problems; the step that crosses the budget
  is completed). Not shortened: in pre-registration 1, 5 of the 9 runs were still rising between the evaluation at
  about 2,400 tokens and the end, so a shorter budget would cut off the phase in which the methods differed.
- Held-out evaluation (greedy, independent episodes, up to 2 turns, the test seed space, never trained on): before
  training on the first 32 test problems; at the first step reaching 1,000 and 2,000 tokens on the same 32; after the
  last step on 64 (those 32 and the next 32). The start is the base model's (LoRA B starts at zero; greedy
  decoding), so it is the same for every seed of a method: a check of the set-up, not part of any metric.
- Seeds: 0 to 15, 16 per method. Seed s of every method shares data order (the same training problems in the same
  order) and initialisation (``training.seed``: the cursor, the LoRA weights, the sampler). 16 rather than 8: in
  pre-registration 1 the per-seed differences AT-GRPO minus trajectory on the primary metric were +0.79, -0.28 and
  +0.25 (sd 0.54); a 95% interval of the mean of n such differences is about +-1.96 * 0.54 / sqrt(n): +-0.37 for 8
  seeds, so 8 could separate only a difference larger than the 0.25 seen, and +-0.26 for 16, about even odds at
  0.25 (the sd is itself a 3-seed estimate).
- Metric: held-out team success (the vault opened). Primary: the mean over the 3 evaluation points after the start
  (1,000 and 2,000 tokens on 32 problems, the end on 64): the area under the held-out curve per token, rewarding
  learning fast within the budget. Secondary: the final held-out success (64 problems).
- Test, for each baseline (trajectory, single agent) and each metric: the per-seed differences d_s = AT-GRPO(s) minus
  baseline(s) over the 16 seeds; their mean; its 95% paired percentile bootstrap interval (``benchmarks/_paired.py``:
  100,000 resamples of the 16 differences with replacement, drawn by ``random.Random(0)``; the 2.5% and 97.5%
  quantiles of the resample means as the inverse distribution function, without interpolation).
- Decision rule: AT-GRPO is better than a baseline when the interval lies above 0 (its low end > 0), the baseline is
  better when it lies below 0 (high end < 0), otherwise they are not separated at this scale. The primary decision
  is AT-GRPO against trajectory GRPO on the primary metric; the second, AT-GRPO against single-agent GRPO on the
  primary metric, at the same level without a correction for two; the final-success comparisons are secondary and
  reported with their intervals. With fewer than 16 paired seeds finished there is no decision, only a report of
  the seeds done. Reported whichever way it falls, with the per-seed values and the number of seeds on each side.
- Runs: each (method, seed) once. A run that collapses (held-out success falling to 0) is a result and is kept; a
  run that stops on an error is not in ``runs.jsonl`` and is run again from its start, and the error is reported. No
  seed is added, dropped or rerun after its result is seen.
- Cost, estimated from pre-registration 1: its runs took 18-22 min each (seed 2, exact records) on this 2-core
  machine while it was shared with the test lanes, with 384 held-out episodes (6 evaluations of 64) and 6-10
  training steps each. Held-out episodes cost about 1.1 s each at the base model's success (2 turns; less once
  episodes end in 1 turn) and training about 33 ms per generated token on a quiet machine (the quickstart's log:
  70 s for its first 64 episodes, 16-34 s per step of 500-1,000 tokens), so evaluation was about two thirds of a
  run. Here a run evaluates 160 episodes (32 + 32 + 32 + 64): about 5 min on a quiet machine and about 11 min shared
  as pre-registration 1's were (their 2.2x). 48 runs (3 methods x 16 seeds): about 4 h quiet, about 9 h shared. The
  benchmark stops and resumes at run granularity (above), so it can run in pieces.
- Built-in game (Plan-Path, Sudoku or Sokoban, ``--env cpu_<env>``): to be fixed when its preset exists; none
  exists as this is written, so only ``--quick`` runs there. Its budget, evaluation points and seeds are to be
  written here and added to ``REGISTERED`` in a commit of their own before its first full run.

PRE-REGISTRATION 3: A BUILT-IN GAME, PLAN-PATH (``--protocol paired_game --env cpu_plan_path``; ``GAME_PAIRED``.
Written and committed in its own commit on 2026-11-26, after ``cpu_plan_path`` was shown to learn
(docs/environments/games.md) and before any run of this comparison; the same rules of change as pre-registration 2.)

- Question: on the Plan-Path preset, at equal generated training tokens, does AT-GRPO's tree grouping learn faster
  than trajectory GRPO?
- Task and model: ``+experiment=cpu_plan_path`` as shipped: 4x4 grids without walls, a 6-move budget, 2 turns, the
  plan agent alone with the compact prompt, the packaged SmolLM2-135M in float32, one LoRA adapter (rank 32), lr
  3e-4 (one warmup step, then constant, as ``RUN``), temperature 0.5 in training, greedy held-out evaluation.
- Methods: the preset is played by one agent (a 135M model writes no working search program, so the tool agent is
  left out), so single-agent GRPO and trajectory GRPO are the same method here and only two are compared:
  ``at_grpo`` (tree rollouts, K=4 at each (turn, agent) node, groups per (problem, turn, agent)) and ``trajectory``
  (K=4 independent episodes per problem, one group per (problem, agent), each sample scored with its episode's
  return). The AT-GRPO-vs-single-agent question of the paper needs a team, which this preset does not have.
- Budget: 1,500 generated training tokens per run (steps of 4 problems; the step that crosses it is completed). In
  the preset's run, tree steps of 8 grids generated about 220 tokens each, and training success reached 0.88 by
  about 1,200 tokens, so 1,500 tokens keeps the rising phase in which methods can differ.
- Held-out evaluation (greedy, independent episodes, the test seed space): before training on the first 32 test
  grids; at the first step reaching 500 and 1,000 tokens on the same 32; after the last step on 64.
- Seeds: 0 to 7, 8 per method, paired as in pre-registration 2 (seed s of both methods shares data order and
  initialisation).
- Metric, test and decision rule: as pre-registration 2 (primary: the mean over the three evaluation points after
  the start; secondary: the final success on 64; the 95% paired percentile bootstrap interval of the mean per-seed
  difference AT-GRPO minus trajectory; better when the interval lies above or below 0, otherwise not separated;
  with fewer than 8 paired seeds, no decision). One comparison, so no correction. Reported whichever way it falls.
- Cost, estimated from the preset's run on a quiet machine (38 s per step of 8 grids, 90 s to evaluate 64): about
  4 min of training and 4 min of evaluation per run, 16 runs in about 2.2 h. It resumes at run granularity.

PRE-REGISTRATION 4: THE EARLY LEAD ON VAULT (``--protocol early``; ``EARLY``. Written and committed in its own
commit on 2026-11-27, after pre-registration 2's result and before any run of this comparison; the same rules of
change as pre-registration 2.)

- Question: at a budget of 1,000 generated training tokens, does AT-GRPO reach a higher held-out success on vault
  than trajectory GRPO? In pre-registration 2, AT-GRPO led trajectory GRPO at its first evaluation point (the first
  step reaching 1,000 tokens; 0.65 against 0.48 on 32 problems, paired +0.17, 95% interval [+0.04, +0.30], 11 seeds
  above, 2 below), but that point was one of six looks that were not pre-registered as metrics. This tests it on
  fresh seeds.
- Task, model, learner, sampling and the two methods: exactly as in pre-registration 2 (``at_grpo`` and
  ``trajectory``; single-agent GRPO is left out: pre-registration 2 separated it).
- Budget: 1,000 generated training tokens per run (steps of 4 problems; the step that crosses it is completed), so
  each run stops where pre-registration 2's first point was taken.
- Held-out evaluation (greedy, independent episodes, up to 2 turns, the test seed space): before training on the
  first 32 test problems (a check of the set-up, not a metric), after the last step on 64.
- Seeds: 16 to 31, 16 per method, disjoint from pre-registration 2's seeds 0-15 (which produced the lead), paired as
  before (seed s of both methods shares data order and initialisation).
- Metric: the held-out success after the last step (64 problems). It is both the primary metric and, with one
  point after the start, the mean over the points after the start that the report calls ``auc``.
- Test and decision rule: as pre-registration 2 (the 95% paired percentile bootstrap interval of the mean per-seed
  difference AT-GRPO minus trajectory, 100,000 resamples drawn by ``random.Random(0)``; AT-GRPO better when its low
  end is above 0, trajectory better when its high end is below 0, otherwise not separated; no decision before 16
  paired seeds). One comparison, so no correction. Reported whichever way it falls, with the per-seed values.
- Cost, from pre-registration 2's runs on a quiet machine: outside evaluation an AT-GRPO run trained for a median
  128 s per 3,000 tokens and a trajectory run 222 s; held-out episodes cost about 0.75 s each. So about 1.5 min of
  training (AT-GRPO 0.7, trajectory 1.2) and 1.2 min of evaluation (96 episodes) per run: 32 runs in about 90 min.
  It resumes at run granularity.

PRE-REGISTRATION 1, as committed in d427c09 and run at 1b3e100 (``--protocol first``); its text is unchanged:

PRE-REGISTRATION (written and committed before the first full run; not to be changed after seeing results; if
it must change, the first result is kept and both are reported):

- Task: the ``vault`` env (pettingllms/envs/vault/env.py), up to 2 turns. Two agents: the reader holds a card with
  its half of a code among two distractor numbers and must tell it to the opener, who must type its own half first,
  then the reader's, as ``CODE: <digits>``. Neither can open the vault alone. A failed attempt is shown to both in
  the next turn. Team reward 1 when the vault opens; the reader's local reward 1 when it relays the right number.
  Training draws fresh problems every step (train seed space); evaluation uses 64 problems of the disjoint test
  seed space, never trained on.
- Model and learner: the packaged SmolLM2-135M-Instruct, float32 on the 2-core CPU; LoRA rank 32 (alpha 64) on every
  linear layer of attention and MLP; AdamW lr 3e-4, 1 warmup step, then constant (min_lr_ratio 1.0), so every method
  sees the same learning rate whatever its step count; PPO clip 0.2, one optimiser step per training step, no KL.
  Sampling in training: temperature 0.5, no top-k/top-p, at most 12 tokens per response; alpha = 1.
- Methods (the only differences between them):
  1. ``at_grpo``: tree rollouts, K=4 candidates at every (turn, agent) node, groups per (problem, turn, agent),
     per-role policies (L2: one LoRA adapter per agent on the shared base);
  2. ``trajectory``: K=4 independent episodes per problem, one group per (problem, agent) over the episodes, every
     sample scored with its episode's return (``rollout.mode=trajectory``), per-role policies (L2), as the peers'
     multi-turn GRPO;
  3. ``single_agent``: the same task done by one agent (``env.options.players=1``: the solo player holds the card
     and the opener's half and types the code), K=4 episodes per problem, trajectory-level groups (standard GRPO
     over K rollouts), one LoRA adapter (L0).
- Budget: 3,000 generated training tokens per run (the sum of every sampled response's length; validation excluded).
  Each run trains steps of 4 problems until the cumulative count reaches the budget; the step that crosses it is
  completed (reported: tokens actually used). Held-out evaluation (64 test problems, greedy, independent episodes,
  up to 2 turns) before training and after each 600 tokens (at the first step that reaches 600, 1200, ...), and at
  the end.
- Seeds: 0, 1 and 2 for every method (``training.seed``: data order, LoRA initialisation, sampling).
- Metric: held-out team success rate (the vault opened), greedy. Primary: the mean over the evaluation points after
  the start (the area under the held-out curve per token; rewards learning fast within the budget). Secondary: the
  final held-out success. Reported per method: mean and standard deviation over the 3 seeds, and the per-seed values.
- Comparison reported: AT-GRPO minus trajectory GRPO, and AT-GRPO minus single-agent GRPO, on both metrics. A method
  "wins" when its seed mean exceeds the other's by more than the larger of the two across-seed standard deviations;
  otherwise the comparison is reported as not separated at this scale. Reported whichever way it falls.
- Sizing pilot (before this pre-registration): one quickstart run (L1, tree, batch 8) went from 0.25 to 0.97 held-out
  success in 20 steps (~11,000 generated tokens), with training success at 1.0 after ~2,300 tokens; the budget above
  is set small enough that the methods are still learning within it.

PRE-REGISTRATION 5: A GAME WHOSE REWARD COMES ONLY AT THE END, TIC-TAC-TOE (``--protocol paired_outcome --env
cpu_tictactoe``; ``OUTCOME_PAIRED``. Written and committed in its own commit on 2026-11-27, after ``cpu_tictactoe`` was
shown to learn (docs/self_play.md) and before any run of this comparison; the same rules of change as
pre-registration 2.)

- Question: on a game whose only reward is its outcome, at equal generated training tokens, does AT-GRPO with outcome
  credit (tree groups per (problem, turn, agent), each candidate valued by one playout to the end with the current
  policy) reach a higher held-out win rate than trajectory GRPO (K independent games per problem, every move scored
  with its game's outcome)?
- Task and model: ``+experiment=cpu_tictactoe`` as shipped: OpenSpiel tic-tac-toe against the uniform random
  opponent, the trained ``player`` holding seat (problem seed mod 2), so each group holds games of one seat (the
  per-seat baseline); the packaged SmolLM2-135M in float32, one LoRA adapter (rank 32), L0, lr 3e-4 (one warmup
  step, then constant, as ``RUN``), temperature 0.7 in training, greedy held-out evaluation, one worked example.
- Methods: ``at_grpo`` (``rollout.mode=tree``, K=4 at each of the player's turns, ``rollout.playouts=1``) and
  ``trajectory`` (``rollout.mode=trajectory``, K=4 games per problem, one group per (problem, agent)). One agent, so
  no single-agent baseline. Playout moves are generated but not trained on, so they are not counted in the budget;
  each run's wall time is reported, so that cost is visible.
- Budget: 3,000 generated training tokens per run (steps of 4 problems; the step that crosses it is completed). The
  preset's run generated about 480 training tokens per step, so about 6-7 steps: the phase in which its held-out win
  rate rose and invalid answers fell from 47% to 3% (steps 1-5).
- Held-out evaluation (greedy, the test seed space, seats alternating): before training on the first 32 test games,
  and after the last step on the first 64. No intermediate point.
- Seeds: 0 to 7, 8 per method, paired as in pre-registration 2 (seed s of both methods shares data order and
  initialisation).
- Metric, test and decision rule: primary, the final held-out win rate on 64 games (``val/procedural/success_rate``,
  a win of ``player``); the 95% paired percentile bootstrap interval of the mean per-seed difference AT-GRPO minus
  trajectory; better when the interval lies above or below 0, otherwise not separated; with fewer than 8 paired
  seeds, no decision. One comparison, so no correction. Reported whichever way it falls, with the per-seed values,
  draws and forfeits where the records hold them, and each method's wall time.
- Cost, estimated from the preset's run: about 10 min of training and 3 min of evaluation per AT-GRPO run, about
  6 min and 3 min per trajectory run; 16 runs in about 3 h. It resumes at run granularity, so it may span sessions.

Result of pre-registration 1 (docs/results.md, "paper claim at CPU scale"; ``benchmarks/results/learning_claims.json``):
AT-GRPO 0.58 +- 0.31 on the primary metric, trajectory GRPO 0.33 +- 0.24, single agent 0.23 +- 0.16; AT-GRPO beat
single-agent GRPO by its rule and was not separated from trajectory GRPO: the spread across 3 seeds was as large as
the difference. Pre-registration 2 is the comparison made to separate them.

Result of pre-registration 2 (docs/results.md; ``benchmarks/results/learning_claims_paired_vault.json``, every run in
``learning_claims_paired_vault_runs.jsonl``; per-seed curves in docs/environments/vault.md): 16 paired seeds per
method, 48 runs in 248 min. Primary metric AT-GRPO 0.69 +- 0.21, trajectory GRPO 0.65 +- 0.23, single agent
0.26 +- 0.24. AT-GRPO minus trajectory: +0.050, 95% interval [-0.108, +0.210], 8 seeds above and 8 below: not
separated (final success: -0.077 [-0.281, +0.132], not separated). AT-GRPO minus single agent: +0.436
[+0.260, +0.599], 13 above and 3 below: AT-GRPO better (final success: +0.366 [+0.147, +0.582], AT-GRPO better).
Not pre-registered, so a lead for a later pre-registration only: at the first evaluation point (about 1,150 tokens)
AT-GRPO led trajectory GRPO by +0.17 [+0.04, +0.30], one of six such looks.

Result of pre-registration 4 (docs/results.md; ``benchmarks/results/learning_claims_early_vault.json``, every run in
``learning_claims_early_vault_runs.jsonl``; per-seed values in docs/environments/vault.md): 32 runs in 74 min. Final
held-out success at 1,000 tokens: AT-GRPO 0.63 +- 0.24, trajectory GRPO 0.53 +- 0.21; AT-GRPO minus trajectory
+0.091, 95% interval [-0.029, +0.201], 11 seeds above and 5 below: not separated. The early lead of
pre-registration 2 is not confirmed.

Result of pre-registration 3 (docs/results.md; ``benchmarks/results/learning_claims_paired_game_cpu_plan_path.json``): on
``cpu_plan_path`` AT-GRPO 0.44 +- 0.26 on the primary metric, trajectory GRPO 0.36 +- 0.22; the mean paired
difference +0.081, 95% interval [-0.081, +0.255] over 8 paired seeds (4 above, 4 below): not separated.

Result of pre-registration 5 (docs/results.md; ``benchmarks/results/learning_claims_paired_outcome_cpu_tictactoe.json``,
every run in ``learning_claims_paired_outcome_cpu_tictactoe_runs.jsonl``): 16 runs from 6b5cbe3, 2026-11-27/28. Final
held-out win rate on 64 games: AT-GRPO 0.44 +- 0.20, trajectory GRPO 0.50 +- 0.03; AT-GRPO minus trajectory -0.066, 95%
interval [-0.201, +0.033] over 8 paired seeds (2 above, 2 equal, 4 below): not separated. AT-GRPO's spread is its
forfeits: 151 of its 512 held-out games against trajectory's 16 (seed 3 collapsed onto one square, 64 forfeits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import machine_info  # noqa: E402
from _paired import decide, paired_bootstrap  # noqa: E402
from _report import load_average, out_dir  # noqa: E402

NAME = "learning_claims"
EXPERIMENTS = Path(__file__).resolve().parents[1] / "pettingllms" / "configs" / "experiment"
# how every run trains, whatever the task: steps of 4 problems, K=4, the same learning rate at every step whatever a
# method's step count (one warmup step, then constant), no validation or files of the trainer's own
RUN = [
    "rollout.branching=4", "rollout.select=greedy", "reward.alpha=1.0",
    "optim.warmup_steps=1", "optim.min_lr_ratio=1.0",
    "training.total_training_steps=400", "training.train_batch_size=4",
    "training.val_freq=0", "training.val_before_train=false",
    "training.export_hf=false", "training.plot=false", "training.resume=none", "training.logger=[]",
    "resources.use_ray=false",
]
TRAIN_SAMPLING = "{temperature: 0.5, top_p: 1.0, top_k: 0, max_tokens: 12}"
VAL_SAMPLING = "{temperature: 0.0, top_p: 1.0, top_k: 0, max_tokens: 12}"


@dataclass(frozen=True)
class Task:
    """What the methods are compared on: the config overrides every method shares, and what turns the team task
    into one agent's (the single-agent baseline)."""

    overrides: tuple[str, ...]
    team: tuple[str, ...]  # what the team's agents need beyond ``overrides`` (their sampling)
    single_agent: tuple[str, ...]
    team_level: tuple[str, ...] = ("specialization=L2",)  # one LoRA adapter per agent; () keeps a preset's own

    def methods(self) -> dict[str, list[str]]:
        """Each method's overrides: the only differences between the methods."""
        return {"at_grpo": [*self.team_level, "rollout.mode=tree", *self.team],
                "trajectory": [*self.team_level, "rollout.mode=trajectory", *self.team],
                "single_agent": ["specialization=L0", *self.single_agent, "rollout.mode=trajectory"]}


def _sampling(agents: Sequence[str]) -> tuple[str, ...]:
    return tuple(f"+agents.{a}.{k}={v}" for a in agents
                 for k, v in (("train_sampling", TRAIN_SAMPLING), ("val_sampling", VAL_SAMPLING)))


VAULT = Task(
    overrides=("base_models.policy_0.path=smollm2-135m-instruct", "base_models.policy_0.dtype=float32",
               "base_models.policy_0.lora.rank=32", "base_models.policy_0.lora.alpha=64",
               "base_models.policy_0.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
               "env.name=vault", "env.max_turns=2", "optim.lr=3e-4",
               "training.max_prompt_length=320", "training.max_response_length=12"),
    team=_sampling(("reader", "opener")),
    single_agent=("+env.options.players=1", *_sampling(("solo",))),
)


def task(env: str) -> Task:
    """``vault``, or a ``cpu_<env>`` experiment preset of a built-in game (Plan-Path, Sudoku, Sokoban: a tool agent
    and a plan agent; the plan agent plays alone in the single-agent baseline), which brings its own model, LoRA,
    sampling and lengths."""
    if env == "vault":
        return VAULT
    if env.startswith("cpu_") and (EXPERIMENTS / f"{env}.yaml").is_file():
        # the preset's own level: its agents are its team (cpu_plan_path: the plan agent alone, L0)
        return Task(overrides=(f"+experiment={env}",), team=(), single_agent=("env.agents=[plan_agent]",),
                    team_level=())
    presets = sorted(p.stem for p in EXPERIMENTS.glob("cpu_*.yaml"))
    raise SystemExit(f"error: --env {env}: not vault or a cpu_<env> preset of pettingllms/configs/experiment "
                     f"(presets there: {', '.join(presets) or 'none yet'})")


@dataclass(frozen=True)
class Protocol:
    """How a comparison is run and decided: each run's token budget, where the held-out set is evaluated and on how
    many of its problems, the seeds, the decision rule, and overrides of its own."""

    budget: int  # generated training tokens per run; the step that crosses it is completed
    eval_at: tuple[int, ...]  # held-out evaluation at the first step whose cumulative tokens reach each of these
    start_problems: int  # held-out problems evaluated before training (the first n of the test set) ...
    mid_problems: int  # ... at each point of eval_at ...
    end_problems: int  # ... and after the last step (the largest of the three is the test set)
    seeds: tuple[int, ...]  # seed s of every method shares data order and initialisation (training.seed)
    rule: str  # "paired_bootstrap" (95% interval of the mean paired difference) or "sd_margin"
    overrides: tuple[str, ...] = ()


# pre-registration 2 (the docstring): 16 paired seeds, fewer and smaller intermediate evaluations, 64 at the end
PAIRED = Protocol(budget=3000, eval_at=(1000, 2000), start_problems=32, mid_problems=32, end_problems=64,
                  seeds=tuple(range(16)), rule="paired_bootstrap",
                  overrides=("optim.micro_batch_max_tokens=1024",))
# pre-registration 1, as it ran (commit d427c09, results in benchmarks/results/learning_claims.json)
FIRST = Protocol(budget=3000, eval_at=(600, 1200, 1800, 2400), start_problems=64, mid_problems=64, end_problems=64,
                 seeds=(0, 1, 2), rule="sd_margin")
# --quick: the pipeline end to end at a tiny budget (its figures mean nothing)
# (the tiny random model and 2 problems per step: the bench lane runs it in CI, where the real model took minutes)
QUICK = Protocol(budget=40, eval_at=(20,), start_problems=4, mid_problems=4, end_problems=8, seeds=(0,),
                 rule="paired_bootstrap", overrides=("optim.micro_batch_max_tokens=1024",
                                                     "base_models.policy_0.path=tiny-random-smollm2",
                                                     "training.train_batch_size=2"))
# pre-registration 3 (the docstring): Plan-Path, tree vs trajectory grouping (one agent: no single-agent baseline)
GAME_PAIRED = Protocol(budget=1500, eval_at=(500, 1000), start_problems=32, mid_problems=32, end_problems=64,
                       seeds=tuple(range(8)), rule="paired_bootstrap")
# pre-registration 4 (the docstring): the early lead on vault, AT-GRPO vs trajectory at 1,000 tokens, fresh seeds
EARLY = Protocol(budget=1000, eval_at=(), start_problems=32, mid_problems=32, end_problems=64,
                 seeds=tuple(range(16, 32)), rule="paired_bootstrap", overrides=("optim.micro_batch_max_tokens=1024",))
# pre-registration 5 (the docstring): tic-tac-toe, outcome credit in tree mode vs trajectory GRPO, final win rate
OUTCOME_PAIRED = Protocol(budget=3000, eval_at=(), start_problems=32, mid_problems=32, end_problems=64,
                          seeds=tuple(range(8)), rule="paired_bootstrap")
PROTOCOLS = {"paired": PAIRED, "first": FIRST, "paired_game": GAME_PAIRED, "early": EARLY,
             "paired_outcome": OUTCOME_PAIRED}
# the methods a protocol compares, where not all three (kept out of Protocol: a finished run's record holds its
# protocol's fields, and a new field would keep every earlier record from being resumed)
PROTOCOL_METHODS = {"paired_game": ("at_grpo", "trajectory"), "early": ("at_grpo", "trajectory"),
                    "paired_outcome": ("at_grpo", "trajectory")}
# the comparisons that are pre-registered (protocol, env); any other full run is refused
REGISTERED = {("paired", "vault"), ("first", "vault"), ("paired_game", "cpu_plan_path"), ("early", "vault"),
              ("paired_outcome", "cpu_tictactoe")}


def run(method: str, seed: int, protocol: Protocol, env: str, log_dir: Path) -> dict:
    """One training run to the token budget, evaluating on the held-out problems along the way."""
    from pettingllms.entry.train import load_config
    from pettingllms.trainer.trainer import Trainer

    overrides = _overrides(method, seed, protocol, env, log_dir)
    trainer = Trainer(load_config("train", overrides))
    started = time.perf_counter()
    evaluating = [0.0]  # seconds spent in held-out evaluation

    def held_out(step: int, problems: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        value = _held_out(trainer, step, problems)
        evaluating[0] += time.perf_counter() - t0
        return problems, value

    try:
        points = [(0, *held_out(0, protocol.start_problems))]
        tokens, step = 0, 0
        pending = list(protocol.eval_at)
        while tokens < protocol.budget:
            step += 1
            result = trainer.step(step)
            tokens += int(result.metrics["rollout/generated_tokens"])
            reached = [p for p in pending if p <= tokens]
            pending = [p for p in pending if p > tokens]
            if tokens >= protocol.budget:
                points.append((tokens, *held_out(step, protocol.end_problems)))
            elif reached:
                points.append((tokens, *held_out(step, protocol.mid_problems)))
    finally:
        trainer.close()
    after = [value for _, _, value in points[1:]]
    return {"method": method, "seed": seed, "env": env, "config_fingerprint": fingerprint(overrides),
            "steps": step, "tokens": tokens,
            "curve": [(t, v) for t, _, v in points], "problems": [n for _, n, _ in points],
            "auc": statistics.fmean(after), "final": points[-1][2], "seconds": time.perf_counter() - started,
            "eval_seconds": evaluating[0], "overrides": overrides}


def _overrides(method: str, seed: int, protocol: Protocol, env: str, log_dir: Path) -> list[str]:
    setup = task(env)
    held_out = max(protocol.start_problems, protocol.mid_problems, protocol.end_problems)
    return [*setup.overrides, *RUN, f"env.max_val_problems={held_out}", *protocol.overrides,
            *setup.methods()[method], f"training.seed={seed}", f"training.log_dir={log_dir}",
            f"training.experiment_name={env}_{method}_seed{seed}"]


def _held_out(trainer, step: int, problems: int) -> float:
    """Team success on the first ``problems`` held-out problems (greedy): the same problems, with the same
    episode seeds, as the first ``problems`` of the full test set, so a smaller evaluation is a subset of the
    larger one."""
    everything = trainer.benchmarks
    trainer.benchmarks = {name: ps[:problems] for name, ps in everything.items()}
    try:
        return float(trainer.validate(step)["val/procedural/success_rate"])
    finally:
        trainer.benchmarks = everything


def append_run(record: Path, result: dict, protocol: Protocol) -> None:
    """Keep a finished run at once, with the protocol it ran under (so only a run of the same settings is reused)."""
    record.parent.mkdir(parents=True, exist_ok=True)
    with record.open("a") as fh:
        fh.write(json.dumps({**result, "protocol": asdict(protocol)}) + "\n")


def finished_runs(record: Path, protocol: Protocol, env: str) -> dict[tuple[str, int], dict]:
    """The runs of ``record`` (``<log_dir>/runs.jsonl``, or ``--record``) made under this protocol, on this env,
    with this version's overrides (wherever their files went) resolving to the same config, by (method, seed)."""
    if not record.is_file():
        return {}
    settings = json.loads(json.dumps(asdict(protocol)))  # as read back: tuples become lists
    done = {}
    for line in record.read_text().splitlines():
        r = json.loads(line)
        if r.pop("protocol", None) != settings or r.get("env") != env or r["method"] not in task(env).methods():
            continue
        now = _overrides(r["method"], r["seed"], protocol, env, Path("."))
        if _settings(r["overrides"]) != _settings(now):
            continue
        # runs recorded before fingerprints (the first of pre-registration 2, 2026-11-26) match by overrides alone
        if "config_fingerprint" in r and r["config_fingerprint"] != fingerprint(now):
            continue
        done[(r["method"], r["seed"])] = r
    return done


def _settings(overrides: Sequence[str]) -> list[str]:
    """A run's overrides less where its files went: a run is the same run whatever its log directory."""
    return [o for o in overrides if not o.startswith("training.log_dir=")]


# Keys added to the schema after runs were recorded, each with the value under which it changes nothing for the
# envs of this benchmark: left out of the fingerprint at that value (so those runs still match), kept at any other.
# rollout.playouts acts only for envs with an outcome (games); vault and Plan-Path have none (2026-11-27).
# optim.logprob_chunk_tokens=0 is the dense LM head every recorded run used (2026-11-27).
# optim.attention=auto is SDPA on CPU, where every recorded run trained (2026-11-27).
# self_play.* (the opponent pool, off at pool_size=0) and training.async_checkpoint=false change nothing a run learns
# (2026-11-27); a section left empty goes too, and so does an agent's server block with no url (agents.<role>.server).
# optim.compile=false: the eager decoder layers every recorded run trained with (2026-12-01).
NEUTRAL_NEW_KEYS = {("rollout", "playouts"): 1, ("optim", "logprob_chunk_tokens"): 0, ("optim", "attention"): "auto",
                    ("self_play", "pool_size"): 0, ("self_play", "snapshot_every"): 10, ("self_play", "live_prob"): 0.5,
                    ("training", "async_checkpoint"): False, ("rollout", "streaming"): False,
                    ("rollout", "streaming_wait_s"): 0.05, ("optim", "compile"): False}


def fingerprint(overrides: Sequence[str]) -> str:
    """A hash of the whole config the overrides resolve to, less where the run's files go: a preset or a default
    changed since a run was recorded changes it, while the override strings stay the same."""
    import hashlib

    from pettingllms.config.load import to_dict
    from pettingllms.entry.train import load_config

    config = to_dict(load_config("train", list(overrides)))
    for key in ("log_dir", "experiment_name"):
        config["training"].pop(key, None)
    for (section, key), neutral in NEUTRAL_NEW_KEYS.items():
        if config.get(section, {}).get(key) == neutral:
            config[section].pop(key)
    for section in {section for section, _ in NEUTRAL_NEW_KEYS}:
        if config.get(section) == {}:
            config.pop(section)
    for agent in config.get("agents", {}).values():
        if isinstance(agent, dict) and (agent.get("server") or {}).get("url") is None:
            agent.pop("server", None)
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def summarize(runs: Sequence[dict], protocol: Protocol) -> dict:
    """Per method: each metric's mean, standard deviation and per-seed values; then AT-GRPO against each baseline
    by the protocol's rule."""
    out: dict = {}
    for method in ("at_grpo", "trajectory", "single_agent"):
        mine = sorted((r for r in runs if r["method"] == method), key=lambda r: r["seed"])
        if not mine:
            continue
        out[method] = {metric: {"mean": statistics.fmean(r[metric] for r in mine),
                                "std": statistics.stdev([r[metric] for r in mine]) if len(mine) > 1 else 0.0,
                                "seeds": [r["seed"] for r in mine], "per_seed": [r[metric] for r in mine]}
                       for metric in ("auc", "final")}
    comparisons = {}
    for other in ("trajectory", "single_agent"):
        if "at_grpo" not in out or other not in out:
            continue
        for metric in ("auc", "final"):
            a, b = out["at_grpo"][metric], out[other][metric]
            key = f"at_grpo - {other} ({metric})"
            if protocol.rule == "sd_margin":
                margin = max(a["std"], b["std"])
                diff = a["mean"] - b["mean"]
                verdict = "at_grpo wins" if diff > margin else (f"{other} wins" if -diff > margin else "not separated")
                comparisons[key] = {"difference": diff, "margin": margin, "verdict": verdict}
            else:
                paired = paired_bootstrap(dict(zip(a["seeds"], a["per_seed"])), dict(zip(b["seeds"], b["per_seed"])))
                comparisons[key] = {**paired, "difference": paired["mean"],
                                    "verdict": decide(paired, len(protocol.seeds), "at_grpo", other)}
    return {"methods": out, "comparisons": comparisons}


COLORS = {"at_grpo": "tab:blue", "trajectory": "tab:orange", "single_agent": "tab:green"}
METHOD_NAMES = {"at_grpo": "AT-GRPO", "trajectory": "trajectory GRPO", "single_agent": "single agent"}


def plot(runs: Sequence[dict], comparisons: dict, path: Path, title: str) -> None:
    """One panel per method (a thin line per seed, the mean thick), and the paired differences: each seed's
    difference as a dot, the mean with its interval as a bar, per baseline and metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in COLORS if any(r["method"] == m for r in runs)]
    fig, axes = plt.subplots(1, len(methods) + 1, figsize=(4.2 * (len(methods) + 1), 4.0))
    for ax, method in zip(axes, methods):
        mine = [r for r in runs if r["method"] == method]
        for r in mine:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, color=COLORS[method], alpha=0.35, linewidth=0.9)
        points = min(len(r["curve"]) for r in mine)  # the mean over seeds at each evaluation they all have
        mean_x = [statistics.fmean(r["curve"][i][0] for r in mine) for i in range(points)]
        mean_y = [statistics.fmean(r["curve"][i][1] for r in mine) for i in range(points)]
        ax.plot(mean_x, mean_y, color=COLORS[method], linewidth=2.8, marker="o", label=f"mean of {len(mine)} seeds")
        ax.set_title(method)
        ax.set_xlabel("generated training tokens")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel("held-out success (greedy)")
    ax = axes[-1]
    labels = []
    for i, (key, c) in enumerate(comparisons.items()):
        labels.append(key.replace("at_grpo - ", "- ").replace(" (", "\n("))
        if "per_seed" in c:
            ax.scatter([i] * len(c["per_seed"]), list(c["per_seed"].values()), color="gray", s=12, zorder=2)
            ax.errorbar([i], [c["mean"]], yerr=[[c["mean"] - c["low"]], [c["high"] - c["mean"]]], fmt="o",
                        color="black", capsize=5, zorder=3)
        else:
            ax.errorbar([i], [c["difference"]], yerr=[[c["margin"]], [c["margin"]]], fmt="o", color="black",
                        capsize=5)
    ax.axhline(0.0, color="tab:red", linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_title("AT-GRPO minus baseline, per seed and mean\n(bar: 95% paired bootstrap interval)", fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed, a tiny budget: checks the pipeline only")
    parser.add_argument("--protocol", choices=list(PROTOCOLS), default="paired",
                        help="paired: pre-registration 2 (default); first: pre-registration 1, as it ran; "
                             "paired_game: pre-registration 3 (--env cpu_plan_path); early: pre-registration 4; "
                             "paired_outcome: pre-registration 5 (--env cpu_tictactoe)")
    parser.add_argument("--env", default="vault", help="vault, or a cpu_<env> preset of pettingllms/configs/experiment")
    parser.add_argument("--methods", nargs="+", choices=list(VAULT.methods()),
                        help="default: the protocol's (all three, or PROTOCOL_METHODS)")
    parser.add_argument("--out-dir")
    parser.add_argument("--log-dir", default="logs/learning_claims")
    parser.add_argument("--record", help="the finished runs' file (default <log-dir>/runs.jsonl); a committed one "
                                         "(benchmarks/results/learning_claims_paired_vault_runs.jsonl) carries a "
                                         "comparison run in pieces across machines")
    parser.add_argument("--seeds", nargs="+", type=int, help="default: the protocol's (0 with --quick)")
    args = parser.parse_args(argv)
    task(args.env)  # an unknown env stops here
    protocol = QUICK if args.quick else PROTOCOLS[args.protocol]
    if not args.quick and (args.protocol, args.env) not in REGISTERED:
        raise SystemExit(f"error: --env {args.env} has no pre-registered comparison under --protocol "
                         f"{args.protocol}; write its budget and evaluation points into the docstring and REGISTERED "
                         "(committed before its first run), or check the pipeline with --quick")
    registered_methods = list(PROTOCOL_METHODS.get(args.protocol, VAULT.methods()))
    args.methods = args.methods or registered_methods
    if not args.quick and not set(args.methods) <= set(registered_methods):
        raise SystemExit(f"error: --protocol {args.protocol} compares {', '.join(registered_methods)} only")
    seeds = args.seeds or list(protocol.seeds)
    name = NAME if args.protocol == "first" and not args.quick else f"{NAME}_{args.protocol}_{args.env}"
    load_before = load_average()
    started = time.perf_counter()
    record = Path(args.record) if args.record else Path(args.log_dir) / "runs.jsonl"
    done = finished_runs(record, protocol, args.env)
    runs = []
    for seed in seeds:
        for method in args.methods:
            if (method, seed) in done:
                result = done[(method, seed)]
                print(f"{method} seed {seed}: kept from {record}", flush=True)
            else:
                result = run(method, seed, protocol, args.env, Path(args.log_dir))
                append_run(record, result, protocol)
            runs.append(result)
            print(f"{method} seed {seed}: {result['steps']} steps, {result['tokens']} tokens, "
                  f"{result['seconds']:.0f} s ({result['eval_seconds']:.0f} s evaluating), held-out "
                  f"{' -> '.join(f'{v:.2f}' for _, v in result['curve'])}", flush=True)
    summary = summarize(runs, protocol)
    report = {
        "benchmark": NAME,
        "command": " ".join(["python", "benchmarks/learning_claims.py", *argv]),
        "quick": args.quick,
        "machine": {**machine_info(), "load_before": load_before, "load_after": load_average()},
        "config": {"protocol": args.protocol, "env": args.env, "budget_tokens": protocol.budget,
                   "eval_at_tokens": list(protocol.eval_at),
                   "held_out_problems": {"start": protocol.start_problems, "mid": protocol.mid_problems,
                                         "end": protocol.end_problems},
                   "rule": protocol.rule, "seeds": seeds, "protocol_overrides": list(protocol.overrides),
                   "methods": {m: task(args.env).methods()[m] for m in args.methods},
                   "common": [*task(args.env).overrides, *RUN]},
        "wall_seconds": time.perf_counter() - started,
        "runs": runs,
        **summary,
    }
    directory = out_dir(args.out_dir, args.quick)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(report, indent=1))
    plot(runs, summary["comparisons"], directory / f"{name}.png",
         f"{args.env}, {args.protocol} protocol{' (--quick)' if args.quick else ''}: "
         + " vs ".join(METHOD_NAMES[m] for m in args.methods))
    for key, value in report["comparisons"].items():
        if "low" in value:
            print(f"{key}: {value['mean']:+.3f}, 95% interval [{value['low']:+.3f}, {value['high']:+.3f}] over "
                  f"{value['pairs']} paired seeds ({value['above']} above, {value['below']} below): {value['verdict']}")
        else:
            print(f"{key}: {value['difference']:+.3f} (margin {value['margin']:.3f}): {value['verdict']}")
    print(f"wrote {directory / (name + '.json')} and {name}.png")
    return report


if __name__ == "__main__":
    main()
