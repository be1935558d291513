"""The serving ops from Python (attn/serving.h): packed variable-length batches against torch's
own SDPA run sequence by sequence (the outside oracle, float64 math backend), forward and
gradients, gradcheck; the paged KV cache against the dense core op, appended token by token,
int8 pages, and bad input by message."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn
import attn.torch as at

torch.manual_seed(0)


def cu_of(lengths):
    return torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int64)


def sdpa_bottom_right(q, k, v, causal, scale=None):
    """torch SDPA on one sequence [H, N, D] (k, v already repeated to Hq heads), causal aligned
    bottom-right (the last query at the last key) as an explicit mask."""
    nq, nk = q.shape[-2], k.shape[-2]
    mask = None
    if causal:
        i = torch.arange(nq).unsqueeze(1)
        j = torch.arange(nk).unsqueeze(0)
        mask = j <= i + (nk - nq)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if mask is not None:  # torch gives NaN on a row with no key; attn's contract is 0
        out = torch.where(mask.any(-1, keepdim=True), out, torch.zeros_like(out))
    return out


def per_sequence(q, k, v, cq, ck, attend):
    """The torch oracle of the varlen ops: attend(b, q_b, k_b, v_b) on each packed sequence as
    [H, N, X] (k and v repeated to q's heads), the results packed back to [total, Hq, Dv]."""
    g = q.shape[1] // k.shape[1]
    parts = []
    for b in range(len(cq) - 1):
        qs = q[cq[b]:cq[b + 1]].transpose(0, 1)
        ks = k[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(g, 0)
        vs = v[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(g, 0)
        parts.append(attend(b, qs, ks, vs).transpose(0, 1))
    return torch.cat(parts)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hq,hkv", [(2, 2), (4, 1)])
def test_varlen_equals_torch_sdpa_per_sequence(causal, hq, hkv):
    lq, lk = [3, 0, 7, 1, 5], [4, 2, 7, 1, 9]
    D, Dv = 8, 6
    q = torch.randn(sum(lq), hq, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lk), hkv, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lk), hkv, Dv, dtype=torch.float64, requires_grad=True)
    cq, ck = cu_of(lq), cu_of(lk)
    out = at.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), is_causal=causal, alignment="bottom_right")
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    got = (q.grad.clone(), k.grad.clone(), v.grad.clone())

    for x in (q, k, v):
        x.grad = None
    want = per_sequence(q, k, v, cq, ck, lambda b, qs, ks, vs: sdpa_bottom_right(qs, ks, vs, causal))
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    (want * dout).sum().backward()
    for g, w, name in zip(got, (q.grad, k.grad, v.grad), "qkv"):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10, msg=f"d{name}")


def test_varlen_numpy_float32_and_lse_layout():
    lq = [5, 2, 9]
    q = np.random.default_rng(1).standard_normal((sum(lq), 3, 16)).astype(np.float32)
    cu = np.array([0, 5, 7, 16], dtype=np.int64)
    r = attn.attention_varlen(q, q, q, cu, cu, 9, 9, is_causal=True, return_lse=True)
    assert isinstance(r.out, np.ndarray) and r.out.shape == (16, 3, 16) and r.lse.shape == (3, 16)
    for b in range(3):
        s = slice(cu[b], cu[b + 1])
        one = attn.attention(q[None, s].transpose(0, 2, 1, 3), q[None, s].transpose(0, 2, 1, 3),
                             q[None, s].transpose(0, 2, 1, 3), is_causal=True, return_lse=True)
        np.testing.assert_allclose(r.out[s], one.out[0].transpose(1, 0, 2), atol=1e-6)
        np.testing.assert_allclose(r.lse[:, s], one.lse[0], atol=1e-6)
    g = attn.attention_varlen_backward(q, q, q, r.out, np.ones_like(r.out), r.lse, cu, cu, 9, 9, is_causal=True)
    assert g.dq.shape == q.shape and g.dk.shape == q.shape and g.backend in attn.backends()


def test_varlen_gradcheck_with_alibi_and_sinks():
    lq, lk = [2, 3], [3, 4]
    q = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(7, 1, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(7, 1, 3, dtype=torch.float64, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    sinks = torch.tensor([0.3, -0.2], dtype=torch.float64, requires_grad=True)
    cq, ck = cu_of(lq), cu_of(lk)
    assert torch.autograd.gradcheck(
        lambda q, k, v, a, s: at.attention_varlen(q, k, v, cq, ck, 3, 4, is_causal=True, alignment="bottom_right",
                                                  alibi_slopes=a, sinks=s),
        (q, k, v, slopes, sinks))


def pack_masks(blocks):
    """Each sequence's mask [H, Nq_b, Nk_b] flattened row-major and the sequences concatenated
    (FlashInfer's custom_mask layout): [H, S]."""
    return torch.cat([m.reshape(m.shape[0], -1) for m in blocks], dim=1)


@pytest.mark.parametrize("heads", [1, 4])
def test_varlen_packed_float_mask_against_torch_sdpa(heads):
    """A float mask packed per sequence ([S] shared by the heads, or [Hq, S]): out, dq, dk, dv and
    the mask's gradient against torch SDPA (float64 math backend) on each sequence with its block."""
    lq, lk = [3, 0, 7, 1, 5], [4, 2, 7, 3, 9]
    hq, hkv, D = 4, 2, 8
    q = torch.randn(sum(lq), hq, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lk), hkv, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lk), hkv, D, dtype=torch.float64, requires_grad=True)
    blocks = [torch.randn(heads, a, b, dtype=torch.float64) for a, b in zip(lq, lk)]
    packed = pack_masks(blocks)
    if heads == 1:
        packed = packed.reshape(-1)
    packed.requires_grad_(True)
    cq, ck = cu_of(lq), cu_of(lk)
    out = at.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), attn_mask=packed)
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    got = (q.grad.clone(), k.grad.clone(), v.grad.clone(), packed.grad.clone())
    assert got[3].shape == packed.shape

    for x in (q, k, v, packed):
        x.grad = None
    offs = np.cumsum([0] + [a * b for a, b in zip(lq, lk)])

    def block(b):  # sequence b's block of the packed mask (the autograd graph reaches packed)
        m = packed[offs[b]:offs[b + 1]] if heads == 1 else packed[:, offs[b]:offs[b + 1]]
        return m.reshape(heads, lq[b], lk[b])
    want = per_sequence(q, k, v, cq, ck,
                        lambda b, qs, ks, vs: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=block(b)))
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    (want * dout).sum().backward()
    for g, w, name in zip(got, (q.grad, k.grad, v.grad, packed.grad), ("dq", "dk", "dv", "dattn_mask")):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10, msg=name)


