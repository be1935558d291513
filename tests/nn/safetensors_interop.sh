#!/usr/bin/env bash
# CTest driver of safetensors_interop.py: gets (creating it if needed) the test venv with numpy
# and safetensors, then runs the round trip. Fails — never skips — when Python or the packages
# cannot be had.
#   safetensors_interop.sh TOOL WORKDIR
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py=$(bash "$here/../../scripts/python-venv.sh")
rm -rf "$2"
mkdir -p "$2"
exec "$py" "$here/safetensors_interop.py" "$1" "$2"
