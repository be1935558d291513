#!/usr/bin/env python3
"""bench/peers.py — the Python peers of `attn bench`, run by it in the benchmark venv
(bench/setup_venv.sh). Not part of the attn library.

  torch_sdpa           torch.nn.functional.scaled_dot_product_attention, forward and backward
  ggml_flash_attn_ext  ggml's fused CPU attention through ggml-python, forward only (ggml has
                       no backward for it)
  ort_attention        ONNX Runtime's CPU kernel of the ONNX `Attention` operator (opset 23), a
                       one-node model run by an InferenceSession, forward only (inference);
                       f32 and f16 (ONNX Runtime has no bf16 CPU kernel for it)
  torch_mha            torch.nn.MultiheadAttention (batch_first, biases) forward + backward
                       into x, for `attn bench --layer mha`: the configuration's B, Hq, Nq, D
                       are the layer's B, heads, N and head size (E = Hq·D)
  torch_eager          `attn bench --score S --distribution D`: the same score × distribution
                       written in PyTorch eager, as a user would (SDPA for dot/scaled_dot with
                       softmax; the entmax package's sparsemax / entmax15; additive in chunks
                       of queries so that Nq × Nk × A never lives at once); pass "backward"
                       times forward + backward (autograd into q, k, v and the parameters)

Protocol (`attn bench` is the other end; replies are tab-separated lines closed by "done"):
  start:    "peer\t<impl>\t<version>" or "skip\t<impl>\t<why>" per peer, then "ready"
  prepare B Hq Hkv Nq Nk D Dv causal dtype pass threads warmup [family key=value ...]
            -> "ready\t<impl>\t<detail>" or "skip\t<impl>\t<why>" per peer (warm-up calls done)
            (the family fields — score, dist, A, scale, temperature, bandwidth, form, activation,
            sigmoid_bias, topk — configure torch_eager; the other peers skip such a call)
  rep       -> "time\t<impl>\t<ms>" per ready peer: one timed call each
  release   -> frees the configuration's tensors
attn bench alternates single calls of attn, its OpenBLAS baseline and these peers, and takes
the medians. Layouts are attn's: q [B, Hq, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv];
causal is top-left aligned.
"""
import argparse
import ctypes
import gc
import math
import sys
import time


def say(*fields):
    print("\t".join(str(f).replace("\t", " ").replace("\n", " ") for f in fields), flush=True)


class Config:
    def __init__(self, fields):
        f = fields
        self.B, self.Hq, self.Hkv, self.Nq, self.Nk, self.D, self.Dv = map(int, f[:7])
        self.causal = f[7] == "1"
        self.dtype = f[8]
        self.backward = f[9] == "backward"
        self.threads, self.warmup = map(int, f[10:12])
        self.family = None
        if len(f) > 12 and f[12] == "family":
            self.family = dict(x.split("=", 1) for x in f[13:])


# ---- PyTorch ----------------------------------------------------------------------------------

