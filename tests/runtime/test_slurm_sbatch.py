"""``scripts/slurm/train.sbatch`` run as Slurm would run it, on one machine: stub ``scontrol``/``srun``/``sinfo``
and a real two-process Ray cluster (a head and one worker, started by the script), then a one-step CPU training
through a shipped train script that joins that cluster.

The stubs: ``scontrol show hostnames`` names two nodes; ``srun [options] cmd ...`` runs ``cmd ...`` here (as
``srun -w <node>`` would run it on that node); ``hostname --ip-address`` answers 127.0.0.1, so both Ray processes
listen on loopback. Everything else is the script's own logic: head, worker, health check, RAY_ADDRESS and
CLUSTER_GPUS for the run, and stopping only the Ray processes it started.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUBS = {
    "scontrol": '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] || { echo "scontrol stub: $*" >&2; exit 2; }\n'
                'printf "node-a\\nnode-b\\n"\n',
    "srun": '#!/bin/sh\n# srun [options] command ...: run the command here, as the chosen node would.\n'
            'while [ $# -gt 0 ]; do case "$1" in -w|--nodelist) shift 2;; -*) shift;; *) break;; esac; done\n'
            'exec "$@"\n',
    "sinfo": '#!/bin/sh\necho "PARTITION AVAIL NODES"\necho "debug up 2"\n',
    "hostname": '#!/bin/sh\n[ "$1" = "--ip-address" ] && { echo 127.0.0.1; exit 0; }\nexec /bin/hostname "$@"\n',
}
# The driver as it runs on a big Slurm node: os.cpu_count() says 64 while the job has 2 CPUs per task. Only the
# training command (`python -m ...`) is wrapped; the script's other Python snippets run as they are.
BIG_NODE_PYTHON = """#!/bin/sh
if [ "$1" = "-m" ]; then
  exec {python} -c 'import os, runpy, sys; os.cpu_count = lambda: 64; module = sys.argv[2]; \
sys.argv = [module] + sys.argv[3:]; runpy.run_module(module, run_name="__main__", alter_sys=True)' "$@"
fi
exec {python} "$@"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ray_processes_of(port: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in out if "gcs_server" in line and f"--gcs_server_port={port}" in line]


# Slow lane (make test-slow): 35 s; the scripts' Ray placement across two nodes is in the default lane
# (tests/runtime/test_simulated_cluster.py).
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_sbatch_script_starts_a_two_process_ray_cluster_and_trains_through_it(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in STUBS.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python").write_text(BIG_NODE_PYTHON.format(python=sys.executable))
    (bin_dir / "python").chmod(0o755)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "GPU_num", "CUDA_VISIBLE_DEVICES")}
    env.update({
        "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{env['PATH']}",
        "PYTHON": str(bin_dir / "python"),
        "RAY": str(Path(sys.executable).parent / "ray"),
        "SLURM_JOB_NODELIST": "node-[a-b]",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_GPUS_PER_NODE": "0",
        "RAY_PORT": str(port),
        "RAY_HEALTH_TIMEOUT": "240",
        "RAY_worker_niceness": "0",
    })
    overrides = [
        "base_models.policy_0.path=tiny-random-smollm2", "training.total_training_steps=1",
        "training.train_batch_size=1", "rollout.branching=2", "env.max_turns=1", "training.max_response_length=8",
        "training.val_freq=0", "training.export_hf=false", "training.plot=false", "training.resume=none",
        f"training.log_dir={tmp_path / 'logs'}",  # no resources.num_cpus: the ranks get the cluster's CPUs
    ]
    run = subprocess.run(
        ["bash", str(ROOT / "scripts/slurm/train.sbatch"), "scripts/train/game/plan_path_L1_prompt.sh", *overrides],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "Ray cluster ready: 2 nodes, 0 GPUs, 4 CPUs" in output  # the health check saw head + worker
    assert f"joined the Ray cluster at 127.0.0.1:{port}: 2 node(s)" in output  # the run used it, not its own Ray
    (summary,) = (tmp_path / "logs").glob("*/*/*/summary.log")
    rows = [json.loads(line) for line in summary.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and rows[0]["policy_0/actor/num_sequences"] > 0
    assert ray_processes_of(port) == [], "the script must stop the Ray processes it started"

    # `ray start` recorded this (now stopped) cluster as the machine's current one; a run without RAY_ADDRESS must
    # still start a Ray of its own rather than try to join it.
    import ray

    from settings_support import learner_config
    from pettingllms.runtime.group import PolicyGroup
    from pettingllms.runtime.layout import resolve_layout
    from pettingllms.runtime.spec import WorkerSpec

    spec = WorkerSpec("policy_0", "tiny-random-smollm2", learner_config(total_steps=1),
                      resolve_layout("policy_0", num_gpus=0, cpus_per_rank=1.0))
    group = PolicyGroup([spec], use_ray=True, num_cpus=2, namespace="pettingllms-test-own-ray", setup=False)
    try:
        assert ray.is_initialized() and group.placements["policy_0"][0]["node_id"]
    finally:
        group.shutdown()
    assert not ray.is_initialized()
