"""`attn embed` against sentence-transformers running the same model folder in PyTorch.

For >= 500 varied sentences: cosine similarity >= 0.99999 and max |difference| <= 1e-5 in f32;
bf16 attention within the stated bound (cosine >= 0.999, max |difference| <= 1e-2); batched
(batch 32) and one-at-a-time (batch 1) give the same vectors (max |difference| <= 1e-6).

usage: embed_check.py ATTN_BINARY MODEL_DIR WORK_DIR
"""
import os
import subprocess
import sys

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

import tokenizer_corpus

TOPICS = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
          "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
          "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums.",
          "Someone in a gorilla costume is playing a set of drums.", "Attention is all you need.",
          "Der schnelle braune Fuchs springt über den faulen Hund.", "Le café est très chaud ce matin.",
          "東京は日本の首都です。", "¿Dónde está la biblioteca?", "Naïve résumé of a coöperative façade.",
          "GPU kernels beat CPU kernels at large batch sizes, but not always.", "",
          "email me at user@example.com or visit https://example.org/a?b=c", "3.14159 is approximately pi; e = 2.71828.",
          "🙂 emoji and ✨ symbols — with dashes – and “quotes”."]


def sentences(rng_seed=5):
    import random
    rng = random.Random(rng_seed)
    out = list(TOPICS)
    words = " ".join(TOPICS).split()
    while len(out) < 560:
        k = rng.random()
        if k < 0.1:  # long: truncated at 256 tokens
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(200, 400))))
        elif k < 0.2:
            out.append(tokenizer_corpus.line(rng)[:300].replace("\n", " ").replace("\r", " "))
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))))
    return out


def run_attn(attn, model, work, lines, name, *extra):
    inp = os.path.join(work, "sentences.txt")
    with open(inp, "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(lines) + "\n")
    out = os.path.join(work, name + ".npy")
    subprocess.run([attn, "embed", "--model", model, "--input", inp, "--out", out, *extra], check=True)
    return np.load(out)


def main(attn, model, work):
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(2)
    lines = sentences()
    # str.splitlines-safe: the file has one sentence per '\n' line and no other line breaks.
    lines = [l.replace("\r", " ").replace("\x0b", " ").replace("\x0c", " ").replace("\x1c", " ").replace("\x1d", " ")
             .replace("\x1e", " ").replace("\x85", " ").replace("\u2028", " ").replace("\u2029", " ") for l in lines]
    st = SentenceTransformer(model, device="cpu")
    want = st.encode(lines, batch_size=32, convert_to_numpy=True, normalize_embeddings=False).astype(np.float64)
    failures = 0

    def check(name, got, cos_min, diff_max):
        nonlocal failures
        got = got.astype(np.float64)
        assert got.shape == want.shape, f"{name}: shape {got.shape} vs {want.shape}"
        cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        diff = np.abs(got - want).max(axis=1)
        bad = np.where((cos < cos_min) | (diff > diff_max))[0]
        print(f"{name}: {len(lines)} sentences, min cosine {cos.min():.8f}, max |diff| {diff.max():.2e} "
              f"(bounds {cos_min}, {diff_max}): {len(lines) - len(bad)} passed, {len(bad)} failed")
        for i in bad[:5]:
            print(f"  sentence {i}: cosine {cos[i]:.8f} max diff {diff[i]:.2e}: {lines[i][:80]!r}")
        failures += len(bad)

    f32 = run_attn(attn, model, work, lines, "f32", "--batch", "32", "--threads", "2")
    check("f32", f32, 0.99999, 1e-5)
    one = run_attn(attn, model, work, lines[:64], "f32_batch1", "--batch", "1", "--threads", "2")
    d = np.abs(one - f32[:64]).max()
    print(f"batch 1 vs batch 32: max |diff| {d:.2e} (bound 1e-6)")
    failures += int(d > 1e-6)
    bf16 = run_attn(attn, model, work, lines, "bf16", "--batch", "32", "--threads", "2", "--dtype", "bf16")
    check("bf16 attention", bf16, 0.999, 1e-2)
    print(f"{'FAILED' if failures else 'OK'}: {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
