#!/bin/sh
# Install the system packages PettingLLMs needs beyond Python: bubblewrap (bwrap), the sandbox's strong
# isolation layer (pettingllms/sandbox, docs/sandbox.md).
#
# Idempotent and never fails the build: without root, apt-get or network it prints a warning and exits 0
# -- the sandbox then falls back to its weaker layer and says so in its log.
set -u

warn() { echo "install_system_deps: WARNING: $*" >&2; }

if command -v bwrap >/dev/null 2>&1; then
    echo "install_system_deps: bubblewrap already installed ($(command -v bwrap))"
    exit 0
fi
if [ "$(id -u)" != "0" ]; then
    warn "bubblewrap is missing and this is not root; install the 'bubblewrap' package (sandbox falls back to its weaker layer)"
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    warn "bubblewrap is missing and apt-get is not available; install bubblewrap with your package manager"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1; then
    # The package lists may be missing (fresh container): update once, then retry.
    if ! { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null 2>&1; }; then
        warn "apt-get could not install bubblewrap (offline?); the sandbox falls back to its weaker layer"
        exit 0
    fi
fi
if command -v bwrap >/dev/null 2>&1; then
    echo "install_system_deps: installed bubblewrap ($(bwrap --version 2>/dev/null))"
else
    warn "apt-get reported success but bwrap is still not on PATH"
fi
exit 0