class TorchPeer:
    impl = "torch_sdpa"

    def __init__(self):
        import torch  # noqa: PLC0415 - optional
        import torch.nn.functional as F  # noqa: PLC0415

        self.torch, self.F = torch, F
        info = [l for l in torch.__config__.parallel_info().splitlines() if "parallel backend" in l]
        backend = info[0].split(":", 1)[1].strip() if info else "?"
        try:
            cap = torch.backends.cpu.get_cpu_capability()
        except Exception:  # noqa: BLE001 - older torch
            cap = "?"
        self.version = f"torch {torch.__version__} (CPU {cap}, {backend})"
        self.has_gqa = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")

    def kernel_name(self, q, k, v, causal, gqa):
        """Which SDPA backend torch picks on this input (flash/math), where torch can tell."""
        torch = self.torch
        try:
            from torch.nn.attention import SDPBackend  # noqa: PLC0415

            kw = {"scale": None, "enable_gqa": gqa} if self.has_gqa else {}
            return SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, causal, **kw)).name.lower()
        except Exception:  # noqa: BLE001 - private API, informative only
            return "?"

    def prepare(self, c):
        """(call, detail, cleanup) for one configuration, or (None, why, None)."""
        if c.family is not None:
            return None, "a family configuration (torch_eager times it)", None
        torch, F = self.torch, self.F
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[c.dtype]
        torch.set_num_threads(c.threads)
        g = torch.Generator().manual_seed(1)
        q = torch.rand(c.B, c.Hq, c.Nq, c.D, generator=g).mul_(2).sub_(1).to(dt)
        k = torch.rand(c.B, c.Hkv, c.Nk, c.D, generator=g).mul_(2).sub_(1).to(dt)
        v = torch.rand(c.B, c.Hkv, c.Nk, c.Dv, generator=g).mul_(2).sub_(1).to(dt)
        gqa = c.Hq != c.Hkv
        kw = {"is_causal": c.causal}
        note = ""
        if gqa and self.has_gqa:
            kw["enable_gqa"] = True
        elif gqa:  # old torch: repeat the key/value heads outside the timed region
            k = k.repeat_interleave(c.Hq // c.Hkv, dim=1)
            v = v.repeat_interleave(c.Hq // c.Hkv, dim=1)
            note = ", K/V heads repeated before timing"
        kernel = self.kernel_name(q, k, v, c.causal, gqa and self.has_gqa)
        detail = f"{self.version}, sdpa backend {kernel}{note}"
        if not c.backward:
            def forward():
                with torch.inference_mode():
                    F.scaled_dot_product_attention(q, k, v, **kw)
            return forward, detail, None
        for t in (q, k, v):
            t.requires_grad_(True)
        out = F.scaled_dot_product_attention(q, k, v, **kw)
        dout = torch.rand(out.shape, generator=g).mul_(2).sub_(1).to(dt)
        return (lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)), detail, None


class TorchMhaPeer:
    impl = "torch_mha"

    def __init__(self):
        import torch  # noqa: PLC0415 - optional

        self.torch = torch
        self.version = TorchPeer().version

    def prepare(self, c):
        torch = self.torch
        torch.set_num_threads(c.threads)
        torch.manual_seed(1)
        E = c.Hq * c.D
        mha = torch.nn.MultiheadAttention(E, c.Hq, batch_first=True)
        x = torch.rand(c.B, c.Nq, E).mul_(2).sub_(1).requires_grad_(True)
        dy = torch.rand(c.B, c.Nq, E).mul_(2).sub_(1)

        def call():
            y, _ = mha(x, x, x, need_weights=False)
            y.backward(dy)
            x.grad = None
            mha.zero_grad(set_to_none=False)
        return call, f"{self.version}, nn.MultiheadAttention E {E} H {c.Hq}", None


class TorchEagerFamilyPeer:
    """One score × distribution of attn's family in PyTorch eager (include/attn/family.h has
    the formulas). Parameters are drawn here (values do not matter for timing)."""
    impl = "torch_eager"

    def __init__(self):
        import torch  # noqa: PLC0415 - optional

        self.torch = torch
        self.version = TorchPeer().version
        try:
            import entmax  # noqa: PLC0415 - optional

            self.entmax = entmax
            from importlib.metadata import version  # noqa: PLC0415

            self.entmax_version = f"entmax {version('entmax')}"
        except Exception:  # noqa: BLE001
            self.entmax, self.entmax_version = None, "entmax missing"

    def prepare(self, c):
        if c.family is None:
            return None, "not a family configuration", None
        torch = self.torch
        fam = c.family
        score, dist = fam["score"], fam["dist"]
        if dist in ("sparsemax", "entmax15") and self.entmax is None:
            return None, self.entmax_version, None
        dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[c.dtype]
        torch.set_num_threads(c.threads)
        g = torch.Generator().manual_seed(1)

        def rnd(*shape):
            return torch.rand(*shape, generator=g).mul_(2).sub_(1).to(dt)

        q, k, v = rnd(c.B, c.Hq, c.Nq, c.D), rnd(c.B, c.Hkv, c.Nk, c.D), rnd(c.B, c.Hkv, c.Nk, c.Dv)
        A = int(fam.get("A", 64))
        multi = score == "additive" and fam.get("multi_dim") == "1"  # w_v [Dv, A]: scores [.., n, Nk, Dv]
        params = {}
        if score in ("general", "biased_general", "activated_general"):
            params["W"] = rnd(c.D, c.D)
            if score == "biased_general":
                params["b"] = rnd(c.D)
            if score == "activated_general":
                params["b"] = rnd(1)
        if score == "additive":
            params.update(W_q=rnd(A, c.D), W_k=rnd(A, c.D), b=rnd(A), w_v=rnd(c.Dv, A) if multi else rnd(A))
        if score == "location":
            params["W_a"] = rnd(c.Nk, c.D)
        leaves = [q, k, v, *params.values()]
        if c.backward:
            for t in leaves:
                t.requires_grad_(True)
        dout = rnd(c.B, c.Hq, c.Nq, c.Dv)
        group = c.Hq // c.Hkv
        scale = float(fam["scale"]) if "scale" in fam else 1.0 / math.sqrt(c.D)
        tau = float(fam.get("temperature", 1.0))
        h = float(fam.get("bandwidth", 1.0))
        gcoef = 1.0 / h if fam.get("form") == "width" else 1.0 / (2 * h * h)
        act = {"tanh": torch.tanh, "relu": torch.relu, "sigmoid": torch.sigmoid}[fam.get("activation", "tanh")]
        sig_b = float(fam["sigmoid_bias"]) if "sigmoid_bias" in fam else -math.log(max(c.Nk, 1))
        topk = min(int(fam.get("topk", 1)), c.Nk)
        sdpa = score in ("dot", "scaled_dot") and dist == "softmax"
        chunk = 64 if score == "additive" else c.Nq  # queries per step: Nq × Nk × A stays small

        def heads(x):  # GQA: the key/value heads repeated to Hq (what eager code does)
            return x if group == 1 else x.repeat_interleave(group, dim=1)

        def scores(qc, K, rows):
            if score in ("dot", "scaled_dot"):
                s = qc @ K.transpose(-1, -2)
                return s * scale if score == "scaled_dot" else s
            if score == "general":
                return (qc @ params["W"]) @ K.transpose(-1, -2)
            if score == "biased_general":
                return (qc @ params["W"] + params["b"]) @ K.transpose(-1, -2)
            if score == "activated_general":
                return act((qc @ params["W"]) @ K.transpose(-1, -2) + params["b"])
            if score == "additive":
                wq = qc @ params["W_q"].T                       # [B, H, n, A]
                wk = K @ params["W_k"].T + params["b"]          # [B, H, Nk, A]
                t = torch.tanh(wq.unsqueeze(-2) + wk.unsqueeze(-3))  # [B, H, n, Nk, A]
                return t @ params["w_v"].T if multi else t @ params["w_v"]
            if score == "cosine":
                qn = torch.nn.functional.normalize(qc, dim=-1)
                kn = torch.nn.functional.normalize(K, dim=-1)
                return qn @ kn.transpose(-1, -2) / tau
            if score == "location":
                return qc @ params["W_a"].T
            d2 = ((qc * qc).sum(-1, keepdim=True) - 2 * qc @ K.transpose(-1, -2)
                  + (K * K).sum(-1).unsqueeze(-2)).clamp_min(0)
            if score == "gaussian":
                return -gcoef * d2
            if score == "box":
                return (d2 <= h * h).to(qc.dtype)
            if score == "triangle":
                return (1 - d2.sqrt() / h).clamp_min(0)
            raise ValueError(f"score {score}")

        def weights(s, rows):
            if c.causal:
                keep = torch.arange(c.Nk)[None, :] <= rows[:, None]
                if multi:  # s is [B, H, n, Dv, Nk]
                    keep = keep[:, None, :]
                if dist == "identity" or (dist == "kernel" and score != "gaussian"):
                    s = s * keep
                else:
                    s = s.masked_fill(~keep, float("-inf"))
            if dist == "softmax" or (dist == "kernel" and score == "gaussian"):
                return torch.softmax(s, dim=-1)
            if dist == "sigmoid":
                return torch.sigmoid(s + sig_b)
            if dist == "sparsemax":
                return self.entmax.sparsemax(s, dim=-1)
            if dist == "entmax15":
                return self.entmax.entmax15(s, dim=-1)
            if dist == "hardmax":
                return torch.nn.functional.one_hot(s.argmax(-1), c.Nk).to(s.dtype)
            if dist == "topk":
                val, idx = s.topk(topk, dim=-1)
                return torch.zeros_like(s).scatter(-1, idx, torch.softmax(val, dim=-1))
            if dist == "kernel":
                tot = s.sum(-1, keepdim=True)
                return torch.where(tot > 0, s / tot.clamp_min(1e-30), torch.zeros_like(s))
            if dist == "identity":
                return s
            raise ValueError(f"distribution {dist}")

        def run(backward):
            K, V = heads(k), heads(v)
            outs = []
            for i0 in range(0, c.Nq, chunk):
                qc = q[:, :, i0:i0 + chunk]
                if sdpa:
                    o = torch.nn.functional.scaled_dot_product_attention(
                        qc, K, V, is_causal=c.causal, scale=scale if score == "scaled_dot" else 1.0)
                else:
                    rows = torch.arange(i0, min(i0 + chunk, c.Nq))
                    if multi:  # α [B, H, n, Dv, Nk] over keys per feature; out[c] = Σ_j α[c, j] v_j[c]
                        o = torch.einsum("bhicj,bhjc->bhic", weights(scores(qc, K, rows).movedim(-1, -2), rows), V)
                    else:
                        o = weights(scores(qc, K, rows), rows) @ V
                if backward:  # per chunk: the graph of one chunk at a time (sums of gradients)
                    o.backward(dout[:, :, i0:i0 + chunk], retain_graph=i0 + chunk < c.Nq)
                else:
                    outs.append(o)
            return outs

        def forward():
            with torch.inference_mode():
                run(False)

        def forward_backward():
            for t in leaves:
                t.grad = None
            run(True)

        what = ("sdpa" if sdpa else f"eager {score} x {dist}"
                + (f", {self.entmax_version}" if dist in ("sparsemax", "entmax15") else "")
                + (f", chunks of {chunk} queries" if chunk < c.Nq else ""))
        return (forward_backward if c.backward else forward), f"{self.version}, {what}", None


# ---- ggml -------------------------------------------------------------------------------------

class GgmlPeer:
    impl = "ggml_flash_attn_ext"

    def __init__(self):
        import ggml  # noqa: PLC0415 - optional
        import numpy as np  # noqa: PLC0415

        self.ggml, self.np = ggml, np
        try:
            from importlib.metadata import version  # noqa: PLC0415

            v = version("ggml-python")
        except Exception:  # noqa: BLE001
            v = "?"
        self.version = f"ggml-python {v}"

    def prepare(self, c):
        if c.family is not None:
            return None, "a family configuration (torch_eager times it)", None
        if c.backward:
            return None, "ggml has no backward for flash_attn_ext", None
        ggml, np = self.ggml, self.np
        kv_type = {"f32": ggml.GGML_TYPE_F32, "f16": ggml.GGML_TYPE_F16, "bf16": ggml.GGML_TYPE_BF16}[c.dtype]
        esize = 4 if c.dtype == "f32" else 2
        tensor_bytes = (4 * c.B * c.Hq * c.Nq * c.D + esize * c.B * c.Hkv * c.Nk * (c.D + c.Dv)
                        + 2 * c.Nk * c.Nq + 4 * c.B * c.Hq * c.Nq * c.Dv)
        mem = tensor_bytes + 16 * ggml.ggml_tensor_overhead() + ggml.ggml_graph_overhead() + (1 << 20)
        ctx = ggml.ggml_init(ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False))
        if not ctx:
            return None, "ggml_init failed", None
        try:
            # ggml dims are innermost first: q [D, Nq, Hq, B], k [D, Nk, Hkv, B], v [Dv, Nk, Hkv, B].
            q = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F32, c.D, c.Nq, c.Hq, c.B)
            k = ggml.ggml_new_tensor_4d(ctx, kv_type, c.D, c.Nk, c.Hkv, c.B)
            v = ggml.ggml_new_tensor_4d(ctx, kv_type, c.Dv, c.Nk, c.Hkv, c.B)
            rng = np.random.default_rng(1)
            self.fill(q, rng.uniform(-1, 1, c.B * c.Hq * c.Nq * c.D).astype(np.float32), "f32")
            self.fill(k, rng.uniform(-1, 1, c.B * c.Hkv * c.Nk * c.D).astype(np.float32), c.dtype)
            self.fill(v, rng.uniform(-1, 1, c.B * c.Hkv * c.Nk * c.Dv).astype(np.float32), c.dtype)
            mask = None
            if c.causal:  # f16 [Nk, Nq]: 0 where key j <= query i, -inf after (ggml skips those keys)
                mask = ggml.ggml_new_tensor_4d(ctx, ggml.GGML_TYPE_F16, c.Nk, c.Nq, 1, 1)
                m = np.where(np.arange(c.Nk)[None, :] <= np.arange(c.Nq)[:, None], 0.0, -np.inf)
                self.fill(mask, m.astype(np.float16).ravel(), "f16")
            out = ggml.ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0 / math.sqrt(c.D), 0.0, 0.0)
            ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
            gf = ggml.ggml_new_graph(ctx)
            ggml.ggml_build_forward_expand(gf, out)
            plan = ggml.ggml_graph_plan(gf, c.threads, None)
            work = (ctypes.c_uint8 * max(1, plan.work_size))()
            plan.work_data = ctypes.cast(work, ctypes.POINTER(ctypes.c_uint8))
            kv = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[c.dtype]
            detail = f"{self.version}, K/V {kv}, Q F32{', causal as an f16 -inf mask' if c.causal else ''}"

            def compute():
                work  # noqa: B018 - the work buffer lives as long as this closure
                ggml.ggml_graph_compute(gf, ctypes.byref(plan))
            return compute, detail, lambda: ggml.ggml_free(ctx)
        except BaseException:
            ggml.ggml_free(ctx)
            raise

    def fill(self, tensor, values, dtype):
        np = self.np
        if dtype == "f32":
            raw = values.astype(np.float32)
        elif dtype == "f16":
            raw = values.astype(np.float16)
        else:  # bf16: round to nearest even from f32
            u = values.astype(np.float32).view(np.uint32)
            raw = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        data = self.ggml.ggml_get_data(tensor)
        assert self.ggml.ggml_nbytes(tensor) == raw.nbytes
        ctypes.memmove(data, raw.ctypes.data, raw.nbytes)


