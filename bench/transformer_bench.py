"""Training tokens/s of the example Transformer (examples/transformer_sort.cc: a pre-norm
encoder-decoder, E 64, 4 heads, FFN 256 ReLU, batch 64 strings of 8 digits, AdamW, gradient
clipping, warmup-cosine schedule) beside the same model in PyTorch, in one run, alternating
rounds, 2 threads each. PyTorch's decoder self-attention has no rotary embedding (attn's has);
everything else is the same computation, data generation included in both timings.

usage: python bench/transformer_bench.py [EXAMPLE_BINARY] [--steps 200] [--rounds 3]
(run with the venv of scripts/python-env.sh: ~/.cache/attn-venv/bin/python). The OpenMP
environment (OMP_WAIT_POLICY, ...) is passed to both as it is: say it with the figures.
"""
import argparse
import math
import os
import re
import subprocess
import time

import torch
from torch import nn

V, BOS, N, E, B, HEADS, FF = 10, 10, 8, 64, 64, 4, 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.src_emb, self.tgt_emb = nn.Embedding(V, E), nn.Embedding(V + 1, E)
        kw = dict(dim_feedforward=FF, dropout=0.0, activation="relu", batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoderLayer(E, HEADS, **kw)
        self.dec = nn.TransformerDecoderLayer(E, HEADS, **kw)
        self.final_norm, self.head = nn.LayerNorm(E), nn.Linear(E, V)
        self.causal = nn.Transformer.generate_square_subsequent_mask(N)

    def forward(self, src, tgt_in):
        memory = self.enc(self.src_emb(src))
        d = self.dec(self.tgt_emb(tgt_in), memory, tgt_mask=self.causal, tgt_is_causal=True)
        return self.head(self.final_norm(d))


def warmup_cosine(step, warmup, total, peak, floor):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * t))


def torch_tokens_per_s(steps):
    torch.manual_seed(1)
    m = Model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
    t0 = time.perf_counter()
    for step in range(steps):
        src = torch.randint(0, V, (B, N))
        tgt = src.sort(dim=1).values
        tgt_in = torch.cat([torch.full((B, 1), BOS), tgt[:, :-1]], dim=1)
        loss = nn.functional.cross_entropy(m(src, tgt_in).reshape(-1, V), tgt.reshape(-1))
        opt.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        for g in opt.param_groups:
            g["lr"] = warmup_cosine(step, 100, steps, 2e-3, 1e-4)
        opt.step()
    return steps * B * N / (time.perf_counter() - t0)


def attn_tokens_per_s(binary, steps):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    r = subprocess.run([binary, str(steps), "0", "/tmp"], check=True, capture_output=True, text=True, env=env)
    return float(re.findall(r"([0-9.]+) tokens/s", r.stdout)[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "build", "release",
                                                               "examples", "example_transformer_sort"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(2)
    torch_tokens_per_s(5)  # warm-up
    res = {"attn (example_transformer_sort)": [], "torch (same model)": []}
    for _ in range(a.rounds):
        res["attn (example_transformer_sort)"].append(attn_tokens_per_s(a.binary, a.steps))
        res["torch (same model)"].append(torch_tokens_per_s(a.steps))
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    base = med["torch (same model)"]
    print(f"training B {B} N {N} E {E} H {HEADS} FFN {FF}, {a.steps} steps, 2 threads, {a.rounds} rounds (median); "
          f"torch {torch.__version__}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}")
    for k, v in med.items():
        print(f"{k:32s} {v:10.1f} tokens/s {v / base:6.2f}x   rounds: {' '.join(f'{x:.0f}' for x in res[k])}")


if __name__ == "__main__":
    main()