def test_varlen_packed_bool_mask_numpy_and_backward():
    """A bool mask packed per sequence through the numpy API: out as attention() per sequence with
    its block (a fully masked row gives zeros), and the backward takes the same mask (no
    dattn_mask for a bool mask)."""
    rng = np.random.default_rng(7)
    lq, lk = [4, 2, 6], [5, 3, 6]
    q = rng.standard_normal((sum(lq), 2, 8)).astype(np.float32)
    k = rng.standard_normal((sum(lk), 2, 8)).astype(np.float32)
    blocks = [rng.random((a, b)) < 0.7 for a, b in zip(lq, lk)]
    blocks[0][1] = False  # a fully masked row
    packed = np.concatenate([m.reshape(-1) for m in blocks])
    cq, ck = cu_of(lq).numpy(), cu_of(lk).numpy()
    r = attn.attention_varlen(q, k, k, cq, ck, 6, 6, attn_mask=packed, return_lse=True)
    for b in range(3):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        one = attn.attention(q[None, sq].transpose(0, 2, 1, 3), k[None, sk].transpose(0, 2, 1, 3),
                             k[None, sk].transpose(0, 2, 1, 3), attn_mask=blocks[b])
        np.testing.assert_allclose(r.out[sq], one[0].transpose(1, 0, 2), atol=1e-6)
    assert np.all(r.out[1] == 0) and np.all(np.isneginf(r.lse[:, 1]))
    g = attn.attention_varlen_backward(q, k, k, r.out, np.ones_like(r.out), r.lse, cq, ck, 6, 6, attn_mask=packed)
    assert g.dattn_mask is None and g.dq.shape == q.shape
    with pytest.raises(ValueError, match="attn_mask has shape \\[50\\], expected the sequences' masks packed"):
        attn.attention_varlen(q, k, k, cq, ck, 6, 6, attn_mask=np.ones(50, dtype=bool))


