"""A policy's worker-group layout: how many ranks, GPUs, engines and of which kind. Pure arithmetic, no Ray.

The layout users expect on GPU nodes (the "hybrid engine" of verl and OpenRLHF):

- a policy with G GPUs (``GPU_num``, i.e. ``resources.gpus_per_policy`` or ``base_models.<p>.num_gpus``) runs G
  FSDP2 ranks, one GPU each (nccl);
- and G/T vLLM engines of tensor-parallel size T (``tensor_parallel``, default 1), colocated with the ranks:
  engine e is hosted by rank e*T and runs on the GPUs of ranks e*T .. e*T+T-1 (its *TP group*). Every GPU
  generates, and every GPU trains;
- a policy may take a share of one GPU (``num_gpus`` < 1: one rank, one engine, T=1), so small L3 runs fit on
  one GPU;
- on CPU the same shape holds with gloo ranks: ``num_ranks`` ranks (default 1), one engine per rank (T=1).

One Ray placement-group bundle holds one TP group (T ranks' GPUs and CPUs), so an engine's GPUs are always on one
node. ``check_layout`` in ``runtime/placement.py`` checks a run's layouts against the cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pettingllms.core.choices import EngineKind
from pettingllms.core.errors import ConfigError

ENGINES = EngineKind.values()


@dataclass(frozen=True)
class WorkerLayout:
    """One policy's worker group, resolved.

    num_ranks: learner ranks (Ray actors), data-parallel.
    gpus_per_rank: 0 on CPU, 1 on GPU, or a share (< 1) of one GPU for a one-rank policy.
    cpus_per_rank: Ray CPUs reserved per rank.
    tensor_parallel: GPUs per engine (T); every engine is hosted by the first rank of its TP group.
    engine: "hf" (transformers, CPU) or "vllm".
    sharded: the learner is an FSDP2 group (always when num_ranks > 1, or with fsdp.enabled).
    """

    policy: str
    num_ranks: int = 1
    gpus_per_rank: float = 0.0
    cpus_per_rank: float = 1.0
    tensor_parallel: int = 1
    engine: str = "hf"
    sharded: bool = False

    def __post_init__(self) -> None:
        where = f"base_models.{self.policy}"
        if self.num_ranks < 1:
            raise ConfigError(f"{where}.num_ranks must be >= 1, got {self.num_ranks}")
        if self.gpus_per_rank < 0 or (self.gpus_per_rank > 1 and self.gpus_per_rank != int(self.gpus_per_rank)):
            raise ConfigError(f"{where}: {self.gpus_per_rank} GPUs per rank; a rank has one GPU, or a share of one")
        if self.cpus_per_rank <= 0:
            raise ConfigError(f"{where}.cpus_per_rank must be > 0, got {self.cpus_per_rank}")
        if self.tensor_parallel < 1 or self.num_ranks % self.tensor_parallel:
            raise ConfigError(
                f"{where}.tensor_parallel={self.tensor_parallel} must divide the policy's {self.num_ranks} "
                f"rank(s) (one rank per GPU)"
            )
        if self.engine not in ("hf", "vllm"):
            raise ConfigError(f"{where}.engine must be hf or vllm after resolution, got {self.engine!r}")
        if self.num_ranks > 1 and not self.sharded:
            raise ConfigError(f"{where}: {self.num_ranks} ranks train one FSDP2-sharded learner (sharded=True)")

    @property
    def uses_gpus(self) -> bool:
        return self.gpus_per_rank > 0

    @property
    def gpus(self) -> float:
        return self.num_ranks * self.gpus_per_rank

    @property
    def cpus(self) -> float:
        return self.num_ranks * self.cpus_per_rank

    @property
    def backend(self) -> str:
        """The torch.distributed backend of the policy's process group."""
        return "nccl" if self.uses_gpus else "gloo"

    @property
    def num_engines(self) -> int:
        return self.num_ranks // self.tensor_parallel

    @property
    def engine_ranks(self) -> tuple[int, ...]:
        """The ranks that host an engine: the first rank of every TP group."""
        return tuple(range(0, self.num_ranks, self.tensor_parallel))

    def hosts_engine(self, rank: int) -> bool:
        return rank % self.tensor_parallel == 0

    def tp_group(self, rank: int) -> tuple[int, ...]:
        """The ranks whose GPUs the engine of ``rank``'s TP group runs on (its host first)."""
        first = rank - rank % self.tensor_parallel
        return tuple(range(first, first + self.tensor_parallel))

    def bundle_of(self, rank: int) -> int:
        """The placement-group bundle of ``rank``: one bundle per TP group."""
        return rank // self.tensor_parallel

    def bundles(self) -> list[dict[str, float]]:
        """One Ray resource bundle per TP group (T ranks' GPUs and CPUs, so an engine stays on one node)."""
        bundle = {"CPU": float(self.cpus_per_rank * self.tensor_parallel)}
        if self.uses_gpus:
            bundle["GPU"] = float(self.gpus_per_rank * self.tensor_parallel)
        return [dict(bundle) for _ in range(self.num_engines)]

    def summary(self) -> str:
        """A short description, e.g. ``8 GPUs: 8 FSDP ranks, 4 vLLM engines x TP=2`` (docs/distributed.md's table)."""
        engine = {"vllm": "vLLM", "hf": "transformers"}[self.engine]
        if self.uses_gpus:
            return (f"{_number(self.gpus)} GPU{'s' if self.gpus != 1 else ''}: {self.num_ranks} FSDP "
                    f"rank{'s' if self.num_ranks != 1 else ''}, {self.num_engines} {engine} "
                    f"engine{'s' if self.num_engines != 1 else ''} x TP={self.tensor_parallel}")
        if not self.sharded:
            return f"1 process, {engine} engine"
        return f"{self.num_ranks} gloo ranks, {self.num_engines} {engine} engines"

    def describe(self) -> str:
        """One line, e.g. ``8 GPUs: 8 FSDP ranks (nccl), 4 vllm engines x TP=2``."""
        if self.uses_gpus:
            where = f"{_number(self.gpus)} GPU{'s' if self.gpus != 1 else ''}"
        else:
            where = "CPU"
        learner = f"{self.num_ranks} FSDP rank{'s' if self.num_ranks != 1 else ''} ({self.backend})" if self.sharded \
            else "1 process, no FSDP"
        engines = f"{self.num_engines} {self.engine} engine{'s' if self.num_engines != 1 else ''}"
        return f"{where}: {learner}, {engines} x TP={self.tensor_parallel}, {_number(self.cpus_per_rank)} CPU/rank"


