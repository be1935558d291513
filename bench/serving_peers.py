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
  attn_dense_int8   attn.attention_paged on an int8 cache quantised from the same K, V by
                    attn.paged_kv_append (one scale per token and head), one page per sequence
                    (the dense buffer, block_table [[b]])
  ggml_f16          ggml_flash_attn_ext (ggml-python, ggml's CPU kernel, what llama.cpp runs) on
                    an F16 cache of the same K, V; q in f32, GQA by ggml's broadcast, F32 precision
  ggml_q8_0         the same on a Q8_0 cache (llama.cpp's --cache-type-k/v q8_0), quantised from
                    the same K, V by ggml_quantize_chunk
                    (the ggml graph is built once and holds only the attention node; a missing
                    ggml-python prints "ggml: not run (<reason>)" and the rest runs)
GB/s counts the K/V bytes one step must read, in each contender's own cache type (bf16: 2 bytes
a value; int8: 1 byte a value + a float32 scale per token and head; f16: 2; q8_0: 34 bytes per
32 values). max_abs_diff_vs_f32 compares each contender's output with attn.attention in float32
on the same (bf16-rounded) q, K, V; out_max_abs is that output's largest magnitude.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
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


def ggml_decode(q, K, V, kind, threads):
    """ggml_flash_attn_ext on a K/V cache of ggml type `kind` ("f16" or "q8_0") holding K, V.

    ggml dims are innermost first: q [D, Nq, Hq, B] f32 (ggml's flash attention takes f32 q),
    k/v [D, Nk, Hkv, B] — the memory of attn's [B, H, N, D]; GQA by ggml's broadcast (q head h
    reads kv head h // (Hq / Hkv), as repeat_interleave), no mask, scale 1/sqrt(D), F32
    precision. The graph is built once and holds only the attention node. Returns
    (compute, output, free, detail): compute() runs the graph on `threads` threads, output()
    reads the result back as float32 [B, Hq, Nq, D].
    """
    import ggml  # noqa: PLC0415 - optional (bench/setup_venv.sh); the caller reports its absence

    B, Hq, Nq, D = q.shape
    _, Hkv, Nk, Dv = V.shape
    gtype = {"f16": ggml.GGML_TYPE_F16, "q8_0": ggml.GGML_TYPE_Q8_0}[kind]
    ggml.ggml_cpu_init()  # ggml's f16 tables (idempotent)
    kv_rows = Nk * Hkv * B
    tensor_bytes = (4 * q.numel() + kv_rows * (ggml.ggml_row_size(gtype, D) + ggml.ggml_row_size(gtype, Dv))
                    + 4 * B * Hq * Nq * Dv)
    mem = tensor_bytes + 16 * ggml.ggml_tensor_overhead() + ggml.ggml_graph_overhead() + (1 << 20)
    ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
    if not ctx:
        raise RuntimeError("ggml_init failed")
    try:
        gq = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, D, Nq, Hq, B)
        gk = ggml.ggml_new_tensor_4d(ctx, gtype, D, Nk, Hkv, B)
        gv = ggml.ggml_new_tensor_4d(ctx, gtype, Dv, Nk, Hkv, B)

        def fill(t, x):
            x = np.ascontiguousarray(x.float().numpy())  # the same (bf16-rounded) values as attn's
            if kind == "f16" and t is not gq:
                raw = x.astype(np.float16)
            elif t is not gq:  # q8_0: ggml's own quantiser, rows of the innermost dim
                n = ggml.ggml_quantize_chunk(gtype, x.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                             ggml.ggml_get_data(t), 0, x.size // x.shape[-1], x.shape[-1], None)
                assert n == ggml.ggml_nbytes(t), (n, ggml.ggml_nbytes(t))
                return
            else:
                raw = x
            assert raw.nbytes == ggml.ggml_nbytes(t)
            ctypes.memmove(ggml.ggml_get_data(t), raw.ctypes.data, raw.nbytes)

        fill(gq, q)
        fill(gk, K)
        fill(gv, V)
        out = ggml.ggml_flash_attn_ext(ctx, gq, gk, gv, None, 1.0 / math.sqrt(D), 0.0, 0.0)
        ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
        gf = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(gf, out)
        plan = ggml.ggml_graph_plan(gf, threads, None)
        work = (ctypes.c_uint8 * max(1, plan.work_size))()
        plan.work_data = ctypes.cast(work, ctypes.POINTER(ctypes.c_uint8))
    except BaseException:
        ggml.ggml_free(ctx)
        raise

    def compute():
        work  # noqa: B018 - the work buffer lives as long as this closure
        ggml.ggml_graph_compute(gf, ctypes.byref(plan))

    def output():  # ggml's result is [Dv, Hq, Nq, B] innermost first: numpy [B, Nq, Hq, Dv]
        n = B * Nq * Hq * Dv
        o = np.frombuffer((ctypes.c_float * n).from_address(ggml.ggml_get_data(out)), np.float32)
        return torch.from_numpy(o.reshape(B, Nq, Hq, Dv).transpose(0, 2, 1, 3).copy())

    try:
        from importlib.metadata import version  # noqa: PLC0415

        v = version("ggml-python")
    except Exception:  # noqa: BLE001
        v = "?"
    return compute, output, lambda: ggml.ggml_free(ctx), f"ggml-python {v}, K/V {kind.upper()}, Q F32, prec F32"


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

    # int8 cache, one page per sequence: the dense head-major buffer [B, Hkv, N, D] seen as pages
    # [B, N, Hkv, D] (scales [B, Hkv, N] as [B, N, Hkv]), quantised from K, V by paged_kv_append.
    k8 = np.zeros((B, Hkv, N, D), np.int8)
    v8 = np.zeros_like(k8)
    ks = np.zeros((B, Hkv, N), np.float32)
    vs = np.zeros_like(ks)
    k8v, v8v, ksv, vsv = k8.transpose(0, 2, 1, 3), v8.transpose(0, 2, 1, 3), ks.transpose(0, 2, 1), vs.transpose(0, 2, 1)
    table8 = torch.arange(B, dtype=torch.int64).reshape(B, 1)
    attn.paged_kv_append(k8v, v8v, table8, torch.zeros(B, dtype=torch.int64), K, V, k_scales=ksv, v_scales=vsv)

    def attn_dense_int8(threads=a.threads):
        return attn.attention_paged(q, k8v, v8v, table8, lens, k_scales=ksv, v_scales=vsv, num_threads=threads)

    Kr, Vr = K.repeat_interleave(g, 1), V.repeat_interleave(g, 1)
    contenders = [
        ("attn_paged", lambda: attn.attention_paged(q, kpv, vpv, order, lens, num_threads=a.threads)),
        ("attn_dense", lambda: attn.attention(q, K, V, num_threads=a.threads)),
        ("attn_dense_int8", attn_dense_int8),
        ("torch_gather", torch_gather),
        ("torch_dense", lambda: F.scaled_dot_product_attention(q, Kr, Vr)),
    ]
    values = 2 * B * Hkv * N * D
    kv_bytes = {n: values * K.element_size() for n, _ in contenders}
    kv_bytes["attn_dense_int8"] = values + 2 * B * Hkv * N * 4
    outputs = {"attn_paged": lambda: attn.attention_paged(q, kpv, vpv, order, lens),
               "attn_dense": lambda: attn.attention(q, K, V), "attn_dense_int8": attn_dense_int8,
               "torch_gather": torch_gather, "torch_dense": lambda: F.scaled_dot_product_attention(q, Kr, Vr)}

    skipped, frees, details = {}, [], {}
    for kind, per_value in (("f16", 2.0), ("q8_0", 34 / 32)):
        name = "ggml_" + kind
        try:
            compute, output, free, details[name] = ggml_decode(q, K, V, kind, a.threads)
        except Exception as e:  # noqa: BLE001 — reported, not hidden
            skipped[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            continue
        frees.append(free)
        contenders.append((name, compute))
        outputs[name] = lambda compute=compute, output=output: (compute(), output())[1]
        kv_bytes[name] = values * per_value

    ref = attn.attention(q, K, V)
    diff = max((attn.attention_paged(q, kpv, vpv, order, lens).float() - ref.float()).abs().max().item(),
               (torch_gather().float() - ref.float()).abs().max().item())
    ref32 = attn.attention(q.float(), K.float(), V.float())
    diffs = {n: (f().float() - ref32).abs().max().item() for n, f in outputs.items()}
    try:
        med = run_rounds(contenders, a.reps, a.warmup)
    finally:
        for free in frees:
            free()
    return {"mode": "paged", "page": P, "nk": N, "kv_mib": kv_bytes["attn_paged"] / 2**20, "max_abs_diff": diff,
            "max_abs_diff_vs_f32": diffs, "out_max_abs": ref32.abs().max().item(),
            "results": {n: {"ms": t * 1e3, "gbps": kv_bytes[n] / t / 1e9, "kv_mib": kv_bytes[n] / 2**20}
                        for n, t in med.items()},
            "ggml": details, "skipped": skipped}


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
        print(f"  {name:15s} {x['ms']:10.2f} ms  {x[unit]:8.2f} {unit}  {x['ms'] / base:5.2f}x attn's time")
    for name, why in r.get("skipped", {}).items():
        print(f"  {name:15s} {'ggml: ' if name.startswith('ggml_') else ''}not run ({why})")


if __name__ == "__main__":
    main()
