"""ONNX Runtime as an outside oracle for the ONNX semantics: one-node `Attention` models
(opsets 23 and 24) built with the onnx helper API, run on ORT's CPU provider, compared with
attn.attention under the mapping of include/attn/onnx.h (causal after the past; at the end of
nonpad_kv_seqlen without a past)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import attn

ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16, np.bool_: TensorProto.BOOL,
        np.int64: TensorProto.INT64}


def run_ort(opset, feeds, attrs, outs):
    names = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    node_inputs = [n if n in feeds else "" for n in names]
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    node = helper.make_node("Attention", node_inputs, outs, **attrs)
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, ELEM[feeds[n].dtype.type], list(feeds[n].shape)) for n in names if n in feeds],
        [helper.make_tensor_value_info(o, ELEM[feeds["Q"].dtype.type], None) for o in outs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def rnd(rng, *shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CASES = {
    "4d": dict(shape="4d"),
    "3d_gqa": dict(shape="3d", Hq=4, Hkv=2),
    "bool_mask_broadcast": dict(mask="bool"),
    "float_mask_causal": dict(mask="float", is_causal=1),
    "causal_rect": dict(is_causal=1, Nq=3, Nk=6),
    "softcap_scale": dict(softcap=2.0, scale=0.3),
    "past_causal": dict(past=4, is_causal=1),
    "past_gqa_mask": dict(past=3, Hq=4, Hkv=1, mask="float"),
    "qk_output": dict(qk_mode=3, mask="float"),
    "f16": dict(dtype=np.float16),
}


@pytest.mark.parametrize("opset", [23, 24])
@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_vs_onnxruntime(opset, name):
    c = CASES[name]
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    dt = c.get("dtype", np.float32)
    B, Hq, Hkv = 2, c.get("Hq", 2), c.get("Hkv", 2)
    Nq, Nk, D, Dv, P = c.get("Nq", 5), c.get("Nk", 5), 8, 6, c.get("past", 0)
    feeds, attrs, kw = {}, {}, {}
    if c.get("shape") == "3d":
        feeds["Q"], feeds["K"], feeds["V"] = rnd(rng, B, Nq, Hq * D, dtype=dt), rnd(rng, B, Nk, Hkv * D, dtype=dt), rnd(rng, B, Nk, Hkv * Dv, dtype=dt)
        attrs.update(q_num_heads=Hq, kv_num_heads=Hkv)
        kw.update(q_num_heads=Hq, kv_num_heads=Hkv)
    else:
        feeds["Q"], feeds["K"], feeds["V"] = rnd(rng, B, Hq, Nq, D, dtype=dt), rnd(rng, B, Hkv, Nk, D, dtype=dt), rnd(rng, B, Hkv, Nk, Dv, dtype=dt)
    total = P + Nk
    if c.get("mask") == "bool":
        m = rng.random((1, Hq, Nq, total)) < 0.7
        m[..., 0] = True
        feeds["attn_mask"] = m
    elif c.get("mask") == "float":
        feeds["attn_mask"] = rnd(rng, Nq, total, dtype=dt)
    if P:
        feeds["past_key"], feeds["past_value"] = rnd(rng, B, Hkv, P, D, dtype=dt), rnd(rng, B, Hkv, P, Dv, dtype=dt)
        kw.update(past_key=feeds["past_key"], past_value=feeds["past_value"], alignment="after_past")
    for a in ("is_causal", "softcap", "scale"):
        if a in c:
            attrs[a] = c[a]
            kw[a] = c[a]
    outs = ["Y", "present_key", "present_value"] if P else ["Y"]
    if "qk_mode" in c:
        attrs["qk_matmul_output_mode"] = c["qk_mode"]
        kw["return_qk"] = ["softcapped", "softcapped", "biased", "probabilities"][c["qk_mode"]]
        outs = ["Y", "", "", "qk_matmul_output"]
    ref = run_ort(opset, feeds, attrs, outs)
    got = attn.attention(feeds["Q"], feeds["K"], feeds["V"], attn_mask=feeds.get("attn_mask"), **kw)
    tol = 2e-2 if dt == np.float16 else 2e-5
    if isinstance(got, attn.AttentionResult):
        mine = {"Y": got.out, "present_key": got.present_key, "present_value": got.present_value,
                "qk_matmul_output": got.qk}
        got = [mine[o] for o in outs if o]
    else:
        got = [got]
    for i, (a, e) in enumerate(zip(got, ref)):
        assert a.shape == e.shape and a.dtype == e.dtype, (i, a.shape, e.shape, a.dtype, e.dtype)
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=tol, atol=tol, err_msg=f"output {i}")


def test_nonpad_kv_seqlen_opset24():
    """opset 24's nonpad_kv_seqlen: keys past each batch entry's length are excluded."""
    rng = np.random.default_rng(5)
    q, k, v = rnd(rng, 2, 2, 4, 8), rnd(rng, 2, 2, 6, 8), rnd(rng, 2, 2, 6, 8)
    lens = np.array([6, 3], dtype=np.int64)
    (ref,) = run_ort(24, {"Q": q, "K": k, "V": v, "nonpad_kv_seqlen": lens}, {}, ["Y"])
    got = attn.attention(q, k, v, nonpad_kv_seqlen=lens)
    np.testing.assert_allclose(got, ref, rtol=2e-5, atol=2e-5)


def test_onnxruntime_supports_attention_at_23_and_24():
    """The installed ORT registers the Attention kernel at both opsets (else the test above
    would be comparing nothing)."""
    rng = np.random.default_rng(0)
    x = rnd(rng, 1, 1, 2, 4)
    for opset in (23, 24):
        (y,) = run_ort(opset, {"Q": x, "K": x, "V": x}, {}, ["Y"])
        assert y.shape == (1, 1, 2, 4)


def test_short_mask_padding_is_attn_only():
    """ONNX pads a mask whose last dim is shorter than the total key length with -inf; ORT
    1.32's CPU kernel refuses such a mask instead. attn follows the spec: checked against the
    explicitly padded mask, and ORT's refusal is stated."""
    rng = np.random.default_rng(9)
    q, k, v = rnd(rng, 1, 2, 3, 4), rnd(rng, 1, 2, 6, 4), rnd(rng, 1, 2, 6, 4)
    short = rnd(rng, 3, 4)
    padded = np.concatenate([short, np.full((3, 2), -np.inf, np.float32)], axis=1)
    np.testing.assert_allclose(attn.attention(q, k, v, attn_mask=short),
                               attn.attention(q, k, v, attn_mask=padded), rtol=1e-6, atol=1e-6)
    with pytest.raises(Exception, match="total_sequence_length"):
        run_ort(23, {"Q": q, "K": k, "V": v, "attn_mask": short}, {}, ["Y"])
