# Sourced by scripts/python-env.sh and scripts/python-venv.sh: the one way this project makes a
# venv. The interpreter is Debian's /usr/bin/python3 (python3-venv and python3-dev come from
# scripts/install-deps.sh), not whatever `python3` a shell's PATH finds first (pyenv, conda):
# CI and developers then build against the same Python. PYTHON overrides it.
#
#   ensure_venv TAG DIR      # creates DIR when it holds no working python; logs as TAG on stderr
ensure_venv() {
  local tag="$1" venv="$2" python="${PYTHON:-/usr/bin/python3}"
  if ! "$venv/bin/python" -c "import sys" >/dev/null 2>&1; then
    echo "$tag: creating $venv with $python ($("$python" --version 2>&1))" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
}
