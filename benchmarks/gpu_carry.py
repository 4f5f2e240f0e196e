"""Carry vLLM, and everything the training scripts import beside it, to a lent GPU machine that has no package
registry, in parts small enough for one device call each.

A lent machine holds Python 3.12 with torch 2.11 (CUDA 13) and a data-science image, no vLLM, and reaches no
registry; one call there carries at most 64 MiB of files. vLLM 0.26.0 is the newest release built for torch 2.11
(0.27 and later pin torch 2.13), and its wheel alone is 304 MB. So:

    python benchmarks/gpu_carry.py pack .carry                  # here, where pip reaches a registry (minutes)

resolves vLLM 0.26.0 with the project's own dependencies, keeps what the machine's image lacks (or holds at another
version than the project pins), drops what these runs never load (below), installs it into one site folder,
compresses that with xz and cuts it into ``part-NN`` files with a ``MANIFEST.json``. Then, one device call per part,
back to back (a lent machine is given back 30 s after a call ends, and everything on it with it):

    python3 benchmarks/gpu_carry.py receive .carry    # carry: .carry/MANIFEST.json, .carry/part-NN, .carry/smollm2-tokenizer,
                                                      # data/math (the offline math set, made here by pack)

Each call keeps its part in a spool on the machine; the call that completes the set checks every part against the
manifest, unpacks the site into /tmp/site and imports what the runs import (``check``), on the GPU. That call, or
the next, runs the GPU parts with ``PYTHONPATH=/tmp/site:$PWD`` (docs/distributed.md "On a lent GPU machine").

What is left out, and why it is safe for these runs (Qwen3 and SmolLM2 dense models, bf16, one Hopper GPU):
- FlashAttention-2's library (305 MB): Hopper runs vLLM's FlashAttention-3 build, which is kept.
- the MoE kernels, DeepGEMM and the SM100 attention headers: dense models on an SM90 card never load them (vLLM
  imports the MoE library inside ``contextlib.suppress(ImportError)``).
- the ``vllm-rs`` frontend binary: used only with ``VLLM_RUST_FRONTEND_PATH=auto``.
- FlashInfer and the packages only its kernels, TileLang's or CUTLASS-DSL's need: the runs set
  ``VLLM_USE_FLASHINFER_SAMPLER=0`` (vLLM's PyTorch sampler) and attend with FlashAttention-3.
- torchvision, torchaudio, torchcodec, PyNvVideoCodec: multimodal inputs only.
- Ray's Java jars and the dashboard's web client; wandb (verl declares it; ``training.logger=wandb`` only).
``check`` imports every module the GPU parts import, so a wrong guess here fails in seconds, not mid-run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path
from typing import BinaryIO, Iterable

ROOT = Path(__file__).resolve().parents[1]
VLLM_PIN = "vllm==0.26.0"
MACHINE_TORCH = "torch==2.11.0"
PYTHON_VERSION = "3.12"
GLIBC_PLATFORM = "x86_64-manylinux_2_35"
PART_MIB = 50  # a call carries 64 MiB in all: the repository (6 MiB), the manifest and the tokenizer (3.5 MiB) too
MANIFEST = "MANIFEST.json"
TOKENIZER = "smollm2-tokenizer"  # beside the parts, carried with the manifest by every call (3.5 MiB)
SPOOL = Path("/tmp/gpu-carry")
SITE = Path("/tmp/site")

# Package names of the lent machines' image (its Python packages as read on one on 2026-11-17). Whatever else the
# resolution needs is carried.
MACHINE_HAS = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio interface-meta iniconfig jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyre-extensions pyparsing pyproject-hooks pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp
""".split())
# The project pins these exactly; the image holds other versions (transformers 5.17, tokenizers 0.23.2), which the
# pins exclude.
CARRY_ANYWAY = frozenset({"transformers", "tokenizers", "peft"})
# Declared by vLLM 0.26.0 or its dependencies, never loaded by these runs (module docstring).
LEFT_BEHIND = frozenset("""
torch torchvision torchaudio torchcodec pynvvideocodec flashinfer-python tilelang quack-kernels
humming-kernels tokenspeed-mla tokenspeed-triton nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base
nvidia-cutlass-dsl-libs-core nvidia-cutlass-dsl-libs-cu12 nvidia-cutlass-dsl-libs-cu13 nvidia-cudnn-frontend
cuda-tile cuda-python nvidia-cuda-nvcc nvidia-cuda-crt nvidia-nvvm nvidia-cuda-cccl nvidia-cuda-nvdisasm z3-solver
fastsafetensors py-spy wandb sentry-sdk
""".split())
# Files of the carried packages these runs never load (module docstring).
STRIPPED = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/vllm-rs",
    "vllm/third_party/deep_gemm",
    "vllm/third_party/fmha_sm100",
    "ray/jars",
    "ray/dashboard/client/build",
)
# Modules that load CUDA's driver library (libcuda): ``rehearse`` on a machine without a GPU skips them.
NEEDS_DRIVER = ("vllm._C_stable_libtorch", "vllm.vllm_flash_attn", "vllm.platforms.cuda")
# What the GPU parts import, checked on the machine once the site is unpacked.
CHECKED_IMPORTS = (
    "vllm", "vllm._C_stable_libtorch", "vllm.vllm_flash_attn", "vllm.platforms.cuda", "vllm.v1.engine.async_llm",
    "vllm.lora.request", "vllm.model_executor.models.qwen3", "vllm.model_executor.models.llama", "ray", "verl",
    "transformers", "peft", "hydra", "omegaconf", "datasets", "math_verify", "pettingllms.rollout.vllm.engine",
    "pettingllms.entry.train",
)