def resolve_layout(
    policy: str,
    *,
    num_gpus: float,
    num_ranks: int = 0,
    tensor_parallel: int = 1,
    engine: str = "auto",
    cpus_per_rank: float = 1.0,
    fsdp_enabled: bool = False,
) -> WorkerLayout:
    """The layout of one policy from its settings; raises ConfigError naming the key and the fix.

    num_gpus: GPUs for this policy (GPU_num): 0 = CPU, a share below 1, or a whole number G (G ranks).
    num_ranks: 0 = automatic (G on GPU, 1 on CPU); on GPU it must equal G (one rank per GPU).
    engine: "auto" picks vLLM when the policy has GPUs and the transformers engine on CPU.
    """
    where = f"base_models.{policy}"
    if engine not in ENGINES:
        raise ConfigError(f"{where}.engine must be one of {ENGINES}, got {engine!r}")
    if num_gpus < 0 or not math.isfinite(num_gpus):
        raise ConfigError(f"{where}.num_gpus (GPU_num) must be >= 0, got {num_gpus}")
    if num_ranks < 0:
        raise ConfigError(f"{where}.num_ranks must be >= 0 (0 = one per GPU, or 1 on CPU), got {num_ranks}")
    if tensor_parallel < 1:
        raise ConfigError(f"{where}.tensor_parallel must be >= 1, got {tensor_parallel}")
    if num_gpus == 0:
        if tensor_parallel > 1:
            raise ConfigError(f"{where}.tensor_parallel={tensor_parallel} needs GPUs; on CPU every engine has TP=1")
        ranks, gpus_per_rank = num_ranks or 1, 0.0
    elif num_gpus < 1:
        if num_ranks > 1 or tensor_parallel > 1:
            raise ConfigError(
                f"{where}: num_gpus={_number(num_gpus)} is a share of one GPU, which fits one rank with "
                f"tensor_parallel=1 (got num_ranks={num_ranks}, tensor_parallel={tensor_parallel}); NCCL ranks and "
                f"TP shards each need a GPU of their own"
            )
        ranks, gpus_per_rank = 1, float(num_gpus)
    else:
        if num_gpus != int(num_gpus):
            raise ConfigError(f"{where}.num_gpus (GPU_num) must be a whole number of GPUs or a share below 1, "
                              f"got {_number(num_gpus)}")
        gpus = int(num_gpus)
        if num_ranks not in (0, gpus):
            raise ConfigError(
                f"{where}: num_ranks={num_ranks} with {gpus} GPUs; a policy runs one FSDP rank per GPU, so leave "
                f"num_ranks unset (0) or set it to {gpus}"
            )
        if gpus % tensor_parallel:
            raise ConfigError(
                f"{where}.tensor_parallel={tensor_parallel} must divide the policy's {gpus} GPUs (GPU_num): each "
                f"vLLM engine takes T GPUs; use a divisor of {gpus}, e.g. {_divisors(gpus)}"
            )
        ranks, gpus_per_rank = gpus, 1.0
    if engine == "auto":
        engine = "vllm" if gpus_per_rank > 0 else "hf"
    elif engine == "hf" and gpus_per_rank > 0:
        raise ConfigError(
            f"{where}.engine=hf: the transformers engine is the CPU engine, and this policy has "
            f"{_number(num_gpus)} GPU(s). On GPUs a policy generates with vLLM: set {where}.engine=vllm (or leave "
            f"the default, auto) and install the gpu extra (pip install -e '.[gpu]'); or run on CPU with GPU_num=0"
        )
    return WorkerLayout(
        policy=policy,
        num_ranks=ranks,
        gpus_per_rank=gpus_per_rank,
        cpus_per_rank=float(cpus_per_rank),
        tensor_parallel=tensor_parallel,
        engine=engine,
        sharded=ranks > 1 or fsdp_enabled,
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
