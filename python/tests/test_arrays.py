"""Arrays in and out: NumPy and torch, every dtype, views read in place (no copy), results of
the caller's kind, bad input as ValueError/TypeError with attn's message, the GIL released,
the KV cache written in place, the version shared with CMake, and the plot."""

import pathlib
import re
import threading
import time

import ml_dtypes
import numpy as np
import pytest
import torch

import attn
from attn import _attn
from conftest import assert_close

ROOT = pathlib.Path(__file__).resolve().parents[2]


def ref_attention(q, k, v, mask=None, causal=False):
    """float64 NumPy reference, [B, H, N, D], Hq == Hkv."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_version_is_cmakes():
    m = re.search(r"project\(attn VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    assert attn.__version__ == m.group(1)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5), (np.float16, 3e-3),
                                       (ml_dtypes.bfloat16, 3e-2)])
def test_numpy_dtypes_round_trip(dtype, tol, rng):
    q, k, v = (rng.standard_normal((2, 3, 5, 8)).astype(dtype) for _ in range(3))
    out = attn.attention(q, k, v)
    assert isinstance(out, np.ndarray) and out.dtype == np.dtype(dtype) and out.shape == (2, 3, 5, 8)
    assert_close(out.astype(np.float64), ref_attention(q, k, v), tol, str(dtype))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_torch_in_torch_out(dtype):
    q = torch.randn(1, 2, 4, 8).to(dtype)
    out = attn.attention(q, q, q, is_causal=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype
    r = attn.attention(q, q, q, return_lse=True)
    assert isinstance(r.lse, torch.Tensor) and r.lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


def test_no_copy_views(rng):
    """The extension reads an array where it lies: the address and element strides it sees are
    the array's own, for contiguous, transposed, sliced and broadcast NumPy and torch views."""
    a = rng.standard_normal((2, 8, 6, 4)).astype(np.float32)
    t = torch.from_numpy(a.copy())
    cases = [
        (a, a.ctypes.data, [s // 4 for s in a.strides]),
        (a.transpose(0, 2, 1, 3), a.ctypes.data, [s // 4 for s in a.transpose(0, 2, 1, 3).strides]),
        (a[:, ::2], a.ctypes.data, [s // 4 for s in a[:, ::2].strides]),
        (np.broadcast_to(a[:1], a.shape), a.ctypes.data, [0] + [s // 4 for s in a.strides[1:]]),
        (t, t.data_ptr(), list(t.stride())),
        (t.transpose(1, 2), t.data_ptr(), list(t.transpose(1, 2).stride())),
        (t[:, 1:], t[:, 1:].data_ptr(), list(t[:, 1:].stride())),
    ]
    for x, ptr, strides in cases:
        got_ptr, shape, got_strides, dtype = _attn.view_info(attn._arrays.arg(x))
        assert got_ptr == ptr and list(shape) == list(x.shape) and list(got_strides) == strides, (shape, strides)
        assert dtype == "float32"
    # bfloat16 from ml_dtypes travels as a uint16 view of the same memory
    b = a.astype(ml_dtypes.bfloat16)
    assert _attn.view_info(attn._arrays.arg(b))[0] == b.ctypes.data
    assert _attn.view_info(attn._arrays.arg(b))[3] == "bfloat16"
    # and a transposed view computes what its contiguous copy computes
    qt = a.transpose(0, 2, 1, 3)
    np.testing.assert_array_equal(attn.attention(qt, qt, qt), attn.attention(*(np.ascontiguousarray(qt),) * 3))


def test_kv_cache_written_in_place():
    """attention_with_kv_cache writes the new keys into the caller's buffers (a transposed
    torch view here) and reads the cache in place."""
    B, Hkv, cap, D = 2, 2, 8, 4
    store = torch.zeros(B, cap, Hkv, D)
    K = store.transpose(1, 2)                 # [B, Hkv, cap, D], not contiguous
    V = torch.zeros(B, Hkv, cap, D)
    lens = torch.tensor([0, 3])
    V[1, :, :3] = torch.randn(Hkv, 3, D)
    K[1, :, :3] = torch.randn(Hkv, 3, D)
    q, k1, v1 = torch.randn(B, 2, 1, D), torch.randn(B, Hkv, 1, D), torch.randn(B, Hkv, 1, D)
    out = attn.attention_with_kv_cache(q, k1, v1, K, V, lens, is_causal=True)
    assert torch.equal(K[0, :, 0], k1[0, :, 0]) and torch.equal(store[0, 0], k1[0, :, 0])
    assert torch.equal(K[1, :, 3], k1[1, :, 0]) and torch.equal(V[1, :, 3], v1[1, :, 0])
    want = ref_attention(q[1:].numpy(), K[1:, :, :4].numpy(), V[1:, :, :4].numpy())
    assert_close(out[1:], want, 1e-5, "batch 1")
    assert torch.equal(lens, torch.tensor([0, 3])), "lengths are the caller's to advance"


def test_kv_cache_read_only_refused_by_name():
    """A read-only cache is refused with the message of every written argument (writable_arg),
    naming which of the two it is; the other stays untouched."""
    B, Hkv, cap, D = 1, 1, 4, 4
    q, k1, v1 = (np.ones((B, 1, 1, D), np.float32) for _ in range(3))
    lens = np.zeros(B, np.int64)
    for which in ("key", "value"):
        K, V = np.zeros((B, Hkv, cap, D), np.float32), np.zeros((B, Hkv, cap, D), np.float32)
        (K if which == "key" else V).flags.writeable = False
        with pytest.raises(TypeError, match=f"^attention_with_kv_cache: cache {which} must be a writable array"):
            attn.attention_with_kv_cache(q, k1, v1, K, V, lens)
        assert not K.any() and not V.any()


def test_backward_numpy(rng):
    q, k, v = (rng.standard_normal((1, 2, 3, 4)) for _ in range(3))
    r = attn.attention(q, k, v, return_lse=True)
    g = attn.attention_backward(q, k, v, r.out, np.ones_like(r.out), r.lse)
    assert g.dq.shape == q.shape and g.dk.shape == k.shape and g.dv.shape == v.shape
    np.testing.assert_allclose(g.dv.sum(axis=2), np.full((1, 2, 4), 3.0), rtol=1e-12)  # Σ_i p_ij summed over j = Nq


def test_bad_input_messages():
    q = np.zeros((1, 2, 3, 4), np.float32)
    with pytest.raises(TypeError, match=r"^attention: q, k, v have dtypes float32, float64, float32"):
        attn.attention(q, q.astype(np.float64), q)
    with pytest.raises(TypeError, match=r"attention: q has dtype int64"):
        attn.attention(q.astype(np.int64), q, q)
    with pytest.raises(TypeError, match=r"uint8"):
        attn.attention(q.astype(np.uint8), q, q)
    with pytest.raises(ValueError, match=r"^attention: q, k, v have 3, 4, 4 dims"):
        attn.attention(q[0], q, q)
    with pytest.raises(TypeError, match=r"attention: q is a list, expected an array"):
        attn.attention([[1.0]], q, q)
    with pytest.raises(ValueError, match=r"alignment 'sideways' is not one of"):
        attn.attention(q, q, q, alignment="sideways")
    with pytest.raises(ValueError, match=r"backend: 'gpu' is not one of"):
        attn.attention(q, q, q, backend="gpu")
    with pytest.raises(ValueError, match=r"num_threads = -1"):
        attn.attention(q, q, q, num_threads=-1)
    with pytest.raises(TypeError, match=r"attention: attn_mask has dtype"):
        attn.attention(q, q, q, attn_mask=np.zeros((3, 3), np.int32))
    with pytest.raises(ValueError, match=r"attention_family: unknown option 'bandwith'"):
        attn.attention_family(q, q, q, score="gaussian", bandwith=1.0)
    with pytest.raises(TypeError, match=r"torch.uint16"):
        attn.attention(torch.zeros(1, 1, 1, 1, dtype=torch.uint16), q, q)
    import attn.torch as at
    with pytest.raises(TypeError, match=r"scaled_dot_product_attention: query is a ndarray"):
        at.scaled_dot_product_attention(q, q, q)


def test_tensor_without_cpu_memory_refused():
    """A tensor attn cannot read on the CPU (a meta tensor here: no GPU on this machine) is
    refused with a TypeError naming the argument, never read."""
    t = torch.zeros(1, 1, 2, 2)
    with pytest.raises(TypeError, match=r"attention: q is a torch.Tensor, expected an array"):
        attn.attention(torch.empty(1, 1, 2, 2, device="meta"), t, t)


def test_gil_released_while_computing():
    """Another Python thread runs while attn computes: its counter advances during the call."""
    q = np.random.default_rng(0).standard_normal((1, 4, 1024, 64)).astype(np.float32)
    count, done = [0], threading.Event()

    def spin():
        while not done.is_set():
            count[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    try:
        time.sleep(0.01)
        before = count[0]
        attn.attention(q, q, q, backend="reference", num_threads=1)
        during = count[0] - before
    finally:
        done.set()
        th.join()
    assert during > 1000, during


def test_family_positional_numpy(rng):
    q, k, v = (rng.standard_normal((1, 1, 4, 3)) for _ in range(3))
    out = attn.attention_family(q, k, v, score="dot", distribution="softmax")
    s = q @ np.swapaxes(k, -1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-10)
    alpha = attn.attention_weights(q, k, v, score="dot", distribution="hardmax")
    assert alpha.shape == (1, 1, 4, 4) and set(np.unique(alpha)) <= {0.0, 1.0}
    pe = attn.sinusoidal(6, 4)
    assert pe.dtype == np.float32 and pe.shape == (6, 4)
    np.testing.assert_allclose(pe[3, 0], np.sin(3.0), rtol=1e-6)
    np.testing.assert_allclose(pe[3, 3], np.cos(3.0 * 10000 ** (-2 / 4)), rtol=1e-6)
    x = rng.standard_normal((1, 2, 5, 4))
    y = attn.rotary(x, 7)
    np.testing.assert_allclose(attn.rotary_backward(y, 7), x, rtol=1e-12, atol=1e-12)
    ids = np.array([[3, 0, 9, 2, 2]])  # position ids as int32 (Hugging Face's often are): the int64 result
    np.testing.assert_array_equal(attn.rotary(x, ids.astype(np.int32)), attn.rotary(x, ids))
    bias = attn.t5_relative_bias(rng.standard_normal((32, 2)).astype(np.float32), 3, 5)
    assert bias.shape == (1, 2, 3, 5)
    assert attn.t5_relative_buckets(2, 2, bidirectional=False).tolist() == [[0, 0], [1, 0]]


def test_linear_attention_numpy(rng):
    q, k, v = rng.standard_normal((1, 2, 5, 3)), rng.standard_normal((1, 1, 6, 3)), rng.standard_normal((1, 1, 6, 2))
    phi = lambda x: np.where(x > 0, x + 1, np.exp(x))  # noqa: E731 - elu + 1
    s = phi(q) @ np.swapaxes(phi(k), -1, -2)                       # [1, 2, 5, 6]
    s = s * (np.arange(6)[None, :] <= np.arange(5)[:, None])       # causal, top-left
    want = (s @ v) / s.sum(-1, keepdims=True)
    np.testing.assert_allclose(attn.linear_attention(q, k, v, is_causal=True), want, rtol=1e-10)
    np.testing.assert_allclose(attn.linear_attention(q, k, v, is_causal=True, normalize=False), s @ v, rtol=1e-10)
    dq, dk, dv = attn.linear_attention_backward(q, k, v, np.ones((1, 2, 5, 2)), feature_map="relu")
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    with pytest.raises(ValueError, match="linear_attention: takes no attn_mask"):
        attn.linear_attention(q, k, v, attn_mask=np.ones((5, 6), dtype=bool))


def test_explain_backend_and_backends():
    q = np.zeros((1, 1, 2, 4), np.float32)
    assert attn.backends()[-1] == "reference"
    assert "runs on cpu" in attn.explain_backend(q, q, q, return_qk="probabilities")
    q64 = q.astype(np.float64)
    assert "cpu: float64 inputs need the reference; runs on reference" in attn.explain_backend(q64, q64, q64)


def test_plot_attention(tmp_path, rng):
    q, k, v = (rng.standard_normal((1, 1, 3, 4)) for _ in range(3))
    alpha = attn.attention_weights(q, k, v)
    path = tmp_path / "alpha.png"
    attn.plot_attention(alpha, x_labels=list("abcd")[:3], y_labels=["x", "y", "z"], path=str(path))
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="x_labels"):
        attn.plot_attention(alpha, x_labels=["a"])


def test_any_dlpack_producer():
    """An object that only speaks DLPack is read too (NumPy comes back)."""
    t = torch.randn(1, 2, 3, 4)

    class Producer:
        def __dlpack__(self, stream=None, **kw):
            return t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return t.__dlpack_device__()

    out = attn.attention(Producer(), Producer(), Producer())
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, attn.attention(t, t, t).numpy())


def test_num_threads_honoured_and_bitwise_stable(rng):
    """num_threads reaches attn::execution: any thread count gives bitwise the same result
    (work is split by shape only), and a bad count is refused."""
    q, k, v = (rng.standard_normal((1, 4, 67, 32)).astype(np.float32) for _ in range(3))
    one = attn.attention(q, k, v, is_causal=True, num_threads=1)
    two = attn.attention(q, k, v, is_causal=True, num_threads=2)
    np.testing.assert_array_equal(one, two)
    with pytest.raises(TypeError, match="num_threads must be an int"):
        attn.attention(q, k, v, num_threads="two")


@pytest.mark.parametrize("distribution,k_top", [("hardmax", 1), ("topk", 4)])
def test_family_returns_the_kept_keys(distribution, k_top):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((2, 3, 6, 8)).astype(np.float32)
    k = rng.standard_normal((2, 3, 11, 8)).astype(np.float32)
    v = rng.standard_normal((2, 3, 11, 5)).astype(np.float32)
    r = attn.attention_family(q, k, v, distribution=distribution, top_k=k_top, return_kept=True)
    assert r.kept_index.shape == (2, 3, 6, k_top) and r.kept_index.dtype == np.int64
    assert r.kept_weight.shape == (2, 3, 6, k_top) and r.kept_weight.dtype == np.float32
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(8)
    want = np.sort(np.argsort(-s, axis=-1)[..., :k_top], axis=-1)
    np.testing.assert_array_equal(r.kept_index, want)
    top = np.take_along_axis(s, want, axis=-1)
    w = np.exp(top - top.max(-1, keepdims=True))
    np.testing.assert_allclose(r.kept_weight, w / w.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    out = np.einsum("bhik,bhikd->bhid", r.kept_weight.astype(np.float64),
                    np.take_along_axis(v[:, :, None], r.kept_index[..., None], axis=3))
    np.testing.assert_allclose(r.out, out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(attn.attention_family(q, k, v, distribution=distribution, top_k=k_top), r.out)
    soft = attn.attention_family(q, k, v, return_kept=True)
    assert soft.kept_index is None and soft.kept_weight is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_into_writes_the_callers_arrays(dtype):
    """attention_into / attention_backward_into: the bits of attention / attention_backward in
    arrays the caller owns — out a strided slice, dq/dk/dv interleaved in one packed [B, N, 4, H·D]
    torch buffer (slot 3 untouched) — and the same for a float64 NumPy call."""
    torch.manual_seed(3)
    B, N, H, D = 2, 9, 3, 8
    q, k, v = (torch.randn(B, N, H * D).to(dtype) for _ in range(3))
    heads = dict(q_num_heads=H, kv_num_heads=H, is_causal=True)
    r = attn.attention(q, k, v, return_lse=True, **heads)
    big = torch.full((B, N, 2, H * D), 7.25, dtype=dtype)
    lse = torch.full((B, H, N), 7.25)
    assert attn.attention_into(q, k, v, big[:, :, 1], lse, **heads) == r.backend
    assert torch.equal(big[:, :, 1], r.out) and torch.equal(lse, r.lse)
    assert torch.all(big[:, :, 0] == 7.25)
    dout = torch.randn(B, N, H * D).to(dtype)
    want = attn.attention_backward(q, k, v, r.out, dout, r.lse, **heads)
    packed = torch.full((B, N, 4, H * D), 7.25, dtype=dtype)
    g = attn.attention_backward_into(q, k, v, r.out, dout, r.lse, packed[:, :, 0], packed[:, :, 1], packed[:, :, 2],
                                     **heads)
    assert g.backend == want.backend and g.dattn_mask is None
    for got, w in ((packed[:, :, 0], want.dq), (packed[:, :, 1], want.dk), (packed[:, :, 2], want.dv)):
        assert torch.equal(got, w)
    assert torch.all(packed[:, :, 3] == 7.25)
    qn, kn, vn = (x.to(torch.float64).numpy() for x in (q, k, v))
    rn = attn.attention(qn, kn, vn, return_lse=True, **heads)
    on, ln = np.zeros_like(rn.out), np.zeros_like(rn.lse)
    attn.attention_into(qn, kn, vn, on, ln, **heads)
    np.testing.assert_array_equal(on, rn.out)
    np.testing.assert_array_equal(ln, rn.lse)


def test_backward_into_float32_gradients_of_bfloat16():
    """float32 dq/dk/dv for bfloat16 q, k, v (a mixed-precision trainer's gradients): rounded to
    bfloat16 they are attention_backward's, and they carry more than bfloat16 holds; a float64
    destination is refused by message."""
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 3, 11, 8).to(torch.bfloat16) for _ in range(3))
    r = attn.attention(q, k, v, return_lse=True)
    dout = torch.randn(2, 3, 11, 8).to(torch.bfloat16)
    want = attn.attention_backward(q, k, v, r.out, dout, r.lse)
    dq, dk, dv = (torch.empty(2, 3, 11, 8) for _ in range(3))
    attn.attention_backward_into(q, k, v, r.out, dout, r.lse, dq, dk, dv)
    for got, w in ((dq, want.dq), (dk, want.dk), (dv, want.dv)):
        assert torch.equal(got.to(torch.bfloat16), w)
    assert not torch.equal(dq, dq.to(torch.bfloat16).float())
    with pytest.raises(TypeError, match=r"^attention_backward_into: dk has dtype float64, expected bfloat16 or "
                                         r"float32 \(the dtype of q, or float32 for a 16-bit q\)"):
        attn.attention_backward_into(q, k, v, r.out, dout, r.lse, dq, torch.empty(2, 3, 11, 8, dtype=torch.float64), dv)


def test_into_bad_destinations():
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    out = torch.empty(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"^attention_into: out has shape \[1, 2, 5, 3\], expected \[1, 2, 5, 4\]"):
        attn.attention_into(q, k, v, torch.empty(1, 2, 5, 3))
    with pytest.raises(ValueError, match=r"^attention_into: out shares memory with input q"):
        attn.attention_into(q, k, v, q)
    with pytest.raises(ValueError, match=r"^attention_into: out and lse share memory"):
        attn.attention_into(q, k, v, out, out.view(-1)[:10].view(1, 2, 5))
    ro = np.zeros((1, 2, 5, 4), np.float32)
    ro.setflags(write=False)
    with pytest.raises(TypeError, match=r"^attention_into: out must be a writable array"):
        attn.attention_into(q.numpy(), k.numpy(), v.numpy(), ro)
    r = attn.attention(q, k, v, return_lse=True)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    with pytest.raises(ValueError, match=r"^attention_backward_into: dq and dv share memory"):
        attn.attention_backward_into(q, k, v, r.out, r.out, r.lse, dq, dk, dq)


def test_cached_buffers_are_reused_and_released():
    """A result of 8 MiB or more, freed, is kept and comes back for the next of its size (the same
    memory); release_cached_buffers empties the cache and says how much it gave back."""
    attn.release_cached_buffers()
    assert attn.cached_buffer_bytes() == 0
    q = np.zeros((1, 16, 1024, 128), np.float32)  # out: 8 MiB
    out = attn.attention(q, q, q)
    addr = out.__array_interface__["data"][0]
    del out
    assert attn.cached_buffer_bytes() == 8 << 20
    again = attn.attention(q, q, q)
    assert again.__array_interface__["data"][0] == addr and attn.cached_buffer_bytes() == 0
    del again
    assert attn.release_cached_buffers() == 8 << 20 and attn.cached_buffer_bytes() == 0