def _uv() -> str:
    return shutil.which("uv") or str(Path(sys.executable).parent / "uv")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project_requirements() -> list[str]:
    """The project's dependencies with torch at the machine's version."""
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [MACHINE_TORCH if normalise(re.split(r"[<>=!~ ;\[]", d, 1)[0]) == "torch" else d for d in dependencies]


def to_carry(pinned: Iterable[str]) -> list[str]:
    """``name==version`` pins of a resolution that the machine lacks or holds at another version."""
    chosen = []
    for pin in pinned:
        name = normalise(pin.split("==", 1)[0])
        if name in LEFT_BEHIND or (name in MACHINE_HAS and name not in CARRY_ANYWAY):
            continue
        chosen.append(pin)
    return sorted(chosen)


def resolve(requirements: list[str], work: Path, python: str) -> list[str]:
    """Every package and version the requirements resolve to on the machine's platform, for CPython ``python``."""
    source = work / "requirements.in"
    source.write_text("\n".join(requirements) + "\n")
    pinned = work / "requirements.txt"
    subprocess.run([_uv(), "pip", "compile", "-q", str(source), "--python-version", python,
                    "--python-platform", GLIBC_PLATFORM, "--no-header", "--no-annotate", "-o", str(pinned)],
                   check=True)
    return [line.strip() for line in pinned.read_text().splitlines() if "==" in line and not line.startswith("#")]


def _wheel_tags(python: str) -> list[str]:
    """pip's flags for CPython ``python`` wheels on manylinux x86-64 (pip matches each platform tag exactly)."""
    platforms = [f"manylinux_2_{n}_x86_64" for n in (35, 34, 31, 28, 27, 24, 17)]
    platforms += ["manylinux2014_x86_64", "manylinux1_x86_64"]
    return ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *(arg for platform in platforms for arg in ("--platform", platform))]


def download(pins: list[str], wheels: Path, python: str) -> None:
    """One wheel per pin for the machine's Python and platform; a pin published only as a source archive is built
    here (pure Python: antlr4's runtime)."""
    for pin in pins:
        binary = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *_wheel_tags(python), "-d", str(wheels), pin],
            capture_output=True, text=True)
        if binary.returncode:
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), pin],
                           check=True)


