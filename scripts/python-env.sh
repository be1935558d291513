#!/usr/bin/env bash
# The Python side of the README's two commands: creates (or reuses) a venv under the user's
# cache, installs python/requirements.txt into it (only when that file changed), builds and
# installs the attn package with `pip install ./`, and prints the venv's python on stdout.
#
#   py=$(bash scripts/python-env.sh)      # ATTN_VENV overrides ~/.cache/attn-venv
#
# The interpreter is Debian's /usr/bin/python3 (python3-venv and python3-dev come from
# scripts/install-deps.sh), not whatever `python3` a shell's PATH finds first (pyenv, conda):
# CI and developers then build against the same Python. PYTHON overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${ATTN_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/attn-venv}"
python="${PYTHON:-/usr/bin/python3}"
log() { echo "python-env: $*" >&2; }

if ! "$venv/bin/python" -c "import sys" >/dev/null 2>&1; then
  log "creating $venv with $python ($("$python" --version 2>&1))"
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi
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
