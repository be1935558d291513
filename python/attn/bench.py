"""python -m attn.bench — the Python binding's cost, beside torch, in one run.

1. Per-call overhead at a tiny shape (B1 H1 N1 D8, f32): attn.attention from NumPy and from
   torch, and attn.torch.scaled_dot_product_attention, against the same attn::attention call
   timed in a C++ loop (attn._attn.time_cpp_call); the difference is the binding's overhead.
2. Forward + backward of attn.torch.scaled_dot_product_attention at B1 H8 N4096 D128 (f32 and
   bf16, causal by default) beside torch.nn.functional.scaled_dot_product_attention.

It measures and prints; it asserts nothing. FLOP convention (FlashAttention's): forward
4·B·H·Nq·Nk·D, backward 2.5× forward, halved when causal.

    python -m attn.bench                        # the full run (minutes on 2 cores)
    python -m attn.bench --n 1024 --reps 2      # smaller
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np


def _per_call(fn, calls):
    """(best, median) seconds of single calls: the best is the cost without interference from
    other work on the machine, the median what a loaded machine gives."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[0], times[len(times) // 2]


def overhead(calls: int, threads: int):
    import torch
    import torch.nn.functional as F

    import attn
    import attn.torch as at
    from attn import _attn

    q = np.random.default_rng(0).standard_normal((1, 1, 1, 8)).astype(np.float32)
    qt = torch.from_numpy(q)
    opts = {"num_threads": threads}
    inner = sorted(_attn.time_cpp_call(q, q, q, opts, 1) for _ in range(calls))  # timed inside C++
    cpp = (inner[0], inner[len(inner) // 2])
    rows = [("C++ attn::attention (timed in C++)", cpp)]
    rows.append(("attn._attn.attention (extension, no Python layer)",
                 _per_call(lambda: _attn.attention(q, q, q, opts, 0), calls)))
    rows.append(("attn.attention, NumPy", _per_call(lambda: attn.attention(q, q, q, num_threads=threads), calls)))
    rows.append(("attn.attention, torch", _per_call(lambda: attn.attention(qt, qt, qt, num_threads=threads), calls)))
    rows.append(("attn.torch.scaled_dot_product_attention", _per_call(
        lambda: at.scaled_dot_product_attention(qt, qt, qt, num_threads=threads), calls)))
    rows.append(("torch SDPA (peer)", _per_call(lambda: F.scaled_dot_product_attention(qt, qt, qt), calls)))
    print(f"\n### Per-call overhead, B1 H1 N1 D8 f32, {threads} threads, {calls} calls each\n")
    print("| call | best µs | median µs | best over the C++ call |")
    print("|---|---:|---:|---:|")
    for name, (best, med) in rows:
        over = "" if name.startswith("C++") or name.startswith("torch SDPA") else f"{(best - cpp[0]) * 1e6:.1f}"
        print(f"| {name} | {best * 1e6:.1f} | {med * 1e6:.1f} | {over} |")


def fwd_bwd(n: int, dtypes, reps: int, causal: bool, threads: int):
    import torch
    import torch.nn.functional as F

    import attn.torch as at

    B, H, D = 1, 8, 128
    flops = 4 * B * H * n * n * D * 3.5 * (0.5 if causal else 1.0)
    print(f"\n### Forward + backward, B{B} H{H} N{n} D{D}{' causal' if causal else ''}, {threads} threads\n")
    print("| dtype | implementation | ms (best of %d) | GFLOP/s |" % reps)
    print("|---|---|---:|---:|")
    for name in dtypes:
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[name]
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, H, n, D, generator=g).to(dt).requires_grad_() for _ in range(3))
        dout = torch.randn(B, H, n, D, generator=g).to(dt)
        impls = [("attn.torch SDPA", lambda: at.scaled_dot_product_attention(q, k, v, is_causal=causal, num_threads=threads)),
                 ("torch SDPA", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))]
        for label, f in impls:
            times = []
            for i in range(reps + 1):
                q.grad = k.grad = v.grad = None
                t0 = time.perf_counter()
                f().backward(dout)
                if i:  # the first is a warm-up
                    times.append(time.perf_counter() - t0)
            t = min(times)
            print(f"| {name} | {label} | {t * 1e3:.0f} | {flops / t / 1e9:.0f} |")


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m attn.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=4096, help="sequence length of the fwd+bwd shape")
    p.add_argument("--dtypes", default="f32,bf16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--calls", type=int, default=5000, help="calls timed for the overhead")
    p.add_argument("--no-causal", action="store_true")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--overhead-threads", type=int, default=1,
                   help="threads for the tiny-shape calls (1: no OpenMP wake-up in the figure)")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--skip-fwd-bwd", action="store_true")
    a = p.parse_args(argv)

    import torch

    import attn

    torch.set_num_threads(a.threads)
    print(f"attn {attn.__version__} · torch {torch.__version__} · {platform.processor() or platform.machine()} · "
          f"{os.cpu_count()} cpus · {a.threads} threads")
    if not a.skip_overhead:
        overhead(a.calls, a.overhead_threads)
    if not a.skip_fwd_bwd:
        fwd_bwd(a.n, a.dtypes.split(","), a.reps, not a.no_causal, a.threads)


if __name__ == "__main__":
    main()
