#!/usr/bin/env python3
"""Whether two builds of the cuda kernels hold the same machine code, registers and scheduling
aside: for a refactor of src/cuda made without a GPU to re-run the device tests on (docs/CUDA.md).

For each kernel in both object files it compares the multiset of SASS instructions with register
names, branch targets, operand-reuse hints, NOPs and register-to-register moves taken out. Equal
multisets mean the same instructions, reordered or allocated differently by ptxas; anything else
is printed, and the refactor needs the GPU check again. Build both with the same flags (the
objects of build/*/src/CMakeFiles/attn_cuda_kernels.dir/cuda/).

  python3 scripts/cuda-sass-compare.py OLD.cu.o NEW.cu.o     # exit 0: same instructions

cuobjdump comes from the CUDA toolkit, or from PyPI's nvidia-cuda-cuobjdump wheel
(`pip download nvidia-cuda-cuobjdump`, unzip; CUOBJDUMP=path/to/cuobjdump).
"""
import collections
import os
import re
import shutil
import subprocess
import sys


# Padding, register-to-register moves and register zeroing: what ptxas adds or drops with another
# allocation (a move is written MOV or IMAD.MOV.U32 r, RZ, RZ, x; two zeroings may be one CS2R).
SCHEDULING = {"NOP", "MOV r, r", "MOV r, RZ", "CS2R r, SRZ"}


def kernels(obj, cuobjdump):
    text = subprocess.run([cuobjdump, "-sass", obj], check=True, capture_output=True, text=True).stdout
    out, arch, name = {}, "", None
    for line in text.splitlines():
        if line.startswith("arch = "):
            arch = line.split("=")[1].strip()
        elif "Function :" in line:
            name = arch + " " + line.split("Function :")[1].strip()
            out[name] = collections.Counter()
        elif name:
            m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
            if m:
                ins = re.sub(r"\b(UR\d+|UP\d|R\d+|P\d|B\d+)\b", "r", m.group(1).strip())
                ins = re.sub(r"0x[0-9a-f]{3,}", "X", ins).replace(".reuse", "")
                ins = re.sub(r"^IMAD\.MOV(\.U32)? r, RZ, RZ, ", "MOV r, ", ins)
                if ins not in SCHEDULING:
                    out[name][ins] += 1
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump") or "/usr/local/cuda/bin/cuobjdump"
    old, new = kernels(sys.argv[1], tool), kernels(sys.argv[2], tool)
    bad = 0
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a is None or b is None:
            print(f"only in {'new' if a is None else 'old'}: {k}")
            bad += 1
            continue
        gone, added = a - b, b - a
        if gone or added:
            bad += 1
            print(f"{k}: {sum(a.values())} -> {sum(b.values())} instructions; "
                  f"{sum(gone.values())} gone {list(gone.items())[:3]}, {sum(added.values())} added {list(added.items())[:3]}")
    total = len(set(old) | set(new))
    print(f"{total} kernels: {total - bad} with the same instructions, {bad} different")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
