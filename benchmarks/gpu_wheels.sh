#!/usr/bin/env bash
# Prepare WHEEL_DIR for benchmarks/gpu_lent.sh on a GPU machine without a package registry whose Python (3.12) has
# torch but not the project's other pins: run here, where pip reaches a registry, then carry WHEEL_DIR there.
#
#   bash benchmarks/gpu_wheels.sh .whl
#
# Ray's wheel (79 MB) is carried without its server binaries, Java jars and dashboard (19 MB): the benchmarks import
# Ray through verl and never start it. smollm2-tokenizer/ holds the BPE files the full-size replica takes.
set -euo pipefail
dest=${1:?usage: gpu_wheels.sh WHEEL_DIR}
python=${PYTHON:-.venv/bin/python}
mkdir -p "$dest"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do platforms+=(--platform "$p"); done
pins="codetiming==1.4.0 hydra-core==1.3.8 omegaconf==2.3.1 orjson==3.13.0 pyvers==0.1.0 ray==2.60.0
      tensordict==0.10.0 verl==0.9.1 transformers==5.10.4 tokenizers==0.22.2 peft==0.21.2 jsonschema==4.26.0
      jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1"
for pin in $pins; do
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dest" "$pin"
done
"$python" -m pip wheel -q --no-deps -w "$dest" antlr4-python3-runtime==4.9.3  # published as a source archive only
"$python" - "$dest" <<'PY'
import re, sys, zipfile
from pathlib import Path
dest = Path(sys.argv[1])
(wheel,) = dest.glob("ray-*.whl")
drop = re.compile(r"^ray/(core/src/ray/(gcs|raylet)/|jars/|dashboard/client/build/|_private/runtime_env/agent/thirdparty_files/)")
stripped = wheel.with_suffix(".tmp")
with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(stripped, "w", zipfile.ZIP_DEFLATED) as target:
    for info in source.infolist():
        if drop.match(info.filename):
            continue
        data = source.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = "\n".join(l for l in data.decode().splitlines() if not drop.match(l)).encode() + b"\n"
        target.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
stripped.replace(wheel)
PY
tokenizer=$("$python" -c 'from pettingllms.models import aliases; print(aliases.smollm2_dir())')
mkdir -p "$dest/smollm2-tokenizer"
for f in chat_template.jinja config.json generation_config.json tokenizer.json tokenizer_config.json; do
  cp "$tokenizer/$f" "$dest/smollm2-tokenizer/"
done
du -sh "$dest"
