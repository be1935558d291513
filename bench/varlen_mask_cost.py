# bench/varlen_mask_cost.py — what a packed attn_mask costs attention_varlen (docs/SERVING.md,
# "Packed masks"): is_causal alone, with a document mask, and causality given as a mask; then
# attention_paged_varlen on a decode batch with a tree of drafts per sequence, with and without.
#   OMP_WAIT_POLICY=passive ~/.cache/attn-venv/bin/python bench/varlen_mask_cost.py
import time, numpy as np, attn
rng = np.random.default_rng(0)
lens = rng.integers(64, 1025, 16)
Hq, Hkv, D = 8, 8, 64
T = int(lens.sum())
q = rng.standard_normal((T, Hq, D)).astype(np.float32)
k = rng.standard_normal((T, Hkv, D)).astype(np.float32)
v = rng.standard_normal((T, Hkv, D)).astype(np.float32)
cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
S = int((lens * lens).sum())
blocks = [np.tril(np.ones((n, n), bool)) for n in lens]       # causal as a mask
# a document mask: each sequence split in two documents, causal inside each
doc = []
for n in lens:
    m = np.tril(np.ones((n, n), bool)); h = n // 2; m[h:, :h] = False; doc.append(m)
causal_mask = np.concatenate([b.reshape(-1) for b in blocks])
doc_mask = np.concatenate([b.reshape(-1) for b in doc])
fmask = np.where(causal_mask, 0.0, -np.inf).astype(np.float32)
mx = int(lens.max())
cases = {
  "is_causal (no mask)": dict(is_causal=True),
  "bool mask = causal": dict(attn_mask=causal_mask),
  "float mask = causal (0/-inf)": dict(attn_mask=fmask),
  "is_causal + bool document mask": dict(is_causal=True, attn_mask=doc_mask),
}
times = {c: [] for c in cases}
for c, o in cases.items(): attn.attention_varlen(q, k, v, cu, cu, mx, mx, num_threads=2, **o)
ref = attn.attention_varlen(q, k, v, cu, cu, mx, mx, is_causal=True, num_threads=2)
np.testing.assert_allclose(attn.attention_varlen(q, k, v, cu, cu, mx, mx, attn_mask=causal_mask, num_threads=2), ref, atol=1e-5)
for r in range(9):
    for c, o in cases.items():
        t = time.perf_counter(); attn.attention_varlen(q, k, v, cu, cu, mx, mx, num_threads=2, **o); times[c].append(time.perf_counter() - t)
print(f"B16 lengths 64..1024 (sum {T}, sum N^2 {S}), Hq=Hkv=8, D 64, f32, 2 threads, median of 9 alternating:")
for c in cases: print(f"  {c:34s} {1e3*np.median(times[c]):8.2f} ms  (min {1e3*min(times[c]):.2f})")

# ---- attention_paged_varlen: a decode batch, speculative steps with a tree mask per sequence ----
B, Hq, Hkv, D, L, ps = 16, 32, 8, 128, 4096, 16
per = L // ps
kp = rng.standard_normal((B * per, ps, Hkv, D)).astype(np.float32)
vp = rng.standard_normal((B * per, ps, Hkv, D)).astype(np.float32)
table = rng.permutation(B * per).reshape(B, per).astype(np.int64)
lens = np.full(B, L, np.int64)
nq = [4] * 8 + [1] * 8            # 8 speculative steps of 4 drafts beside 8 plain decode steps
cu = np.concatenate([[0], np.cumsum(nq)]).astype(np.int64)
q = rng.standard_normal((cu[-1], Hq, D)).astype(np.float32)
blocks = []
for n in nq:
    m = np.ones((n, L), bool); m[:, L - n:] = np.tril(np.ones((n, n), bool)); blocks.append(m.reshape(-1))
mask = np.concatenate(blocks)
cases = {"is_causal": dict(is_causal=True), "is_causal + packed tree mask": dict(is_causal=True, attn_mask=mask)}
for o in cases.values(): attn.attention_paged_varlen(q, cu, 4, kp, vp, table, lens, num_threads=2, **o)
t = {c: [] for c in cases}
for r in range(15):
    for c, o in cases.items():
        t0 = time.perf_counter(); attn.attention_paged_varlen(q, cu, 4, kp, vp, table, lens, num_threads=2, **o); t[c].append(time.perf_counter() - t0)
print("B 16 (8 steps of 4 drafts, 8 of 1), Hq 32 / Hkv 8, D 128, Nk 4096, f32 pages of 16, 2 threads, medians of 15 alternating:")
for c in cases: print(f"  {c:30s} {1e3*np.median(t[c]):.2f} ms (min {1e3*min(t[c]):.2f})")
