#!/usr/bin/env bash
# A small Python venv for the tests that check attn against Python packages (today: the
# safetensors round trip, tests/nn/safetensors_interop.py). It holds numpy and safetensors
# from PyPI only; it is created when missing (or when a package is missing) and reused
# otherwise. Prints the venv's python on stdout; progress goes to stderr.
#
#   py=$(bash scripts/python-venv.sh)        # ATTN_TEST_VENV overrides ~/.cache/attn-test-venv
#
# It is separate from scripts/python-env.sh's venv so that ctest needs neither torch nor the
# attn package; both are made by scripts/venv-common.sh (Debian's python3; PYTHON overrides it).
set -euo pipefail
source "$(dirname "$0")/venv-common.sh"
venv="${ATTN_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/attn-test-venv}"
log() { echo "python-venv: $*" >&2; }
ensure_venv python-venv "$venv"
py="$venv/bin/python"
if ! "$py" -c "import numpy, safetensors" >/dev/null 2>&1; then
  log "installing numpy and safetensors into $venv"
  "$py" -m pip install -q --disable-pip-version-check "numpy>=1.24" "safetensors>=0.4" >&2
fi
echo "$py"
