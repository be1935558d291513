"""The C++ WordPiece tokenizer (`attn tokenize`) against Hugging Face `tokenizers` loading the
same tokenizer.json, over the generated corpus: every line's ids must be equal.

usage: tokenizer_check.py ATTN_BINARY MODEL_DIR WORK_DIR
"""
import os
import subprocess
import sys

import tokenizer_corpus
from tokenizers import Tokenizer


def main(attn, model, work):
    os.makedirs(work, exist_ok=True)
    corpus = os.path.join(work, "corpus.txt")
    tokenizer_corpus.main(corpus)
    with open(corpus, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=256)  # sentence-transformers' max_seq_length for this model
    want = [e.ids for e in tok.encode_batch(lines)]
    out = os.path.join(work, "ids.txt")
    subprocess.run([attn, "tokenize", "--model", model, "--input", corpus, "--out", out, "--max-length", "256"],
                   check=True)
    with open(out) as f:
        got = [[int(x) for x in l.split()] for l in f.read().split("\n")[:-1]]
    assert len(got) == len(lines), f"{len(got)} lines of ids for {len(lines)} input lines"
    bad = [i for i in range(len(lines)) if got[i] != want[i]]
    for i in bad[:10]:
        print(f"line {i + 1}: {lines[i]!r}\n  attn:       {got[i]}\n  tokenizers: {want[i]}")
    kinds = sum(1 for l in lines if not l), sum(1 for l in lines if len(l) > 2000)
    print(f"{len(lines) - len(bad)} passed, {len(bad)} failed  ({len(lines)} lines, {kinds[0]} empty, "
          f"{kinds[1]} over 2000 characters, {sum(len(w) for w in want)} ids)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
