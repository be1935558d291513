"""Sentences per second embedding 1,000 sentences with all-MiniLM-L6-v2: `attn embed` (f32 and
bf16 attention) beside sentence-transformers on PyTorch, in one run, alternating, batch 32,
2 threads; attn's --profile says where its time goes.

usage: python bench/embed_bench.py [ATTN_BINARY] [--rounds 3] [--sentences 1000]
(run with the venv of scripts/python-env.sh: ~/.cache/attn-venv/bin/python)
"""
import argparse
import os
import re
import subprocess
import sys
import time

import torch
from sentence_transformers import SentenceTransformer

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "python", "tests"))
import test_models  # noqa: E402  (the same sentence generator as the equality test)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("attn", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "build", "release",
                                                             "tools", "attn", "attn"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=1000, help="fewer for a quick look; figures use 1000")
    a = ap.parse_args()
    model = test_models.model_dir()
    lines = test_models.sentences(a.sentences)
    path = "/tmp/attn_embed_bench.txt"
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    torch.set_num_threads(2)
    st = SentenceTransformer(model, device="cpu")
    st.encode(lines[:64], batch_size=32)  # warm-up
    results = {"attn f32": [], "attn bf16": [], "sentence-transformers f32": []}
    profile = {}
    for _ in range(a.rounds):
        for name, extra in (("attn f32", []), ("attn bf16", ["--dtype", "bf16"])):
            r = subprocess.run([a.attn, "embed", "--model", model, "--input", path, "--out", "/tmp/attn_embed_bench.npy",
                                "--batch", "32", "--threads", "2", "--profile", *extra],
                               check=True, capture_output=True, text=True)
            results[name].append(float(re.search(r"\(([0-9.]+) sentences/s\)", r.stdout).group(1)))
            profile[name] = r.stdout.strip().splitlines()[-1]
        t0 = time.perf_counter()
        st.encode(lines, batch_size=32)
        results["sentence-transformers f32"].append(len(lines) / (time.perf_counter() - t0))
    base = sorted(results["sentence-transformers f32"])[len(results["sentence-transformers f32"]) // 2]
    print(f"{len(lines)} sentences, batch 32, 2 threads, {a.rounds} rounds (median); torch {torch.__version__}")
    print(f"{'implementation':28s} {'sentences/s':>12s} {'vs torch':>9s}")
    for name, v in results.items():
        m = sorted(v)[len(v) // 2]
        print(f"{name:28s} {m:12.1f} {m / base:8.2f}x")
    for name, p in profile.items():
        print(f"{name} {p}")


if __name__ == "__main__":
    main()
