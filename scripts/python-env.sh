#!/usr/bin/env bash
# The Python side of the README's two commands: creates (or reuses) a venv under the user's
# cache, installs python/requirements.txt into it (only when that file changed), builds and
# installs the attn package with `pip install ./`, and prints the venv's python on stdout.
#
#   py=$(bash scripts/python-env.sh)      # ATTN_VENV overrides ~/.cache/attn-venv
#
# The venv is made by scripts/venv-common.sh (Debian's python3; PYTHON overrides it).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv-common.sh
venv="${ATTN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/attn-venv}"
log() { echo "python-env: $*" >&2; }
ensure_venv python-env "$venv"
py="$venv/bin/python"

stamp="$venv/.attn-requirements.sha256"
want=$(sha256sum python/requirements.txt | cut -d' ' -f1)
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
  log "installing python/requirements.txt (torch is large: minutes on a fresh machine)"
  "$py" -m pip install -q --disable-pip-version-check -r python/requirements.txt >&2
  echo "$want" > "$stamp"
fi

log "pip install ./ (build dir build/python, incremental)"
CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
  "$py" -m pip install -q --disable-pip-version-check --no-build-isolation ./ >&2
echo "$py"
