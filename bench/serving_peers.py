"""Varlen prefill and paged decode through attn's Python package beside what a PyTorch user
would write instead, in one process and one run, contenders alternating round by round.

  python bench/serving_peers.py varlen --batch 16 --min 64 --max 4096 --hq 8 --d 64 --dtype bf16
  python bench/serving_peers.py paged --nk 16384 --page 16 --hq 32 --hkv 8 --d 128 --dtype bf16

varlen (causal, each sequence's queries = its keys):
  attn_varlen       attn.attention_varlen on the packed batch (no padding work)
  attn_padded       attn.attention on the batch padded to the longest, nonpad_kv_seqlen
  torch_padded      torch SDPA on the padded batch with a [B, 1, L, L] bool mask (causal ∧ valid)
  torch_loop        torch SDPA one sequence at a time (is_causal; no padding work)
  torch_nested      torch SDPA on a jagged nested tensor, where this torch runs it on the CPU
GFLOP/s counts useful work only: Σ_b 4·H·N_b²·D / 2.

paged (decode, one query per sequence):
  attn_paged        attn.attention_paged reading shuffled head-major pages in place
  attn_dense        attn.attention on the dense cache [B, Hkv, Nk, D]
  torch_gather      torch: gather the sequence's pages into a dense cache, then SDPA (GQA by
                    repeat_interleave) — what a PyTorch user does without a paged kernel
  torch_dense       torch SDPA on the dense cache (no gather)
GB/s counts the K/V bytes one step must read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

import attn

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_rounds(contenders, reps, warmup):
    """Median seconds of each contender; contenders alternate within every round."""
    for _ in range(warmup):
        for _, fn in contenders:
            fn()
    times = {name: [] for name, _ in contenders}
    for _ in range(reps):
        for name, fn in contenders:
            times[name].append(timed(fn))
    return {name: statistics.median(t) for name, t in times.items()}


def varlen(a):
    rng = np.random.default_rng(a.seed)
    lens = rng.integers(a.min, a.max + 1, a.batch).tolist()
    dt, H, D, L = DTYPES[a.dtype], a.hq, a.d, max(lens)
    total = sum(lens)
    q = torch.randn(total, H, D).to(dt)
    k = torch.randn(total, H, D).to(dt)
    v = torch.randn(total, H, D).to(dt)
    cu = torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int64)
    seqs = [(int(cu[b]), int(cu[b + 1])) for b in range(a.batch)]

    def pad(x):
        out = torch.zeros(a.batch, H, L, D, dtype=dt)
        for b, (s, e) in enumerate(seqs):
            out[b, :, : e - s] = x[s:e].transpose(0, 1)
        return out

    qp, kp, vp = pad(q), pad(k), pad(v)
    nonpad = torch.tensor(lens, dtype=torch.int64)
    valid = torch.arange(L).unsqueeze(0) < nonpad.unsqueeze(1)                 # [B, L]
    mask = torch.tril(torch.ones(L, L, dtype=torch.bool)) & valid[:, None, None, :]  # [B, 1, L, L]
    per = [(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1)) for s, e in seqs]
    contenders = [
        ("attn_varlen", lambda: attn.attention_varlen(q, k, v, cu, cu, L, L, is_causal=True,
                                                      alignment="bottom_right", num_threads=a.threads)),
        ("attn_padded", lambda: attn.attention(qp, kp, vp, is_causal=True, nonpad_kv_seqlen=nonpad,
                                               num_threads=a.threads)),
        ("torch_padded", lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask)),
        ("torch_loop", lambda: [F.scaled_dot_product_attention(x, y, z, is_causal=True) for x, y, z in per]),
    ]
    skipped = {}
    try:
        nq = torch.nested.nested_tensor([x[s:e] for x in (q,) for s, e in seqs], layout=torch.jagged)
        nk = torch.nested.nested_tensor([k[s:e] for s, e in seqs], layout=torch.jagged)
        nv = torch.nested.nested_tensor([v[s:e] for s, e in seqs], layout=torch.jagged)
        nested = lambda: F.scaled_dot_product_attention(nq.transpose(1, 2), nk.transpose(1, 2),
                                                        nv.transpose(1, 2), is_causal=True)
        nested()
        contenders.append(("torch_nested", nested))
    except Exception as e:  # noqa: BLE001 — reported, not hidden
        skipped["torch_nested"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"

    # The same answer from every contender before any timing.
    ref = attn.attention_varlen(q, k, v, cu, cu, L, L, is_causal=True, alignment="bottom_right")
    loop = torch.cat([F.scaled_dot_product_attention(x, y, z, is_causal=True).transpose(0, 1) for x, y, z in per])
    diff = (ref.float() - loop.float()).abs().max().item()

    med = run_rounds(contenders, a.reps, a.warmup)
    flops = sum(4 * H * n * n * D / 2 for n in lens)
    return {"mode": "varlen", "lengths": lens, "useful_gflop": flops / 1e9, "max_abs_diff_vs_torch_loop": diff,
            "results": {n: {"ms": t * 1e3, "gflops": flops / t / 1e9} for n, t in med.items()},
            "skipped": skipped}


def paged(a):
    rng = np.random.default_rng(a.seed)
    dt, B, Hq, Hkv, D, N, P = DTYPES[a.dtype], a.batch, a.hq, a.hkv, a.d, a.nk, a.page
    pages_per = N // P
    K = torch.randn(B, Hkv, N, D).to(dt)
    V = torch.randn(B, Hkv, N, D).to(dt)
    q = torch.randn(B, Hq, 1, D).to(dt)
    order = torch.from_numpy(rng.permutation(B * pages_per).reshape(B, pages_per).astype(np.int64))
    # Head-major pages [num_pages, Hkv, page, D] seen as [num_pages, page, Hkv, D] (attn reads strides).
    kp = torch.empty(B * pages_per, Hkv, P, D, dtype=dt)
    vp = torch.empty_like(kp)
    for b in range(B):
        kp[order[b]] = K[b].reshape(Hkv, pages_per, P, D).transpose(0, 1)
        vp[order[b]] = V[b].reshape(Hkv, pages_per, P, D).transpose(0, 1)
    kpv, vpv = kp.transpose(1, 2), vp.transpose(1, 2)
    lens = torch.full((B,), N, dtype=torch.int64)
    g = Hq // Hkv

    def torch_gather():
        kd = kp[order].transpose(1, 2).reshape(B, Hkv, N, D)  # [B, pages, Hkv, P, D] -> dense
        vd = vp[order].transpose(1, 2).reshape(B, Hkv, N, D)
        return F.scaled_dot_product_attention(q, kd.repeat_interleave(g, 1), vd.repeat_interleave(g, 1))

    Kr, Vr = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
    contenders = [
        ("attn_paged", lambda: attn.attention_paged(q, kpv, vpv, order, lens, num_threads=a.threads)),
        ("attn_dense", lambda: attn.attention(q, K, V, num_threads=a.threads)),
        ("torch_gather", torch_gather),
        ("torch_dense", lambda: F.scaled_dot_product_attention(q, Kr, Vr)),
    ]
    ref = attn.attention(q, K, V)
    diff = max((attn.attention_paged(q, kpv, vpv, order, lens).float() - ref.float()).abs().max().item(),
               (torch_gather().float() - ref.float()).abs().max().item())
    med = run_rounds(contenders, a.reps, a.warmup)
    kv_bytes = 2 * B * Hkv * N * D * K.element_size()
    return {"mode": "paged", "page": P, "nk": N, "kv_mib": kv_bytes / 2**20, "max_abs_diff": diff,
            "results": {n: {"ms": t * 1e3, "gbps": kv_bytes / t / 1e9} for n, t in med.items()}}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["varlen", "paged"])
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--min", type=int, default=64)
    p.add_argument("--max", type=int, default=4096)
    p.add_argument("--hq", type=int, default=None)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--d", type=int, default=None)
    p.add_argument("--nk", type=int, default=16384)
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.mode == "varlen":
        a.batch, a.hq, a.d = a.batch or 16, a.hq or 8, a.d or 64
    else:
        a.batch, a.hq, a.d = a.batch or 1, a.hq or 32, a.d or 128
    torch.set_num_threads(a.threads)
    r = varlen(a) if a.mode == "varlen" else paged(a)
    r.update({"dtype": a.dtype, "threads": a.threads, "reps": a.reps, "torch": torch.__version__,
              "attn": attn.__version__, "load_average": os.getloadavg()})
    print(json.dumps(r))
    unit = "gflops" if a.mode == "varlen" else "gbps"
    base = r["results"]["attn_" + ("varlen" if a.mode == "varlen" else "paged")]["ms"]
    for name, x in r["results"].items():
        print(f"  {name:14s} {x['ms']:10.2f} ms  {x[unit]:8.2f} {unit}  {x['ms'] / base:5.2f}x attn's time")
    for name, why in r.get("skipped", {}).items():
        print(f"  {name:14s} not run: {why}")


if __name__ == "__main__":
    main()
