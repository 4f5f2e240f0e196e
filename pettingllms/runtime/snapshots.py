"""Full-model past versions for the opponent pool (``self_play.*`` on a policy without LoRA: L1/L3 full fine-tunes).

A LoRA policy keeps its past versions as frozen adapters on the same model (``assembly/opponent_pool.py``). A full
model has no such slot, so each trained full-weight policy gets one more worker, ``<policy>-pool``
(``WorkerSpec.snapshot_of``): untrained, with an engine of its own, that plays every past version of that policy.

- ``SnapshotStore``: the slots' weights, in host memory (the engines' dtype), so a snapshot costs no GPU memory and
  the pool engine holds one model whatever the pool's size. They are saved with the run's checkpoint (one
  safetensors file per filled slot), so a resumed run plays against exactly the weights the original did.
- A slot that has not changed since the last checkpoint is not written again: its file there is hard-linked into
  the new checkpoint (the same bytes, no disk, no write time; deleting the old checkpoint leaves the link), and
  written afresh where the filesystem cannot link.
- The pool engine serves one slot at a time (``load_into``: the slot's tensors copied into the module, then the
  usual weight push to the engine), so a step's episodes against the pool all meet the same past version
  (``OpponentPool.step_slot``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Mapping

import torch

from pettingllms.core.atomic import published_path

INDEX_FILE = "slots.json"
SLOT_FILE = "slot{k}.safetensors"


class SnapshotStore:
    """Slot -> the full weights of one past version, as ``name -> tensor`` in host memory."""

    def __init__(self) -> None:
        self.slots: dict[int, dict[str, torch.Tensor]] = {}
        # slot -> (the weights dict last written or read, its file): a slot still holding that very dict (``hold``
        # replaces a slot's dict, never changes one in place) is unchanged, and its file can be linked. Shared with
        # ``frozen`` copies, whose saves run in a thread (one at a time: a save is awaited before the next).
        self._files: dict[int, tuple[dict[str, torch.Tensor], Path]] = {}

    @staticmethod
    def host_copy(weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``(name, tensor)`` pairs (``learner.weights.full_weights``, one full tensor at a time) copied to host
        memory: the live weights go on training, the copy stays as it was at the snapshot."""
        return {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in weights}

    def hold(self, k: int, weights: Mapping[str, torch.Tensor]) -> None:
        if not weights:
            raise ValueError(f"snapshot slot {k}: no weights given")
        self.slots[k] = dict(weights)

    def load_into(self, k: int, model: torch.nn.Module) -> None:
        """Copy slot ``k``'s weights into ``model``'s parameters; every parameter must be in the slot and every
        tensor of the slot must be a parameter of the same shape (a mismatch would play a different model)."""
        if k not in self.slots:
            raise KeyError(f"snapshot slot {k} is empty (filled: {sorted(self.slots)})")
        weights = self.slots[k]
        params = dict(model.named_parameters())
        missing, unknown = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
        if missing or unknown:
            raise ValueError(f"snapshot slot {k} does not match the model: missing {missing[:3]}"
                             f"{'...' if len(missing) > 3 else ''}, unknown {unknown[:3]}"
                             f"{'...' if len(unknown) > 3 else ''}")
        with torch.no_grad():
            for name, param in params.items():
                if tuple(param.shape) != tuple(weights[name].shape):
                    raise ValueError(f"snapshot slot {k}: {name} has shape {tuple(weights[name].shape)}, the model "
                                     f"{tuple(param.shape)}")
                param.copy_(weights[name])

    def frozen(self) -> "SnapshotStore":
        """The slots as they are now, for a write in another thread: a later ``hold`` replaces a slot's dict in this
        store and never changes one in place, so the copy's tensors stay those of this moment."""
        copy = SnapshotStore()
        copy.slots = dict(self.slots)
        copy._files = self._files
        return copy

    def save(self, folder: Path) -> dict[str, list[int]]:
        """One safetensors file per filled slot and an index of them (written last). Returns which slots were
        ``written`` and which ``linked`` from the previous checkpoint's unchanged file."""
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        done: dict[str, list[int]] = {"written": [], "linked": []}
        for k, weights in sorted(self.slots.items()):
            path = folder / SLOT_FILE.format(k=k)
            if not self._link_unchanged(k, weights, path):
                # A file there may be a link to an older checkpoint's: replace it, never write through it.
                path.unlink(missing_ok=True)
                save_file(weights, str(path))
                done["written"].append(k)
            else:
                done["linked"].append(k)
            self._files[k] = (weights, path)
        (folder / INDEX_FILE).write_text(json.dumps({"slots": sorted(self.slots)}))
        return done

    def _link_unchanged(self, k: int, weights: Mapping[str, torch.Tensor], path: Path) -> bool:
        """Hard-link slot ``k``'s last file to ``path`` when the slot still holds the weights that file has."""
        known = self._files.get(k)
        if known is None or known[0] is not weights:
            return False
        # The last save wrote into a checkpoint's temporary folder, renamed into place since.
        source = next((p for p in (known[1], published_path(known[1])) if p.is_file()), None)
        if source is None:
            return False
        if source.resolve() == path.resolve():
            return True  # saved into the same folder again: the file is already there
        try:
            path.unlink(missing_ok=True)
            os.link(source, path)
        except OSError:  # another filesystem, or one without hard links: write the file instead
            return False
        return True

    def load(self, folder: Path) -> None:
        """The slots saved in ``folder`` (none when the checkpoint was written before any snapshot)."""
        from safetensors.torch import load_file

        self.slots = {}
        self._files.clear()
        index = folder / INDEX_FILE
        if not index.is_file():
            return
        for k in json.loads(index.read_text())["slots"]:
            path = folder / SLOT_FILE.format(k=k)
            self.slots[int(k)] = load_file(str(path))
            self._files[int(k)] = (self.slots[int(k)], path)
