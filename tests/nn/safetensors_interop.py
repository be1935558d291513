"""attn's safetensors files against the Python `safetensors` package, both ways.

    python safetensors_interop.py TOOL DIR

1. TOOL write DIR: attn writes DIR/attn_model.safetensors and DIR/attn_dtypes.safetensors, and
   each tensor again as DIR/attn/<name>.npy. The package reads both files; every tensor must
   equal its .npy bit for bit (bf16, which NumPy lacks, is read as raw bytes and widened to
   float32, as attn's .npy writer stores it), and the metadata must be there.
2. The package writes DIR/py_dtypes.safetensors (one tensor per dtype NumPy has) and
   DIR/py_model.safetensors (attn's parameter names and shapes, new values), with .npy copies
   in DIR/py/; TOOL check DIR reads them with attn and compares (and loads the model).
Exits non-zero on any difference.
"""
import os
import subprocess
import sys

import numpy as np
import safetensors
from safetensors.numpy import load_file, save_file

tool, work = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(work, "py"), exist_ok=True)
failures = []


def run(*args):
    r = subprocess.run([tool, *args], capture_output=True, text=True)
    print(r.stdout, end="")
    print(r.stderr, end="", file=sys.stderr)
    return r.returncode


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ---- 1. attn writes, Python reads ----
if run("write", work) != 0:
    sys.exit("safetensors_tool write failed")
for name in ("attn_model.safetensors", "attn_dtypes.safetensors"):
    path = os.path.join(work, name)
    raw = safetensors.deserialize(open(path, "rb").read())
    for key, spec in raw:
        want = np.load(os.path.join(work, "attn", key + ".npy"))
        if spec["dtype"] == "BF16":  # NumPy has no bfloat16: widen the raw halves to float32
            got = (np.frombuffer(bytes(spec["data"]), dtype="<u2").astype("<u4") << 16).view("<f4")
            got = got.reshape(spec["shape"])
        else:
            with safetensors.safe_open(path, framework="numpy") as f:
                got = f.get_tensor(key)
        if not same_bits(got, want):
            failures.append(f"{name}: '{key}' {got.dtype} {got.shape} differs from attn/{key}.npy {want.dtype} {want.shape}")
    print(f"python read {name}: {len(raw)} tensors")
with safetensors.safe_open(os.path.join(work, "attn_model.safetensors"), framework="numpy") as f:
    if f.metadata() != {"written_by": "attn"}:
        failures.append(f"attn_model.safetensors metadata is {f.metadata()}")

# ---- 2. Python writes, attn reads ----
rng = np.random.default_rng(5)
dtypes = {
    "f32": rng.standard_normal((3, 4)).astype(np.float32),
    "f64": rng.standard_normal((5,)),
    "f16": rng.standard_normal((2, 3)).astype(np.float16),
    "i64": np.array([-3, 0, 2**60], dtype=np.int64),
    "bool": np.array([[True, False], [False, True]]),
    "scalar": np.array(2.5, dtype=np.float64),
}
model = {k: (v + rng.standard_normal(v.shape)).astype(v.dtype) for k, v in load_file(os.path.join(work, "attn_model.safetensors")).items()}
for tensors, name, meta in ((dtypes, "py_dtypes.safetensors", {"written_by": "python"}), (model, "py_model.safetensors", None)):
    save_file(tensors, os.path.join(work, name), metadata=meta)
    for key, value in tensors.items():
        np.save(os.path.join(work, "py", key + ".npy"), value)
if run("check", work) != 0:
    failures.append("attn's check of the files written by Python failed (see above)")

for f in failures:
    print("FAIL:", f)
print(f"safetensors {safetensors.__version__}, numpy {np.__version__}: {'FAILED' if failures else 'both directions match'}")
sys.exit(1 if failures else 0)