# ---- ONNX Runtime -----------------------------------------------------------------------------

class OrtPeer:
    impl = "ort_attention"

    def __init__(self):
        import numpy as np  # noqa: PLC0415 - optional
        import onnx  # noqa: PLC0415
        import onnxruntime as ort  # noqa: PLC0415

        self.np, self.onnx, self.ort = np, onnx, ort
        self.version = f"onnxruntime {ort.__version__} (CPUExecutionProvider), onnx {onnx.__version__}"

    def model(self, c, elem):
        """One `Attention` node (ONNX opset 23): q [B, Hq, Nq, D], k/v [B, Hkv, Nk, D|Dv] -> out."""
        helper = self.onnx.helper
        io = [helper.make_tensor_value_info(n, elem, s) for n, s in
              (("q", [c.B, c.Hq, c.Nq, c.D]), ("k", [c.B, c.Hkv, c.Nk, c.D]), ("v", [c.B, c.Hkv, c.Nk, c.Dv]))]
        out = helper.make_tensor_value_info("out", elem, [c.B, c.Hq, c.Nq, c.Dv])
        node = helper.make_node("Attention", ["q", "k", "v"], ["out"], is_causal=int(c.causal))
        m = helper.make_model(helper.make_graph([node], "attention", io, [out]),
                              opset_imports=[helper.make_opsetid("", 23)])
        m.ir_version = 10  # the oldest IR that carries opset 23, for older runtimes
        return m.SerializeToString()

    def prepare(self, c):
        if c.backward:
            return None, "ONNX Runtime runs inference only (no backward)", None
        if c.dtype == "bf16":
            return None, "ONNX Runtime has no bf16 CPU kernel for Attention", None
        np, ort = self.np, self.ort
        elem, npt = {"f32": (self.onnx.TensorProto.FLOAT, np.float32),
                     "f16": (self.onnx.TensorProto.FLOAT16, np.float16)}[c.dtype]
        so = ort.SessionOptions()
        so.intra_op_num_threads = c.threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # No spinning between calls: the contenders alternate call by call on the same cores.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(self.model(c, elem), so, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(1)
        feeds = {"q": rng.uniform(-1, 1, (c.B, c.Hq, c.Nq, c.D)).astype(npt),
                 "k": rng.uniform(-1, 1, (c.B, c.Hkv, c.Nk, c.D)).astype(npt),
                 "v": rng.uniform(-1, 1, (c.B, c.Hkv, c.Nk, c.Dv)).astype(npt)}
        binding = sess.io_binding()  # inputs bound once; the output allocated by the session
        for name, x in feeds.items():
            binding.bind_cpu_input(name, x)
        binding.bind_output("out")
        detail = f"{self.version}, opset 23 Attention{' is_causal' if c.causal else ''}, intra-op threads {c.threads}"

        def run():
            sess.run_with_iobinding(binding)
        return run, detail, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", default="torch,ggml,ort",
                    help="comma-separated: torch, ggml, ort, torch_mha, torch_eager")
    args = ap.parse_args()
    peers = []
    for name, cls in (("torch", TorchPeer), ("ggml", GgmlPeer), ("ort", OrtPeer), ("torch_mha", TorchMhaPeer),
                      ("torch_eager", TorchEagerFamilyPeer)):
        if name not in args.peers.split(","):
            continue
        try:
            p = cls()
            peers.append(p)
            say("peer", p.impl, p.version)
        except Exception as e:  # noqa: BLE001 - a missing peer is reported, not fatal
            say("skip", cls.impl, f"{type(e).__name__}: {e}")
    say("ready")
    prepared = {}  # impl -> (call, cleanup)

    def release():
        for _, cleanup in prepared.values():
            if cleanup:
                cleanup()
        prepared.clear()
        gc.collect()

    for line in sys.stdin:
        cmd, *fields = line.split()
        if cmd == "prepare":
            release()
            c = Config(fields)
            for p in peers:
                try:
                    call, detail, cleanup = p.prepare(c)
                    if call is None:
                        say("skip", p.impl, detail)
                        continue
                    prepared[p.impl] = (call, cleanup)
                    for _ in range(c.warmup):
                        call()
                    say("ready", p.impl, detail)
                except Exception as e:  # noqa: BLE001 - reported, the other peers go on
                    prepared.pop(p.impl, None)
                    say("skip", p.impl, f"{type(e).__name__}: {e}")
        elif cmd == "rep":
            for impl, (call, _) in list(prepared.items()):
                try:
                    t0 = time.perf_counter()
                    call()
                    say("time", impl, f"{(time.perf_counter() - t0) * 1e3:.6f}")
                except Exception:  # noqa: BLE001 - dropped from the timing
                    prepared.pop(impl)
        elif cmd == "release":
            release()
        say("done")

if __name__ == "__main__":
    main()
