"""Trackers: summary.log, a real TensorBoard writer read back, a real offline W&B run read back, bad names."""

from __future__ import annotations

import json
import math
import socket
import struct
import threading
import time

import pytest

from pettingllms.core import ConfigError
from pettingllms.trainer.tracking import BACKENDS, check_backends, make_trackers

STEPS = {
    1: {"policy_0/alice/reward_mean": 0.25, "policy_0/bob/reward_mean": -1.0, "episode/success_rate": 0.5},
    2: {"policy_0/alice/reward_mean": 0.75, "policy_0/bob/reward_mean": float("nan"), "episode/success_rate": 1.0},
}
CONFIG = {"training": {"experiment_name": "tracking-test", "logger": ["console"]}, "optim": {"lr": 1e-5}}


def log_all(trackers) -> None:
    try:
        for step, metrics in STEPS.items():
            for tracker in trackers:
                tracker.log(step, metrics)
    finally:
        for tracker in trackers:
            tracker.close()


def test_summary_file_and_tensorboard_event_file(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = make_trackers(["console", "tensorboard"], tmp_path, "proj", "run", CONFIG)
    assert [type(t).__name__ for t in trackers] == ["SummaryFile", "TensorBoardTracker"]
    log_all(trackers)

    rows = [json.loads(line) for line in (tmp_path / "summary.log").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["policy_0/bob/reward_mean"] is None  # NaN is written as null, so the file stays valid JSON

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(STEPS[1])
    alice = events.Scalars("policy_0/alice/reward_mean")
    assert [(e.step, e.value) for e in alice] == [(1, 0.25), (2, 0.75)]
    bob = events.Scalars("policy_0/bob/reward_mean")
    assert bob[0].value == -1.0 and math.isnan(bob[1].value)
    assert "config" in "".join(events.Tags()["tensors"])  # the resolved config, in the TEXT tab


def wandb_records(path):
    """Records of a W&B transaction log (.wandb): a 7-byte W&B header, then the LevelDB log format (32 KiB blocks
    of chunks, each with a 7-byte header: crc32, length, type), each record a protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    block, header = 32768, 7
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = header, b""
    while pos + header <= len(data):
        if block - pos % block < header:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + header])
        pending += data[pos + header:pos + header + length]
        pos += header + length
        if kind in (1, 4):  # FULL, or LAST of FIRST/MIDDLE/LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(path, timeout_s: float = 20.0) -> list[dict]:
    # In offline mode run.finish() returns before the wandb-core service has written the file: wait for the
    # run's closing record.
    deadline = time.monotonic() + timeout_s
    while not any(r.WhichOneof("record_type") == "exit" for r in wandb_records(path)):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
        time.sleep(0.1)
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
    return rows


@pytest.fixture
def no_network(monkeypatch):
    """Record every attempt to reach the network: Python inet sockets, and HTTP(S) through a proxy that the
    wandb-core service (a Go binary, a child process) inherits from the environment."""
    attempts: list = []
    proxy = socket.create_server(("127.0.0.1", 0))
    proxy.settimeout(0.2)
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = proxy.accept()
            except OSError:
                continue
            attempts.append("proxy")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{proxy.getsockname()[1]}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(var, url)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    real_connect = socket.socket.connect

    def connect(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            attempts.append(address)
        return real_connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempts
    stop.set()
    thread.join()
    proxy.close()


def test_wandb_offline_run_is_written_without_network(tmp_path, monkeypatch, no_network):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    trackers = make_trackers(["console", "wandb"], tmp_path, "pettingllms-test", "tracking-test", CONFIG)
    run = trackers[1].run
    assert run.offline and run.config["optim"] == {"lr": 1e-5}
    log_all(trackers)

    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(run_dirs) == 1
    history = wandb_history(next(run_dirs[0].glob("run-*.wandb")))
    assert [h["_step"] for h in history] == [1, 2]
    assert history[0]["policy_0/alice/reward_mean"] == 0.25 and history[1]["policy_0/alice/reward_mean"] == 0.75
    assert history[0]["episode/success_rate"] == 0.5
    assert no_network == []


def test_unknown_logger_lists_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError) as info:
        make_trackers(["console", "tensorbord"], tmp_path, "p", "n", {})
    message = str(info.value)
    assert "tensorbord" in message and all(name in message for name in BACKENDS)
    assert not list(tmp_path.iterdir())  # nothing was opened


def test_missing_tracker_package_names_the_extra(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real_find_spec(name))
    with pytest.raises(ConfigError, match=r"wandb package is not installed.*\.\[trackers\]"):
        check_backends(["console", "wandb"])
    check_backends(["console", "tensorboard"])
