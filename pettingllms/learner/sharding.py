"""FSDP2 sharding of one policy's learner across the ranks of its worker group.

Every rank holds a shard of the weights, gradients and optimiser state (``torch.distributed.fsdp.fully_shard``,
one FSDP unit per decoder layer plus the root), runs the forward and backward passes of its share of each
mini-batch (``learner/data_parallel.py``), and FSDP reduce-scatters the gradients.

Precision follows the policy's dtype: with ``bfloat16`` the sharded parameters stay float32 (the master weights, and
the optimiser state with them) and FSDP's ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``
all-gathers them in bf16 for compute and reduces gradients in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from pettingllms.models.layers import decoder_layers


@dataclass(frozen=True)
class FSDPOptions:
    """How a policy's learner is sharded (precision comes from the policy's dtype, see ``shard_model``).

    cpu_offload: keep the sharded parameters, gradients and optimiser state in host memory and copy each layer to
        the GPU for its compute. GPU only: on a CPU machine everything already is in host memory.
    reshard_after_forward: free each layer's gathered weights after its forward (and gather them again for the
        backward). False trades memory for one all-gather less per layer and step.
    """

    cpu_offload: bool = False
    reshard_after_forward: bool = True


def shard_model(
    model: nn.Module, options: FSDPOptions, device: torch.device, compute_dtype: torch.dtype = torch.float32
) -> nn.Module:
    """Apply ``fully_shard`` to every decoder layer and then to the root, in place; returns ``model``.

    compute_dtype: bfloat16 over a float32 model computes in bf16 over float32 sharded (master) parameters
    (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``); over a bfloat16 model (``master_weights=
    bfloat16``, or a policy that does not train) the parameters already are bf16 and are sharded as they are.
    Call inside an initialised process group, after LoRA adapters are attached and
    before the optimiser is built (it must hold the sharded parameters). Parameter names do not change.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    if options.cpu_offload and device.type == "cpu":
        raise ValueError("fsdp.cpu_offload needs GPUs: on a CPU-only worker the weights already live in host memory")
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    mixed = compute_dtype == torch.bfloat16 and dtypes != {torch.bfloat16}
    if mixed and dtypes != {torch.float32}:
        raise ValueError(
            f"bf16 compute under FSDP needs float32 master weights (MixedPrecisionPolicy) or bfloat16 weights; the "
            f"model is loaded as {sorted(str(d) for d in dtypes)}"
        )
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": options.reshard_after_forward}
    if mixed:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if options.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model
