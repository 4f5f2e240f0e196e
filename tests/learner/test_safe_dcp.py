"""A DCP learner state cannot run code when it is loaded: a payload in the pickled index or in a non-tensor entry
(the optimiser's hyper-parameters) is refused, naming the file and the function it refers to. Each test first
shows that the same file run through torch's own loading does run the payload, so the test can fail."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from pettingllms.core import UnsafeCheckpointError
from pettingllms.learner import PolicyLearner
from settings_support import learner_config
from pettingllms.learner.safe_dcp import check_dcp, read_metadata


class TouchFile:
    """Unpickling this runs ``touch <path>``, as an attacker's checkpoint would run any command."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.system, (f"touch {self.path}",)


@pytest.fixture
def saved(tmp_path, make_model, make_samples):
    """A learner that took one step (so the state has optimiser entries), saved with DCP; and a fresh learner."""
    learner = PolicyLearner(make_model(0), learner_config(total_steps=2, lr=1e-3))
    learner.update(make_samples(4, seed=1), [1.0, -1.0, 0.5, -0.5])
    folder = tmp_path / "saved"
    meta = learner.save_sharded(folder)
    return folder, meta, lambda: PolicyLearner(make_model(1), learner_config(total_steps=2, lr=1e-3))


def _copy(saved, tmp_path: Path) -> Path:
    folder = tmp_path / "dcp"
    shutil.copytree(saved[0], folder)
    return folder


def _plain_dcp_load(folder: Path, learner: PolicyLearner) -> None:
    """What torch's DCP does with the folder on its own (what the project did before)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"model": get_model_state_dict(learner.model),
             "optimizer": get_optimizer_state_dict(learner.model, learner.optimizer)}
    dcp.load(state, checkpoint_id=str(folder))


def test_a_saved_state_loads_and_its_index_admits_only_dcp_classes(saved):
    folder, meta, _ = saved
    check_dcp(folder)
    assert read_metadata(folder / ".metadata").state_dict_metadata
    learner = saved[2]()
    learner.load_sharded(folder, meta)
    assert learner.step == 1


def test_a_payload_in_the_index_is_refused_and_does_not_run(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    metadata = read_metadata(folder / ".metadata")
    marker = tmp_path / "ran"
    metadata.planner_data["payload"] = TouchFile(marker)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))

    with open(folder / ".metadata", "rb") as stream:
        pickle.load(stream)  # what DCP's own reader does
    assert marker.exists()
    marker.unlink()

    with pytest.raises(UnsafeCheckpointError) as refused:
        saved[2]().load_sharded(folder, saved[1])
    assert str(refused.value) == (f"checkpoint {folder / '.metadata'} refers to posix.system, which a checkpoint "
                                  "never needs: refusing to load it")
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        check_dcp(folder)
    assert not marker.exists()


def test_a_payload_in_a_non_tensor_entry_is_refused_and_does_not_run(saved, tmp_path):
    """DCP loads non-tensor entries (the optimiser's lr, betas, ...) with torch.load(weights_only=False): point the
    index's ``lr`` entry at a pickled payload appended to the shard file."""
    folder = _copy(saved, tmp_path)
    marker = tmp_path / "ran"
    shard = folder / "__0_0.distcp"
    offset = shard.stat().st_size
    with open(shard, "ab") as stream:
        torch.save(TouchFile(marker), stream)
    metadata = read_metadata(folder / ".metadata")
    (index,) = [i for i in metadata.storage_data if i.fqn == "optimizer.param_groups.0.lr"]
    info = metadata.storage_data[index]
    info.relative_path, info.offset, info.length = shard.name, offset, shard.stat().st_size - offset
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))

    _plain_dcp_load(folder, saved[2]())
    assert marker.exists()
    marker.unlink()

    with pytest.raises(UnsafeCheckpointError) as refused:
        saved[2]().load_sharded(folder, saved[1])
    assert str(refused.value) == (f"checkpoint {folder} entry 'optimizer.param_groups.0.lr' refers to posix.system, "
                                  "which a checkpoint never needs: refusing to load it")
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        check_dcp(folder)
    assert not marker.exists()


def test_a_shard_outside_the_checkpoint_folder_is_refused(saved, tmp_path):
    folder = _copy(saved, tmp_path)
    metadata = read_metadata(folder / ".metadata")
    next(iter(metadata.storage_data.values())).relative_path = "../elsewhere.distcp"
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpointError, match=r"refers to the file '\.\./elsewhere\.distcp' outside its folder"):
        saved[2]().load_sharded(folder, saved[1])
