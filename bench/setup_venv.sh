#!/usr/bin/env bash
# bench/setup_venv.sh — the benchmark environment for the peers of `attn bench`: a Python venv
# with PyTorch (scaled_dot_product_attention and the eager family peers), the entmax package
# (sparsemax / entmax15 peers of `attn bench --distribution`), ggml-python (ggml's fused flash
# attention), ONNX Runtime and onnx (the CPU kernel of ONNX's Attention operator), NumPy and
# matplotlib, all from PyPI. None of it is a dependency of the attn library.
#
#   bench/setup_venv.sh                 # venv in $ATTN_BENCH_VENV (default ~/.cache/attn-bench-venv)
#   TORCH_VERSION=1.13.1 bench/setup_venv.sh
#
# PyPI's Linux x86-64 torch wheels are CUDA builds: pip pulls the nvidia-* runtime wheels too
# (several GB). They load without a GPU and torch then runs on the CPU only.
set -euo pipefail
venv="${ATTN_BENCH_VENV:-$HOME/.cache/attn-bench-venv}"
python="${PYTHON:-python3.11}"
torch_version="${TORCH_VERSION:-2.15.0}"
entmax_version="${ENTMAX_VERSION:-1.3}"
ggml_version="${GGML_PYTHON_VERSION:-0.0.45}"
ort_version="${ONNXRUNTIME_VERSION:-1.32.0}"  # needs a CPU kernel for ONNX Attention (opset 23)
onnx_version="${ONNX_VERSION:-1.23.2}"

if [[ ! -x "$venv/bin/python" ]]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --upgrade pip
"$venv/bin/python" -m pip install numpy matplotlib "torch==$torch_version" "entmax==$entmax_version" \
  "onnx==$onnx_version" "onnxruntime==$ort_version"
# ggml-python ships an sdist that compiles ggml (CMake, a few minutes); optional.
if ! CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
     "$venv/bin/python" -m pip install "ggml-python==$ggml_version"; then
  echo "setup_venv: ggml-python did not install; the ggml peer will be skipped" >&2
fi
"$venv/bin/python" - <<'PY'
import importlib
for name in ("numpy", "matplotlib", "torch", "entmax", "ggml", "onnx", "onnxruntime"):
    try:
        m = importlib.import_module(name)
        print(f"{name:12s} {getattr(m, '__version__', 'ok')}")
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"{name:12s} missing ({e})")
PY
echo "venv: $venv  (attn bench --python $venv/bin/python)"