def install(wheels: Path, site: Path, python: str) -> None:
    """The wheels unpacked as pip installs them, into one folder that goes on ``PYTHONPATH`` there."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--no-index",
                    *_wheel_tags(python), "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))], check=True)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts: the runs import the packages


def strip(site: Path) -> int:
    """Remove ``STRIPPED`` from the installed packages; returns the bytes removed."""
    removed = 0
    for relative in STRIPPED:
        path = site / relative
        if path.is_dir():
            removed += sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
        elif path.exists():
            removed += path.stat().st_size
            path.unlink()
        else:
            raise FileNotFoundError(f"{relative} is not in the carried packages: STRIPPED is out of date")
    return removed


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prepare_math_data() -> Path:
    """The offline math sets gpu_smoke's training parts read (``data/math``, made by the loader users run), which the
    machine cannot make: reasoning-gym needs pycosat, published as a source archive only. Carried as they are."""
    math = ROOT / "data" / "math"
    if not all((math / split / "gsm_symbolic.parquet").is_file() for split in ("train", "test")):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "dataprocess" / "load_math.py")], cwd=ROOT, check=True)
    return math


def copy_tokenizer(dest: Path) -> None:
    """The packaged SmolLM2's BPE files, which the full-size replicas take (the GGUF they come from is not carried)."""
    sys.path.insert(0, str(ROOT))
    from pettingllms.models import aliases

    dest.mkdir(parents=True, exist_ok=True)
    for name in ("chat_template.jinja", "config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        shutil.copyfile(aliases.smollm2_dir() / name, dest / name)


def write_parts(site: Path, dest: Path, part_bytes: int, archive: Path, facts: dict) -> dict:
    """``site`` as one xz-compressed tar cut into ``dest/part-NN`` files of at most ``part_bytes``, and the
    manifest (``facts`` plus the parts' and the archive's checksums) written beside them; returns the manifest."""
    with archive.open("wb") as out:
        tar = subprocess.Popen(["tar", "-C", str(site), "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-6", f"-T{os.cpu_count() or 1}", "-c"], stdin=tar.stdout, stdout=out, check=True)
        if tar.wait():
            raise subprocess.CalledProcessError(tar.returncode, "tar")
    manifest = {**facts, "archive_sha256": file_sha256(archive), "archive_bytes": archive.stat().st_size,
                "parts": split_archive(archive, dest, part_bytes)}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def split_archive(archive: Path, dest: Path, part_bytes: int) -> list[dict]:
    """Cut ``archive`` into ``dest/part-NN`` files of at most ``part_bytes``."""
    parts = []
    with archive.open("rb") as source:
        for index in range(1, 100):
            data = source.read(part_bytes)
            if not data:
                break
            name = f"part-{index:02d}"
            (dest / name).write_bytes(data)
            parts.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        else:
            raise ValueError(f"{archive} needs more than 99 parts of {part_bytes} bytes")
    return parts


def build_site(site: Path, work: Path, python: str) -> dict:
    """The carried packages for CPython ``python``, installed into ``site`` and stripped; returns what went in."""
    pinned = resolve([VLLM_PIN, *project_requirements()], work, python)
    carried = to_carry(pinned)
    print(f"gpu_carry: {len(pinned)} packages resolved, {len(carried)} to carry", flush=True)
    download(carried, work / "wheels", python)
    install(work / "wheels", site, python)
    stripped = strip(site)
    installed = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    print(f"gpu_carry: site {installed / 2**20:.0f} MiB after {stripped / 2**20:.0f} MiB stripped",
          flush=True)
    return {"vllm": VLLM_PIN, "torch_on_machine": MACHINE_TORCH, "python": python, "site_bytes": installed,
            "stripped_bytes": stripped, "resolved": pinned, "carried": carried, "left_behind": sorted(LEFT_BEHIND),
            "stripped": list(STRIPPED)}


def pack(dest: Path, part_mib: int, keep_work: bool) -> dict:
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("part-*"):
        old.unlink()
    work = Path(tempfile.mkdtemp(prefix="gpu-carry-"))
    try:
        facts = build_site(work / "site", work, PYTHON_VERSION)
        print("gpu_carry: compressing", flush=True)
        manifest = write_parts(work / "site", dest, part_mib * 2**20, work / "site.tar.xz", facts)
        copy_tokenizer(dest / TOKENIZER)
        math = prepare_math_data()
        print(f"gpu_carry: {len(manifest['parts'])} parts of <= {part_mib} MiB in {dest} "
              f"({manifest['archive_bytes'] / 2**20:.0f} MiB in all); each call carries {dest / MANIFEST}, "
              f"{dest / TOKENIZER}, {math.relative_to(ROOT)} and one part")
        return manifest
    finally:
        if keep_work:
            print(f"gpu_carry: work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def rehearse(folder: Path) -> bool:
    """Here, on CPU: the lent machine's Python environment as far as these runs touch it (torch 2.11's CUDA build
    and every resolved package the image holds, in ``folder/venv``), the carried site built for this Python beside
    it, and ``check`` run there, less the imports that need CUDA's driver (``NEEDS_DRIVER``). True when they all
    succeed."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    work = folder / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    site = folder / "site"
    shutil.rmtree(site, ignore_errors=True)
    facts = build_site(site, work, python)
    venv = folder / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    image = [pin for pin in facts["resolved"] if pin not in facts["carried"]
             and normalise(pin.split("==", 1)[0]) in MACHINE_HAS]
    subprocess.run([_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-deps", *image],
                   check=True)
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT}"}
    modules = [m for m in CHECKED_IMPORTS if m not in NEEDS_DRIVER]
    result = subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).resolve()), "check", *modules],
                            env=env)
    print(f"gpu_carry: not imported here (CUDA's driver library is needed): {' '.join(NEEDS_DRIVER)}")
    return result.returncode == 0


def spool_parts(source: Path, spool: Path, manifest: dict) -> list[str]:
    """Copy the parts present in ``source`` into ``spool``, each checked against the manifest; returns the names
    still missing from the spool."""
    spool.mkdir(parents=True, exist_ok=True)
    missing = []
    for part in manifest["parts"]:
        held, brought = spool / part["name"], source / part["name"]
        if not (held.exists() and file_sha256(held) == part["sha256"]) and brought.exists():
            if file_sha256(brought) != part["sha256"]:
                raise ValueError(f"{brought}: checksum differs from {MANIFEST}; pack again")
            shutil.copyfile(brought, held)
        if not held.exists():
            missing.append(part["name"])
    return missing


class _Joined:
    """The spooled parts read as one stream, hashed as they are read."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths = iter(paths)
        self._handle: BinaryIO | None = None
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        while True:
            if self._handle is None:
                path = next(self._paths, None)
                if path is None:
                    return b""
                self._handle = path.open("rb")
            data = self._handle.read(size if size and size > 0 else 1 << 20)
            if data:
                self.digest.update(data)
                return data
            self._handle.close()
            self._handle = None


def unpack(spool: Path, site: Path, manifest: dict) -> None:
    """The spooled parts, joined, decompressed and extracted into ``site``; the archive's checksum is checked as it
    streams, and ``site`` is marked complete only after it matches."""
    joined = _Joined([spool / part["name"] for part in manifest["parts"]])
    site.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=lzma.LZMAFile(joined), mode="r|") as tar:  # type: ignore[arg-type]
        tar.extractall(site, filter="tar")
    while joined.read():  # xz's stream padding, if any: the checksum covers every byte
        pass
    if joined.digest.hexdigest() != manifest["archive_sha256"]:
        raise ValueError("the joined parts differ from the packed archive; pack again")
    (site / ".gpu-carry-complete").write_text(manifest["archive_sha256"] + "\n")


def receive(source: Path, spool: Path, site: Path) -> bool:
    """Keep the parts brought by this call; unpack once all are here. True when the site is complete."""
    manifest = json.loads((source / MANIFEST).read_text())
    marker = site / ".gpu-carry-complete"
    if marker.exists() and marker.read_text().strip() == manifest["archive_sha256"]:
        print(f"gpu_carry: {site} is already complete")
        return True
    missing = spool_parts(source, spool, manifest)
    held = len(manifest["parts"]) - len(missing)
    if missing:
        print(f"gpu_carry: {held} of {len(manifest['parts'])} parts here; still to carry: {' '.join(missing)}")
        return False
    print(f"gpu_carry: all {held} parts here; unpacking into {site}", flush=True)
    unpack(spool, site, manifest)
    print(f"gpu_carry: {site} complete")
    return True


def check(modules: Iterable[str] = CHECKED_IMPORTS) -> list[str]:
    """Import each module (one interpreter for all: vLLM's import alone takes seconds); returns the failures. An
    interpreter that dies in a native import names no module: that is reported as one failure."""
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    try:\n"
              "        importlib.import_module(name)\n"
              "    except BaseException as error:\n"
              "        print(f'FAILED {name}: {type(error).__name__}: {error}', flush=True)\n"
              "    else:\n"
              "        print(f'ok {name}', flush=True)\n")
    modules = list(modules)
    result = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True, text=True)
    lines = result.stdout.splitlines()
    failures = [line.removeprefix("FAILED ") for line in lines if line.startswith("FAILED ")]
    if len(lines) < len(modules):
        last = (result.stderr.strip().splitlines() or ["no message"])[-1]
        failures.append(f"the interpreter died after {len(lines)} of {len(modules)} imports: {last}")
    for failure in failures:
        print(f"gpu_carry: import {failure}", flush=True)
    if not failures:
        print(f"gpu_carry: all {len(modules)} imports succeed")
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="here: resolve, download, strip, compress and cut into parts")
    packing.add_argument("dest", type=Path)
    packing.add_argument("--part-mib", type=int, default=PART_MIB)
    packing.add_argument("--keep-work", action="store_true", help="keep the wheels and the unpacked site")
    receiving = verbs.add_parser("receive", help="there: keep this call's part; unpack and check when all are in")
    receiving.add_argument("source", type=Path)
    receiving.add_argument("--spool", type=Path, default=SPOOL)
    receiving.add_argument("--site", type=Path, default=SITE)
    receiving.add_argument("--no-check", action="store_true", help="skip the import check after unpacking")
    checking = verbs.add_parser("check", help="import what the GPU parts import (run with PYTHONPATH=SITE:REPO)")
    checking.add_argument("modules", nargs="*", default=list(CHECKED_IMPORTS))
    rehearsing = verbs.add_parser("rehearse", help="here: check the carried site against a venv holding only what "
                                  "the lent image holds, for this Python")
    rehearsing.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.verb == "pack":
        pack(args.dest, args.part_mib, args.keep_work)
        return 0
    if args.verb == "receive":
        complete = receive(args.source, args.spool, args.site)
        if complete and not args.no_check:
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(args.site), str(ROOT),
                                                                     os.environ.get("PYTHONPATH")]))
            return 1 if check() else 0
        return 0 if complete else 3
    if args.verb == "rehearse":
        return 0 if rehearse(args.folder) else 1
    return 1 if check(args.modules) else 0


if __name__ == "__main__":
    sys.exit(main())
