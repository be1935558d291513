"""PyTorch eager peers of bench/family_fused_bench.cc: the same score x distribution pairs written
as a user would (the formula on the full score matrix; torch SDPA for softmax; the entmax
package for sparsemax and entmax15), float32, forward and forward+backward (autograd).

    python bench/family_fused_peers.py [B H N D threads reps]     (default 1 8 2048 64 2 5)

Prints one line per pair: median ms and GFLOP/s under the work convention of the C++ bench
(forward 4*B*H*N^2*D, forward+backward 3.5x that). Run by bench/family_fused_compare.sh,
alternating with the C++ bench.
"""
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from entmax import entmax15, sparsemax


def main():
    a = [int(x) for x in sys.argv[1:]]
    B, H, N, D, threads, reps = (a + [1, 8, 2048, 64, 2, 5][len(a):])[:6]
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(1)
    q, k, v, dout = (torch.randn(B, H, N, D, generator=g) for _ in range(4))
    scale = 1.0 / math.sqrt(D)
    bias = -math.log(N)

    def scores(q, k):
        return (q @ k.transpose(-1, -2)) * scale

    def topk_weights(s, kk=8):
        vals, idx = s.topk(kk, dim=-1)
        return torch.zeros_like(s).scatter(-1, idx, torch.softmax(vals, dim=-1))

    pairs = {
        "sigmoid": lambda q, k, v: torch.sigmoid(scores(q, k) + bias) @ v,
        "sparsemax": lambda q, k, v: sparsemax(scores(q, k), dim=-1) @ v,
        "entmax15": lambda q, k, v: entmax15(scores(q, k), dim=-1) @ v,
        "hardmax": lambda q, k, v: F.one_hot(scores(q, k).argmax(-1), N).to(v.dtype) @ v,
        "topk8": lambda q, k, v: topk_weights(scores(q, k)) @ v,
        "softmax (SDPA)": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=scale),
    }
    fwd = 4.0 * B * H * N * N * D
    runs = {}
    for name, f in pairs.items():
        def forward(f=f):
            with torch.no_grad():
                f(q, k, v)

        def both(f=f):
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            f(qq, kk, vv).backward(dout)

        runs[name + " fwd"] = (fwd, forward)
        runs[name + " fwd+bwd"] = (3.5 * fwd, both)
    times = {n: [] for n in runs}
    for _, f in runs.values():
        f()  # warm-up
    for _ in range(reps):
        for n, (_, f) in runs.items():
            t0 = time.perf_counter()
            f()
            times[n].append((time.perf_counter() - t0) * 1e3)
    print(f"PyTorch {torch.__version__} eager, B{B} H{H} N{N} D{D} f32, {threads} threads, {reps} reps alternating")
    for n, (flops, _) in runs.items():
        med = statistics.median(times[n])
        print(f"torch scaled_dot x {n:<28} {med:10.2f} ms {flops / med / 1e6:8.2f} GFLOP/s")


if __name__ == "__main__":
    main()
