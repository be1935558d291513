#!/usr/bin/env python3
"""bench/plot.py CSV PNG — chart of an `attn bench --csv` file: GFLOP/s of every implementation per
prefill configuration (with the probed FMA peak), and GB/s of K/V read for decode (with the probed
DRAM read bandwidth). One panel per (pass, dtype, threads)."""
import csv
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

IMPLS = ["attn", "blas_unfused", "torch_sdpa", "ggml_flash_attn_ext", "ort_attention"]
COLORS = {"attn": "#d62728", "blas_unfused": "#7f7f7f", "torch_sdpa": "#1f77b4", "ggml_flash_attn_ext": "#2ca02c",
          "ort_attention": "#9467bd"}


def label(r):
    h = r["Hq"] if r["Hq"] == r["Hkv"] else f"{r['Hq']}/{r['Hkv']}"
    s = f"H{h} N{r['Nq']} D{r['D']}" if r["Nq"] != "1" else f"dec H{h} Nk{r['Nk']}"
    return s + (" c" if r["causal"] == "true" else "")


def main(path, png):
    rows = list(csv.DictReader(open(path)))
    panels = OrderedDict()
    for r in rows:
        kind = "decode" if r["Nq"] == "1" else "prefill"
        panels.setdefault((kind, r["pass"], r["dtype"], r["threads"]), []).append(r)
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 3.4 * len(panels)), squeeze=False)
    for ax, ((kind, pas, dt, thr), rs) in zip(axes[:, 0], panels.items()):
        configs = list(OrderedDict.fromkeys(label(r) for r in rs))
        decode = {label(r) for r in rs if r["Nq"] == "1"}
        width = 0.8 / len(IMPLS)
        for i, impl in enumerate(IMPLS):
            xs, ys = [], []
            for j, c in enumerate(configs):
                m = [r for r in rs if label(r) == c and r["impl"] == impl]
                if m:
                    xs.append(j + (i - 1.5) * width)
                    ys.append(float(m[0]["gbps" if c in decode else "gflops"]))
            if xs:
                ax.bar(xs, ys, width, label=impl, color=COLORS[impl])
        ax.set_xlim(-0.5, len(configs) - 0.5)
        if kind == "decode":
            if rs[0]["dram_gbps"]:
                dram = float(rs[0]["dram_gbps"])
                ax.axhline(dram, color="m", ls=":", lw=1)
                ax.text(len(configs) - 0.5, dram, f"DRAM read {dram:.0f} GB/s", color="m", ha="right", va="bottom",
                        fontsize=8)
            ax.set_ylabel("GB/s of K and V read")
        else:
            peak = float(rs[0]["peak_gflops"])
            ax.axhline(peak, color="k", ls="--", lw=0.8)
            ax.text(len(configs) - 0.5, peak, f"FMA peak {peak:.0f} GFLOP/s", ha="right", va="bottom", fontsize=8)
            ax.set_ylabel("GFLOP/s")
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels(configs, rotation=20, ha="right", fontsize=8)
        ax.set_title(f"{kind} {pas}, {dt}, {thr} threads — {rs[0]['cpu']}", fontsize=10)
        ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
