"""torch SDPA on the GPU at the shape attn_cuda_bench times, one line of JSON per backend that
runs: flash, cuDNN, memory-efficient (torch.nn.attention.sdpa_kernel), forward and backward,
median of CUDA-event timings. The peers of the cuda backend (docs/CUDA.md), run on the same
GPU in the same call.

  python bench/cuda_peers.py --batch 4 --heads 16 --n 4096 --d 128 --dtype bf16 [--causal]
  python bench/cuda_peers.py --batch 1 --heads 32 --kv-heads 8 --nq 1 --nk 32768 --forward-only

Forward is timed once per call like attn_cuda_bench (CUDA events around one call); the K/V read
rate is reported for decode shapes. GQA (--kv-heads) runs with enable_gqa=True.
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def median_ms(fn, reps, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--nq", type=int, default=None)
    p.add_argument("--nk", type=int, default=None)
    p.add_argument("--forward-only", action="store_true")
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--dtype", choices=["bf16", "f16"], default="bf16")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args()
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    hkv = a.kv_heads or a.heads
    nq, nk = a.nq or a.n, a.nk or a.n
    q = torch.randn((a.batch, a.heads, nq, a.d), device="cuda", dtype=dt, requires_grad=True)
    k, v = (torch.randn((a.batch, hkv, nk, a.d), device="cuda", dtype=dt, requires_grad=True) for _ in range(2))
    dout = torch.randn((a.batch, a.heads, nq, a.d), device="cuda", dtype=dt)
    flops = 4.0 * a.batch * a.heads * nq * nk * a.d * (0.5 if a.causal else 1.0)
    kv_bytes = 2.0 * a.batch * hkv * nk * a.d * 2
    gqa = {"enable_gqa": True} if hkv != a.heads else {}
    for name, be in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION)]:
        try:
            with sdpa_kernel(be):
                def run():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, **gqa)
                out = run()
                fwd = median_ms(run, a.reps, a.warmup)
                bwd = 0.0 if a.forward_only else median_ms(
                    lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), a.reps, a.warmup)
            print(json.dumps({"impl": f"torch_{name}", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "Nq": nq, "Nk": nk, "Hkv": hkv,
                              "fwd_ms": fwd, "fwd_tflops": flops / fwd * 1e-9, "fwd_kv_gbps": kv_bytes / fwd * 1e-6,
                              "bwd_ms": bwd, "bwd_tflops": 2.5 * flops / bwd * 1e-9 if bwd else 0.0}))
        except Exception as e:  # noqa: BLE001 — a backend this torch cannot run here is reported
            print(json.dumps({"impl": f"torch_{name}", "not_run": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}))


if __name__ == "__main__":
    main()