def test_varlen_gradcheck_packed_float_mask():
    lq, lk = [2, 3], [3, 2]
    q = torch.randn(5, 2, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(5, 1, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(5, 1, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.randn(2, 2 * 3 + 3 * 2, dtype=torch.float64, requires_grad=True)
    cq, ck = cu_of(lq), cu_of(lk)
    assert torch.autograd.gradcheck(
        lambda q, k, v, m: at.attention_varlen(q, k, v, cq, ck, 3, 3, is_causal=True, alignment="bottom_right",
                                               attn_mask=m),
        (q, k, v, mask))


def paged_from_dense(K, V, page_size, rng):
    """Pages [num_pages, page_size, Hkv, ·] holding dense K/V [B, Hkv, L, ·] in a shuffled order."""
    B, H, L, D = K.shape
    per = L // page_size
    order = rng.permutation(B * per)
    kp = np.zeros((B * per, page_size, H, D), K.dtype)
    vp = np.zeros((B * per, page_size, H, V.shape[-1]), V.dtype)
    table = order.reshape(B, per).astype(np.int64)
    for b in range(B):
        for p in range(per):
            kp[table[b, p]] = K[b, :, p * page_size:(p + 1) * page_size].transpose(1, 0, 2)
            vp[table[b, p]] = V[b, :, p * page_size:(p + 1) * page_size].transpose(1, 0, 2)
    return kp, vp, table


class MixedBatch:
    """B = 4 sequences of float64 keys (Hkv 2, 24 slots, D 16) in shuffled pages of 4, lens[b] of
    them valid, and nq[b] queries each (Hq 4) packed token-major."""

    def __init__(self, rng, lens, nq, Hq=4, Hkv=2, L=24, D=16):
        self.Hq, self.Hkv, self.D = Hq, Hkv, D
        self.K = rng.standard_normal((len(lens), Hkv, L, D))
        self.V = rng.standard_normal((len(lens), Hkv, L, D))
        self.kp, self.vp, self.table = paged_from_dense(self.K, self.V, 4, rng)
        self.lens, self.nq = np.array(lens, dtype=np.int64), nq
        self.q = rng.standard_normal((sum(nq), Hq, D))
        self.cu = cu_of(nq)

    def check(self, out, want_of):
        """out [total_q, Hq, D] of each sequence against want_of(b, q [Hq, n, D], k, v [Hq, L, D])
        (torch, float64 on the CPU: SDPA's math backend), within 1e-10."""
        cu, r = self.cu, self.Hq // self.Hkv
        for b, n in enumerate(self.nq):
            if n == 0:
                continue
            qb = torch.from_numpy(self.q[cu[b]:cu[b + 1]]).permute(1, 0, 2)
            kb = torch.from_numpy(self.K[b, :, :self.lens[b]]).repeat_interleave(r, 0)
            vb = torch.from_numpy(self.V[b, :, :self.lens[b]]).repeat_interleave(r, 0)
            got = torch.from_numpy(np.ascontiguousarray(out[cu[b]:cu[b + 1]])).permute(1, 0, 2)
            torch.testing.assert_close(got, want_of(b, qb, kb, vb), atol=1e-10, rtol=1e-10)


def test_paged_equals_dense_per_sequence():
    rng = np.random.default_rng(2)
    B, Hq, Hkv, L, D, Nq = 3, 4, 2, 24, 16, 2
    K = rng.standard_normal((B, Hkv, L, D)).astype(np.float32)
    V = rng.standard_normal((B, Hkv, L, D)).astype(np.float32)
    q = rng.standard_normal((B, Hq, Nq, D)).astype(np.float32)
    kp, vp, table = paged_from_dense(K, V, 4, rng)
    lens = np.array([24, 9, 2], dtype=np.int64)
    out = attn.attention_paged(q, kp, vp, table, lens, is_causal=True)
    for b in range(B):
        n = lens[b]
        want = attn.attention(q[b:b + 1], K[b:b + 1, :, :n], V[b:b + 1, :, :n], is_causal=True,
                              alignment="bottom_right")
        np.testing.assert_allclose(out[b:b + 1], want, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_paged_tree_mask_against_torch_sdpa(dtype):
    """A speculative step of 4 draft tokens in a tree (1 and 2 children of 0, 3 of 1: each sees
    its ancestors) as a boolean attn_mask over the key positions, with causal bottom-right and
    GQA 2, on shuffled pages: each sequence against torch SDPA (float64 math backend) on its own
    keys with the same mask. float64 pages take the per-run path, float32 the decode kernel."""
    rng = np.random.default_rng(7)
    B, Hq, Hkv, L, D, Nq, ps = 3, 4, 2, 32, 16, 4, 8
    K = rng.standard_normal((B, Hkv, L, D))
    V = rng.standard_normal((B, Hkv, L, D))
    q = rng.standard_normal((B, Hq, Nq, D))
    kp, vp, table = paged_from_dense(K, V, ps, rng)
    lens = np.array([32, 12, 5], dtype=np.int64)
    parent = [-1, 0, 0, 1]
    tree = np.zeros((Nq, Nq), bool)
    for i in range(Nq):
        a = i
        while a >= 0:
            tree[i, a], a = True, parent[a]
    cap = table.shape[1] * ps
    mask = np.ones((B, 1, Nq, cap), bool)
    for b in range(B):
        mask[b, 0, :, lens[b] - Nq:lens[b]] = tree  # the draft tokens are the newest Nq keys
    out = attn.attention_paged(q.astype(dtype), kp.astype(dtype), vp.astype(dtype), table, lens,
                               is_causal=True, attn_mask=mask)
    for b in range(B):
        n = lens[b]
        i = torch.arange(Nq).unsqueeze(1)
        j = torch.arange(n).unsqueeze(0)
        m = (j <= i + (n - Nq)) & torch.from_numpy(mask[b, 0, :, :n])
        kb = torch.from_numpy(K[b, :, :n]).repeat_interleave(Hq // Hkv, 0)
        vb = torch.from_numpy(V[b, :, :n]).repeat_interleave(Hq // Hkv, 0)
        want = F.scaled_dot_product_attention(torch.from_numpy(q[b]), kb, vb, attn_mask=m)
        np.testing.assert_allclose(out[b], want.numpy(), atol=1e-10 if dtype == np.float64 else 2e-5)
    # the same mask as floats (0 kept, -inf not) gives the same answer
    fmask = np.where(mask, 0.0, -np.inf).astype(np.float32)
    again = attn.attention_paged(q.astype(dtype), kp.astype(dtype), vp.astype(dtype), table, lens,
                                 is_causal=True, attn_mask=fmask)
    np.testing.assert_allclose(again, out, atol=1e-12 if dtype == np.float64 else 1e-6)
    # rows past ±1024 are shifted by their maximum, as the core op shifts them: 5000 more on every
    # kept key gives the same answer
    shifted = attn.attention_paged(q.astype(dtype), kp.astype(dtype), vp.astype(dtype), table, lens,
                                   is_causal=True, attn_mask=fmask + np.float32(5000.0))
    np.testing.assert_allclose(shifted, out, atol=1e-12 if dtype == np.float64 else 1e-6)


def test_paged_varlen_mixed_batch_against_torch_sdpa():
    """Decode steps and prefill chunks in one call: each sequence against torch SDPA (float64 math
    backend) on its own keys, causal bottom-right; GQA 2."""
    rng = np.random.default_rng(5)
    mb = MixedBatch(rng, lens=[24, 9, 13, 1], nq=[1, 5, 0, 1])
    r = attn.attention_paged_varlen(mb.q, mb.cu, 5, mb.kp, mb.vp, mb.table, mb.lens, is_causal=True,
                                    return_lse=True)
    assert r.out.shape == (sum(mb.nq), mb.Hq, mb.D) and r.lse.shape == (mb.Hq, sum(mb.nq))
    mb.check(r.out, lambda b, qb, kb, vb: sdpa_bottom_right(qb, kb, vb, True))
    q, cu, kp, vp, table, lens = mb.q, mb.cu, mb.kp, mb.vp, mb.table, mb.lens
    with pytest.raises(ValueError, match="cu_seqlens_q has B \\+ 1 = 3 entries"):
        attn.attention_paged_varlen(q, cu_of([1, 6]), 6, kp, vp, table, lens)


def test_paged_varlen_packed_tree_mask_against_torch_sdpa():
    """Speculative steps of different sizes with a tree mask per sequence, packed as
    [Nq_b, seq_lens[b]] blocks back to back, against torch SDPA (float64) on each sequence's keys."""
    rng = np.random.default_rng(11)
    mb = MixedBatch(rng, lens=[24, 9, 13, 5], nq=[4, 2, 0, 1])
    blocks = []
    for n, L in zip(mb.nq, mb.lens):  # the prefix is seen by every draft; the drafts form a random tree
        m = np.ones((n, L), dtype=bool)
        m[:, L - n:] = np.tril(rng.random((n, n)) < 0.6) | np.eye(n, dtype=bool)
        blocks.append(m)
    packed = np.concatenate([m.reshape(-1) for m in blocks])
    out = attn.attention_paged_varlen(mb.q, mb.cu, 4, mb.kp, mb.vp, mb.table, mb.lens, attn_mask=packed)
    mb.check(out, lambda b, qb, kb, vb: F.scaled_dot_product_attention(qb, kb, vb,
                                                                       attn_mask=torch.from_numpy(blocks[b])))


@pytest.mark.parametrize("head_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_prefill_chunks_against_torch_sdpa(head_major, dtype):
    """Prefill chunks over float32 and bfloat16 pages (40 queries, GQA 4: 160 rows a kv head, which
    the cpu backend gathers out of the pages and runs as dense prefill) against torch SDPA in
    float64 on each sequence's keys (the values as stored), causal bottom-right; token-major and
    head-major pages."""
    rng = np.random.default_rng(11)
    B, Hq, Hkv, D, page, nq = 3, 8, 2, 16, 16, 40
    lens = np.array([300, 77, 40], dtype=np.int64)
    per = int(-(-lens.max() // page))
    K = torch.from_numpy(rng.standard_normal((B, Hkv, per * page, D))).to(dtype)
    V = torch.from_numpy(rng.standard_normal((B, Hkv, per * page, D))).to(dtype)
    kp, vp, table = paged_from_dense(K.float().numpy(), V.float().numpy(), page, rng)
    kp, vp = torch.from_numpy(kp).to(dtype), torch.from_numpy(vp).to(dtype)  # (exact: the values are dtype's)
    if head_major:  # storage [pages, Hkv, page, D], passed as the view [pages, page, Hkv, D]
        kp = kp.transpose(1, 2).contiguous().transpose(1, 2)
        vp = vp.transpose(1, 2).contiguous().transpose(1, 2)
    q = torch.from_numpy(rng.standard_normal((B, Hq, nq, D))).to(dtype)
    out = attn.attention_paged(q, kp, vp, torch.from_numpy(table), torch.from_numpy(lens), is_causal=True)
    assert out.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    for b in range(B):
        n = lens[b]
        kb = K[b, :, :n].double().repeat_interleave(Hq // Hkv, 0)
        vb = V[b, :, :n].double().repeat_interleave(Hq // Hkv, 0)
        want = sdpa_bottom_right(q[b].double(), kb, vb, True)
        torch.testing.assert_close(out[b].double(), want, atol=tol, rtol=tol)


def test_paged_append_decodes_like_dense_and_int8_is_close():
    rng = np.random.default_rng(3)
    B, Hq, Hkv, D, steps, page = 2, 4, 2, 32, 11, 4
    pages = B * 4
    kp = np.zeros((pages, page, Hkv, D), np.float32)
    vp = np.zeros_like(kp)
    k8 = np.zeros((pages, page, Hkv, D), np.int8)
    v8 = np.zeros_like(k8)
    ks = np.zeros((pages, page, Hkv), np.float32)
    vs = np.zeros_like(ks)
    table = rng.permutation(pages).reshape(B, 4).astype(np.int64)
    lens = np.zeros(B, np.int64)
    K = rng.standard_normal((B, Hkv, steps, D)).astype(np.float32)
    V = rng.standard_normal((B, Hkv, steps, D)).astype(np.float32)
    for t in range(steps):
        kt, vt = K[:, :, t:t + 1], V[:, :, t:t + 1]
        attn.paged_kv_append(kp, vp, table, lens, kt, vt)
        attn.paged_kv_append(k8, v8, table, lens, kt, vt, k_scales=ks, v_scales=vs)
        lens += 1
        q = rng.standard_normal((B, Hq, 1, D)).astype(np.float32)
        out = attn.attention_paged(q, kp, vp, table, lens, is_causal=True)
        want = attn.attention(q, K[:, :, :t + 1], V[:, :, :t + 1], is_causal=True, alignment="bottom_right")
        np.testing.assert_allclose(out, want, atol=1e-5)
        out8 = attn.attention_paged(q, k8, v8, table, lens, k_scales=ks, v_scales=vs, is_causal=True)
        assert np.abs(out8 - want).max() < 0.08
    # The pages hold the tokens where the block table says.
    for b in range(B):
        for t in range(steps):
            np.testing.assert_array_equal(kp[table[b, t // page], t % page], K[b, :, t])


def test_blocked_int8_keys_hold_the_rows_bytes_and_decode_alike():
    """int8 keys blocked as [num_pages, page_size / 16, Hkv, D / 4, 16, 4] (16 keys side by side per
    four elements of d): appending writes the rows' bytes in that order (a NumPy reshape and
    transpose of the rows pages), and bf16 decode reads them to what the rows give, within the
    bf16 output's rounding (the in-place read takes a 14-bit q where the rows take 15 bits), and
    agrees with torch SDPA in float64 on the dequantised cache."""
    rng = np.random.default_rng(5)
    B, Hq, Hkv, D, page, steps = 2, 8, 2, 128, 32, 70
    pages = B * 3
    k8 = np.zeros((pages, page, Hkv, D), np.int8)
    v8 = np.zeros_like(k8)
    kb = np.zeros((pages, page // 16, Hkv, D // 4, 16, 4), np.int8)
    vb = np.zeros_like(v8)
    ks, vs, ksb, vsb = (np.zeros((pages, page, Hkv), np.float32) for _ in range(4))
    table = rng.permutation(pages).reshape(B, 3).astype(np.int64)
    lens = np.zeros(B, np.int64)
    K = rng.standard_normal((B, Hkv, steps, D)).astype(np.float32)
    V = rng.standard_normal((B, Hkv, steps, D)).astype(np.float32)
    for t0, t1 in [(0, 33), (33, 34), (34, steps)]:
        attn.paged_kv_append(k8, v8, table, lens, K[:, :, t0:t1], V[:, :, t0:t1], k_scales=ks, v_scales=vs)
        attn.paged_kv_append(kb, vb, table, lens, K[:, :, t0:t1], V[:, :, t0:t1], k_scales=ksb, v_scales=vsb)
        lens += t1 - t0
    blocked = k8.reshape(pages, page // 16, 16, Hkv, D // 4, 4).transpose(0, 1, 3, 4, 2, 5)
    np.testing.assert_array_equal(kb, blocked)
    np.testing.assert_array_equal(vb, v8)
    np.testing.assert_array_equal(ksb, ks)
    q = torch.randn(B, Hq, 1, D).to(torch.bfloat16)
    out = attn.attention_paged(q, k8, v8, table, lens, k_scales=ks, v_scales=vs, return_lse=True)
    outb = attn.attention_paged(q, kb, vb, table, lens, k_scales=ksb, v_scales=vsb, return_lse=True)
    lse, lseb = out.lse, outb.lse
    out, outb = out.out.float(), outb.out.float()
    assert (outb - out).abs().max() <= 8e-3 * out.abs().max()
    torch.testing.assert_close(lseb.float(), lse.float(), rtol=2e-5, atol=2e-5)
    # torch's own SDPA (float64) on the cache the blocked pages hold, dequantised here from the
    # blocked bytes by the inverse reshape: attn's bf16 out within its bf16 rounding.
    krows = kb.transpose(0, 1, 4, 2, 3, 5).reshape(pages, page, Hkv, D).astype(np.float64) * ksb[..., None]
    vrows = vb.astype(np.float64) * vsb[..., None]
    for b in range(B):
        L = int(lens[b])
        ks_ = np.concatenate([krows[table[b, p]] for p in range(3)])[:L]  # [L, Hkv, D]
        vs_ = np.concatenate([vrows[table[b, p]] for p in range(3)])[:L]
        kt = torch.from_numpy(ks_).permute(1, 0, 2).repeat_interleave(Hq // Hkv, 0)
        vt = torch.from_numpy(vs_).permute(1, 0, 2).repeat_interleave(Hq // Hkv, 0)
        want = F.scaled_dot_product_attention(q[b].double(), kt, vt)
        assert (outb[b].double() - want).abs().max() <= 8e-3 * want.abs().max()
    # int8_query="int8": q and the weights in 8 bits on the blocked keys (byte products where the
    # CPU has AVX512-VNNI; elsewhere "automatic"'s path): torch's SDPA in float64 on the same
    # dequantised cache, within the 8-bit rounding of q (1/254 of a row's largest) and of the
    # weights (1/510 of a block's largest) — 2e-2 of the largest output; lse within 2e-2
    out8 = attn.attention_paged(q, kb, vb, table, lens, k_scales=ksb, v_scales=vsb, int8_query="int8", return_lse=True)
    torch.testing.assert_close(out8.lse.float(), lse.float(), rtol=0, atol=2e-2)
    # ... and on the rows pages: q as "automatic" rounds it (lse alike), the weights in 8 bits
    out8r = attn.attention_paged(q, k8, v8, table, lens, k_scales=ks, v_scales=vs, int8_query="int8", return_lse=True)
    torch.testing.assert_close(out8r.lse.float(), lse.float(), rtol=2e-5, atol=2e-5)
    for b in range(B):
        L = int(lens[b])
        ks_ = np.concatenate([krows[table[b, p]] for p in range(3)])[:L]
        vs_ = np.concatenate([vrows[table[b, p]] for p in range(3)])[:L]
        kt = torch.from_numpy(ks_).permute(1, 0, 2).repeat_interleave(Hq // Hkv, 0)
        vt = torch.from_numpy(vs_).permute(1, 0, 2).repeat_interleave(Hq // Hkv, 0)
        want = F.scaled_dot_product_attention(q[b].double(), kt, vt)
        assert (out8.out[b].double() - want).abs().max() <= 2e-2 * want.abs().max()
        assert (out8r.out[b].double() - want).abs().max() <= 2e-2 * want.abs().max()
    with pytest.raises(ValueError, match=r"blocked keys end in a contiguous \[D / 4, 16, 4\]"):
        attn.attention_paged(q, np.zeros((pages, page // 16, Hkv, D // 4, 8, 8), np.int8), vb, table, lens,
                             k_scales=ksb, v_scales=vsb)


def test_int8_query_float32_is_exact_and_automatic_close():
    """float32 q on an int8 cache at D 128 (the int16 products' shape): int8_query="float32" equals
    torch SDPA in float64 on the dequantised cache to float32 rounding; "automatic" (q and the
    weights rounded to int16 where the CPU has AVX512-VNNI) stays within 2e-4 of the largest
    output; a bad name or type is refused by message."""
    rng = np.random.default_rng(9)
    B, Hq, Hkv, D, page, L = 2, 8, 2, 128, 16, 300
    pages = B * (L // page + 1)
    k8 = np.zeros((pages, page, Hkv, D), np.int8)
    v8 = np.zeros_like(k8)
    ks, vs = np.zeros((pages, page, Hkv), np.float32), np.zeros((pages, page, Hkv), np.float32)
    table = rng.permutation(pages).reshape(B, -1).astype(np.int64)
    lens = np.zeros(B, np.int64)
    K = rng.standard_normal((B, Hkv, L, D)).astype(np.float32)
    V = rng.standard_normal((B, Hkv, L, D)).astype(np.float32)
    attn.paged_kv_append(k8, v8, table, lens, K, V, k_scales=ks, v_scales=vs)
    lens += L
    q = rng.standard_normal((B, Hq, 1, D)).astype(np.float32)
    exact = attn.attention_paged(q, k8, v8, table, lens, k_scales=ks, v_scales=vs, int8_query="float32")
    fast = attn.attention_paged(q, k8, v8, table, lens, k_scales=ks, v_scales=vs)
    krows = k8.astype(np.float64) * ks[..., None]
    vrows = v8.astype(np.float64) * vs[..., None]
    for b in range(B):
        kb = torch.from_numpy(np.concatenate([krows[t] for t in table[b]])[:L]).permute(1, 0, 2).repeat_interleave(Hq // Hkv, 0)
        vb = torch.from_numpy(np.concatenate([vrows[t] for t in table[b]])[:L]).permute(1, 0, 2).repeat_interleave(Hq // Hkv, 0)
        want = F.scaled_dot_product_attention(torch.from_numpy(q[b]).double(), kb, vb).numpy()
        np.testing.assert_allclose(exact[b], want, atol=2e-5 * np.abs(want).max(), rtol=0)
        assert np.abs(fast[b] - want).max() <= 2e-4 * np.abs(want).max()
    # the mixed-batch form takes the same key
    cu = np.arange(B + 1, dtype=np.int64)
    packed = attn.attention_paged_varlen(q[:, :, 0].copy(), cu, 1, k8, v8, table, lens, k_scales=ks, v_scales=vs,
                                         int8_query="float32")
    np.testing.assert_allclose(packed, exact[:, :, 0], atol=2e-6, rtol=0)
    with pytest.raises(ValueError, match="attention_paged: int8_query: 'half' is not one of automatic, float32, int8"):
        attn.attention_paged(q, k8, v8, table, lens, k_scales=ks, v_scales=vs, int8_query="half")
    with pytest.raises(TypeError, match="attention_paged_varlen: int8_query"):
        attn.attention_paged_varlen(q[:, :, 0].copy(), cu, 1, k8, v8, table, lens, k_scales=ks, v_scales=vs, int8_query=1)


def test_serving_bad_input_by_message():
    q = torch.randn(4, 2, 8)
    cu = torch.tensor([0, 4], dtype=torch.int64)
    with pytest.raises(ValueError, match="attention_varlen: attn_mask has shape \\[4, 4\\], expected the sequences' "
                                         "masks packed: \\[S\\] or \\[1 or Hq, S\\] with Hq = 2 and S = sum"):
        attn.attention_varlen(q, q, q, cu, cu, 4, 4, attn_mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_varlen: "):
        attn.attention_varlen(q, q, q, cu, cu, 3, 4)  # a length above its bound
    with pytest.raises(ValueError, match="attention_varlen: unknown option 'misspelt'"):
        attn.attention_varlen(q, q, q, cu, cu, 4, 4, misspelt=1)
    kp = np.zeros((2, 4, 1, 8), np.float32)
    table = np.array([[0, 1]], np.int64)
    lens = np.array([3], np.int64)
    ro = kp.copy()
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="paged_kv_append: k_pages must be a writable array"):
        attn.paged_kv_append(ro, kp, table, lens, np.zeros((1, 1, 1, 8), np.float32), np.zeros((1, 1, 1, 8), np.float32))
    with pytest.raises(ValueError, match=r"attention_paged: seq_lens\[0\] = 9"):
        attn.attention_paged(np.zeros((1, 1, 1, 8), np.float32), kp, kp, table, np.array([9], np.int64))
    with pytest.raises(ValueError, match="paged_kv_append: "):
        attn.paged_kv_append(kp, kp, table, np.array([8], np.int64), np.zeros((1, 1, 1, 8), np.float32),
                             np.zeros((1, 1, 1, 8), np.float32))


def test_int32_index_arrays_as_flash_attention_and_vllm_pass_them():
    """cu_seqlens, block_table, seq_lens, cache_lengths and nonpad_kv_seqlen as int32 (what
    FlashAttention's varlen API and vLLM hand over) — torch and NumPy, int16/uint8 too — give
    exactly the int64 result; other index dtypes are refused by message."""
    rng = np.random.default_rng(5)
    lq = [5, 0, 9]
    q = torch.randn(sum(lq), 4, 8)
    k, v = torch.randn(sum(lq), 2, 8), torch.randn(sum(lq), 2, 8)
    cu64 = cu_of(lq)
    want = at.attention_varlen(q, k, v, cu64, cu64, 9, 9, is_causal=True)
    for cu in (cu64.to(torch.int32), cu64.to(torch.int16), cu64.numpy().astype(np.int32), cu64.to(torch.uint8)):
        torch.testing.assert_close(attn.attention_varlen(q, k, v, cu, cu, 9, 9, is_causal=True), want, atol=0, rtol=0)
    # attn.torch's varlen: forward and gradients with int32 cu_seqlens
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out = at.attention_varlen(qg, kg, vg, cu64.to(torch.int32), cu64.to(torch.int32), 9, 9, is_causal=True)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    out.sum().backward()
    q64, k64, v64 = (x.clone().requires_grad_() for x in (q, k, v))
    at.attention_varlen(q64, k64, v64, cu64, cu64, 9, 9, is_causal=True).sum().backward()
    for a, b in ((qg, q64), (kg, k64), (vg, v64)):
        torch.testing.assert_close(a.grad, b.grad, atol=0, rtol=0)
    # paged: block_table and seq_lens int32, appended with int32 too
    B, Hkv, L, D = 2, 2, 12, 8
    K = rng.standard_normal((B, Hkv, L, D)).astype(np.float32)
    V = rng.standard_normal((B, Hkv, L, D)).astype(np.float32)
    qd = rng.standard_normal((B, 4, 1, D)).astype(np.float32)
    kp, vp, table = paged_from_dense(K, V, 4, rng)
    lens = np.array([12, 7], dtype=np.int64)
    want = attn.attention_paged(qd, kp, vp, table, lens, is_causal=True)
    got = attn.attention_paged(qd, kp, vp, table.astype(np.int32), torch.from_numpy(lens).to(torch.int32), is_causal=True)
    np.testing.assert_array_equal(got, want)
    kp2, vp2 = kp.copy(), vp.copy()
    new = rng.standard_normal((B, Hkv, 1, D)).astype(np.float32)
    attn.paged_kv_append(kp, vp, table, np.array([11, 6], np.int64), new, new)
    attn.paged_kv_append(kp2, vp2, table.astype(np.int32), np.array([11, 6], np.int32), new, new)
    np.testing.assert_array_equal(kp, kp2)
    np.testing.assert_array_equal(vp, vp2)
    # the dense KV cache and nonpad_kv_seqlen
    cache_k = np.zeros((B, Hkv, 8, D), np.float32)
    cache_v = np.zeros((B, Hkv, 8, D), np.float32)
    cache_k2, cache_v2 = cache_k.copy(), cache_v.copy()
    a = attn.attention_with_kv_cache(qd, new, new, cache_k, cache_v, np.array([3, 0], np.int64), is_causal=True)
    b = attn.attention_with_kv_cache(qd, new, new, cache_k2, cache_v2, np.array([3, 0], np.int32), is_causal=True)
    np.testing.assert_array_equal(a, b)
    qs, ks = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8)
    n64 = torch.tensor([6, 2])
    want = attn.attention(qs, ks, ks, nonpad_kv_seqlen=n64)
    torch.testing.assert_close(attn.attention(qs, ks, ks, nonpad_kv_seqlen=n64.to(torch.int32)), want, atol=0, rtol=0)
    torch.testing.assert_close(at.scaled_dot_product_attention(qs, ks, ks, nonpad_kv_seqlen=n64.to(torch.int32)), want,
                               atol=0, rtol=0)
    # int32 arrays reach the extension as they are (no widening copy); int16 and uint8 are widened
    from attn._arrays import index
    i32 = np.array([0, 5], np.int32)
    assert index(i32) is i32
    assert index(cu64.to(torch.int32)).dtype == np.int32
    assert index(np.array([0, 5], np.int16)).dtype == np.int64
    # a strided int32 view (a column of a wider table) gives the int64 result too
    table2 = np.zeros((table.shape[0], 2 * table.shape[1]), np.int32)
    table2[:, ::2] = table
    np.testing.assert_array_equal(attn.attention_paged(qd, kp2, vp2, table2[:, ::2], lens.astype(np.int32), is_causal=True),
                                  attn.attention_paged(qd, kp2, vp2, table, lens, is_causal=True))
    # not an index dtype: refused, naming the argument
    with pytest.raises(TypeError, match="attention_varlen: cu_seqlens_q has dtype float32, expected int64 or int32"):
        attn.attention_varlen(q, k, v, cu64.float(), cu64, 9, 9)
    with pytest.raises(TypeError, match="attention_paged: block_table has dtype"):
        attn.attention_paged(qd, kp, vp, table.astype(np.uint64), lens)


def test_varlen_hf_finfo_min_packed_mask_against_torch_sdpa():
    """HF-style packed float masks (0 kept, finfo.min not, and a row of each sequence that keeps
    no key) through attention_varlen: out, dq, dk, dv against torch SDPA in float64 on each
    sequence. Softmax is shift-invariant, so attn weighs a row of finfo.min throughout by its
    scores alone; torch's float64 sum finfo.min + s rounds the scores away (uniform weights), so
    the oracle is given such rows as zeros, the same softmax exactly."""
    lq, lk = [4, 0, 6, 1], [5, 3, 6, 2]
    hq, hkv, D = 2, 1, 8
    lowest = torch.finfo(torch.float32).min
    q = torch.randn(sum(lq), hq, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(sum(lk), hkv, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(sum(lk), hkv, D, dtype=torch.float64, requires_grad=True)
    blocks = []
    for a, b in zip(lq, lk):
        keep = torch.rand(1, a, b) < 0.6
        keep[:, :, 0] = True
        if a > 0:
            keep[:, 0, :] = False  # row 0: no key kept
        blocks.append(torch.where(keep, 0.0, lowest).double())
    packed = pack_masks(blocks).reshape(-1)
    cq, ck = cu_of(lq), cu_of(lk)
    out = at.attention_varlen(q, k, v, cq, ck, max(lq), max(lk), attn_mask=packed)
    dout = torch.randn_like(out)
    (out * dout).sum().backward()
    got = (q.grad.clone(), k.grad.clone(), v.grad.clone())
    for x in (q, k, v):
        x.grad = None
    oracle_masks = [m.masked_fill((m == lowest).all(-1, keepdim=True), 0.0) for m in blocks]
    want = per_sequence(q, k, v, cq, ck,
                        lambda b, qs, ks, vs: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=oracle_masks[b]))
    torch.testing.assert_close(out, want, atol=1e-10, rtol=1e-10)
    (want * dout).sum().backward()
    for g, w, name in zip(got, (q.grad, k.grad, v.grad), ("dq", "dk", "dv")):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10, msg=name)


def paged_eager(q, kp, vp, table, lens, slopes, sinks, mask):
    """The outside oracle of the paged backward: each sequence's keys gathered from the pages by
    torch indexing (so autograd carries their gradients back to the pages), then attention written
    in torch eager — causal bottom-right, ALiBi -slope·|pos_i - j|, an added float mask, and the
    sink as an extra score column that carries no value (gpt-oss's eager form)."""
    B, Hq, Nq, D = q.shape
    ps, Hkv = kp.shape[1], kp.shape[2]
    outs = []
    for b in range(B):
        n = int(lens[b])
        pages = table[b, :(n + ps - 1) // ps]
        kb = kp[pages].reshape(-1, Hkv, D)[:n].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        vb = vp[pages].reshape(-1, Hkv, vp.shape[-1])[:n].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        pos = torch.arange(Nq, dtype=q.dtype).unsqueeze(1) + (n - Nq)
        j = torch.arange(n, dtype=q.dtype).unsqueeze(0)
        s = q[b] @ kb.transpose(-1, -2) / D ** 0.5 - slopes[b].view(Hq, 1, 1) * (pos - j).abs()
        s = s + mask[b, :, :, :n]
        s = s.masked_fill(j > pos, float("-inf"))
        s = torch.cat([s, sinks.view(Hq, 1, 1).expand(Hq, Nq, 1)], -1)
        outs.append(torch.softmax(s, -1)[..., :n] @ vb)
    return torch.stack(outs)


def shared_prefix_pages(rng, lens, ps, Hkv, D):
    """float64 pages of random keys/values for sequences of lens, shuffled, sequences 1 and 2
    sharing sequence 0's first page (a common prompt), and one spare page nobody reads."""
    need = [(n + ps - 1) // ps for n in lens]
    num = sum(need) - 2 + 1
    order = list(rng.permutation(num))
    table = np.full((len(lens), max(need) + 1), -1, np.int64)
    for b, k in enumerate(need):
        for p in range(k):
            table[b, p] = table[0, 0] if (b in (1, 2) and p == 0) else order.pop()
    kp = torch.tensor(rng.standard_normal((num, ps, Hkv, D)), requires_grad=True)
    vp = torch.tensor(rng.standard_normal((num, ps, Hkv, D)), requires_grad=True)
    return kp, vp, torch.from_numpy(table)


def test_paged_backward_against_torch_eager_with_shared_pages():
    """attn.torch.attention_paged's gradients — q, both page tensors (a page shared by three
    sequences gets the sum of their gradients; a page nobody reads gets zeros), ALiBi [B, Hq],
    sinks and a float mask — against torch autograd through the eager formula on keys gathered
    from the same pages, float64, within 1e-10."""
    rng = np.random.default_rng(11)
    lens, ps, Hq, Hkv, D, Nq = [11, 6, 4, 9], 4, 4, 2, 8, 3
    B = len(lens)
    kp, vp, table = shared_prefix_pages(rng, lens, ps, Hkv, D)
    q = torch.tensor(rng.standard_normal((B, Hq, Nq, D)), requires_grad=True)
    slopes = torch.tensor(rng.uniform(0.1, 0.9, (B, Hq)), requires_grad=True)
    sinks = torch.tensor(rng.standard_normal(Hq), requires_grad=True)
    K = table.shape[1] * ps
    mask = torch.tensor(rng.uniform(-2, 2, (B, 1, Nq, K)), requires_grad=True)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    w = torch.tensor(rng.standard_normal((B, Hq, Nq, D)))
    ins = (q, kp, vp, slopes, sinks, mask)
    got = at.attention_paged(q, kp, vp, table, lens_t, is_causal=True, alibi_slopes=slopes, sinks=sinks,
                             attn_mask=mask)
    g_got = torch.autograd.grad((got * w).sum(), ins)
    want = paged_eager(q, kp, vp, table, lens_t, slopes, sinks, mask)
    g_want = torch.autograd.grad((want * w).sum(), ins)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    for name, a, b in zip(("dq", "dk_pages", "dv_pages", "dalibi", "dsinks", "dmask"), g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=name)
    spare = sorted(set(range(kp.shape[0])) - set(table[table >= 0].tolist()))
    assert spare and not g_got[1][spare].any() and not g_got[2][spare].any()
    # NumPy float32 through attn.attention_paged_backward: within float32 rounding of the above
    f32 = lambda t: t.detach().numpy().astype(np.float32)
    r = attn.attention_paged(f32(q), f32(kp), f32(vp), table.numpy(), np.array(lens), is_causal=True,
                             alibi_slopes=f32(slopes), sinks=f32(sinks), attn_mask=f32(mask), return_lse=True)
    g = attn.attention_paged_backward(f32(q), f32(kp), f32(vp), table.numpy(), np.array(lens), r.out, f32(w), r.lse,
                                      is_causal=True, alibi_slopes=f32(slopes), sinks=f32(sinks),
                                      attn_mask=f32(mask))
    assert g.dk_pages.dtype == np.float32 and g.dk_pages.shape == tuple(kp.shape)
    for a, b in zip((g.dq, g.dk_pages, g.dv_pages, g.dalibi_slopes, g.dsinks, g.dattn_mask), g_want):
        np.testing.assert_allclose(a, b.numpy(), atol=2e-4, rtol=2e-4)


def test_paged_gradcheck_shared_page_mask_sinks():
    """torch.autograd.gradcheck (central finite differences) of attn.torch.attention_paged in
    float64: q, pages shared by two sequences, sinks and a float mask, causal bottom-right, GQA 2."""
    rng = np.random.default_rng(13)
    lens, ps, Hq, Hkv, D, Nq = [5, 3, 6], 2, 2, 1, 3, 2
    kp, vp, table = shared_prefix_pages(rng, lens, ps, Hkv, D)
    q = torch.tensor(rng.standard_normal((len(lens), Hq, Nq, D)), requires_grad=True)
    sinks = torch.tensor(rng.standard_normal(Hq), requires_grad=True)
    mask = torch.tensor(rng.uniform(-1, 1, (1, Hq, Nq, table.shape[1] * ps)), requires_grad=True)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    assert torch.autograd.gradcheck(
        lambda q, kp, vp, s, m: at.attention_paged(q, kp, vp, table, lens_t, is_causal=True, sinks=s, attn_mask=m),
        (q, kp, vp, sinks, mask))


def test_paged_backward_bad_input_by_message():
    kp = np.zeros((4, 2, 1, 4), np.float32)
    q = np.zeros((2, 2, 1, 4), np.float32)
    table, lens = np.array([[0, 3], [1, 2]]), np.array([4, 3])
    out, lse = np.zeros((2, 2, 1, 4), np.float32), np.zeros((2, 2, 1), np.float32)
    with pytest.raises(ValueError, match=r"attention_paged_backward: lse has shape \[2, 2\], expected"):
        attn.attention_paged_backward(q, kp, kp, table, lens, out, out, lse[..., 0])
    with pytest.raises(ValueError, match=r"attention_paged_backward: dout has shape \[2, 2, 1, 3\]"):
        attn.attention_paged_backward(q, kp, kp, table, lens, out, out[..., :3], lse)
    k8 = np.zeros((4, 2, 1, 4), np.int8)
    with pytest.raises(ValueError, match="attention_paged_backward: .*int8 pages"):
        attn.attention_paged_backward(q, k8, k8, table, lens, out, out, lse)


def test_paged_backward_sees_the_forwards_keys_after_an_append():
    """A decode loop appends the next token and advances seq_lens in place before the loss's
    backward runs: the gradients are those of the keys the forward read (the appended rows lie
    past the old lengths and the lengths are saved as they were)."""
    rng = np.random.default_rng(17)
    lens, ps, Hq, Hkv, D = [5, 7], 4, 2, 1, 4
    kp, vp, table = shared_prefix_pages(rng, lens, ps, Hkv, D)
    kp = torch.cat([kp.detach(), torch.zeros(2, ps, Hkv, D, dtype=kp.dtype)]).requires_grad_()
    vp = torch.cat([vp.detach(), torch.zeros(2, ps, Hkv, D, dtype=vp.dtype)]).requires_grad_()
    lens_np = np.array(lens, dtype=np.int64)
    q = torch.tensor(rng.standard_normal((2, Hq, 1, D)), requires_grad=True)
    want = torch.autograd.grad(at.attention_paged(q, kp, vp, table, lens_np.copy(), is_causal=True).sum(), (q, kp, vp))
    out = at.attention_paged(q, kp, vp, table, lens_np, is_causal=True)
    new = rng.standard_normal((2, Hkv, 1, D))
    attn.paged_kv_append(kp.detach().numpy(), vp.detach().numpy(), table.numpy(), lens_np, new, new)
    lens_np += 1
    got = torch.autograd.grad(out.sum(), (q, kp, vp))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def paged_varlen_eager(q, cu, kp, vp, table, lens, slopes, sinks, mask):
    """The eager oracle of a mixed batch: each sequence's n_b packed queries against its keys
    gathered from the pages by indexing, causal bottom-right, ALiBi row b, sinks as an extra score
    column, and its block [Hq, n_b, L_b] of the packed float mask [Hq, S]."""
    Hq, D = q.shape[1], q.shape[2]
    ps, Hkv = kp.shape[1], kp.shape[2]
    outs, off = [], 0
    for b in range(len(lens)):
        n, L = int(cu[b + 1] - cu[b]), int(lens[b])
        if n == 0:
            continue
        qb = q[int(cu[b]):int(cu[b + 1])].transpose(0, 1)
        if L == 0:
            outs.append(torch.zeros(n, Hq, vp.shape[-1], dtype=q.dtype))
            continue
        pages = table[b, :(L + ps - 1) // ps]
        kb = kp[pages].reshape(-1, Hkv, D)[:L].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        vb = vp[pages].reshape(-1, Hkv, vp.shape[-1])[:L].transpose(0, 1).repeat_interleave(Hq // Hkv, 0)
        pos = torch.arange(n, dtype=q.dtype).unsqueeze(1) + (L - n)
        j = torch.arange(L, dtype=q.dtype).unsqueeze(0)
        s = qb @ kb.transpose(-1, -2) / D ** 0.5 - slopes[b].view(Hq, 1, 1) * (pos - j).abs()
        s = s + mask[:, off:off + n * L].reshape(Hq, n, L)
        s = s.masked_fill(j > pos, float("-inf"))
        s = torch.cat([s, sinks.view(Hq, 1, 1).expand(Hq, n, 1)], -1)
        outs.append((torch.softmax(s, -1)[..., :L] @ vb).transpose(0, 1))
        off += n * L
    return torch.cat(outs)


def test_paged_varlen_backward_against_torch_eager():
    """attn.torch.attention_paged_varlen's gradients on a mixed batch (decode steps, a prefill
    chunk, a sequence with no queries, one with no keys; a page shared by three sequences) — q,
    both page tensors, ALiBi [B, Hq], sinks and a packed float mask — against torch autograd
    through the eager formula on keys gathered from the same pages, float64, within 1e-10; and
    gradcheck on a smaller batch."""
    rng = np.random.default_rng(19)
    lens, nq, ps, Hq, Hkv, D = [11, 6, 4, 9, 0], [1, 4, 0, 2, 1], 4, 4, 2, 8
    B = len(lens)
    kp, vp, table = shared_prefix_pages(rng, [max(n, 1) for n in lens], ps, Hkv, D)
    cu = cu_of(nq)
    q = torch.tensor(rng.standard_normal((int(cu[-1]), Hq, D)), requires_grad=True)
    slopes = torch.tensor(rng.uniform(0.1, 0.9, (B, Hq)), requires_grad=True)
    sinks = torch.tensor(rng.standard_normal(Hq), requires_grad=True)
    S = sum(n * L for n, L in zip(nq, lens))
    mask = torch.tensor(rng.uniform(-2, 2, (Hq, S)), requires_grad=True)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    w = torch.tensor(rng.standard_normal((int(cu[-1]), Hq, D)))
    ins = (q, kp, vp, slopes, sinks, mask)
    got = at.attention_paged_varlen(q, cu, 4, kp, vp, table, lens_t, is_causal=True, alibi_slopes=slopes,
                                    sinks=sinks, attn_mask=mask)
    want = paged_varlen_eager(q, cu, kp, vp, table, lens_t, slopes, sinks, mask)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)
    g_got = torch.autograd.grad((got * w).sum(), ins)
    g_want = torch.autograd.grad((want * w).sum(), ins)
    for name, a, b in zip(("dq", "dk_pages", "dv_pages", "dalibi", "dsinks", "dmask"), g_got, g_want):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10, msg=name)
    small = (q[:3].detach().clone().requires_grad_(), kp, vp, sinks)
    assert torch.autograd.gradcheck(
        lambda q, kp, vp, s: at.attention_paged_varlen(q, cu_of([1, 2]), 2, kp, vp, table[:2], lens_t[:2],
                                                       is_causal=True, sinks=s),
        small)
