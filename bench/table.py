#!/usr/bin/env python3
"""bench/table.py CSV — Markdown tables of an `attn bench --csv` file, as in docs/PERFORMANCE.md:
one table per (pass, dtype, threads); GFLOP/s (and % of the probed FMA peak) for prefill,
GB/s of K/V read (and % of the probed DRAM read bandwidth) for decode; the last column is
attn's speed-up over the best peer measured in the same run."""
import csv
import sys
from collections import OrderedDict

IMPLS = [("attn", "attn"), ("blas_unfused", "OpenBLAS unfused"), ("torch_sdpa", "torch SDPA"),
         ("ggml_flash_attn_ext", "ggml FA"), ("ort_attention", "ONNX Runtime")]


def shape(r):
    h = r["Hq"] if r["Hq"] == r["Hkv"] else f"{r['Hq']}/{r['Hkv']}"
    if r["Nq"] == "1":
        return f"decode Hq/Hkv={h} Nk={r['Nk']} D={r['D']}"
    return f"H={h} N={r['Nq']} D={r['D']}" + (" causal" if r["causal"] == "true" else "")


def main(path):
    rows = list(csv.DictReader(open(path)))
    groups = OrderedDict()
    for r in rows:
        groups.setdefault((r["pass"], r["dtype"], r["threads"]), OrderedDict()).setdefault(shape(r), {})[r["impl"]] = r
    for (pas, dt, thr), shapes in groups.items():
        any_row = next(iter(next(iter(shapes.values())).values()))
        print(f"\n**{pas}, {dt}, {thr} threads** — FMA peak {float(any_row['peak_gflops']):.0f} GFLOP/s, "
              f"DRAM read {float(any_row['dram_gbps'] or 0):.1f} GB/s (probed in the same run)\n")
        present = [(k, n) for k, n in IMPLS if any(k in s for s in shapes.values())]
        print("| shape | " + " | ".join(n for _, n in present) + " | attn vs best peer |")
        print("|---|" + "---:|" * (len(present) + 1))
        for name, impls in shapes.items():
            decode = name.startswith("decode")
            cells = []
            for k, _ in present:
                r = impls.get(k)
                if r is None:
                    cells.append("—")
                elif decode:
                    cells.append(f"{float(r['gbps']):.1f} GB/s ({float(r['pct_dram'] or 0):.0f} %)")
                else:
                    cells.append(f"{float(r['gflops']):.0f} ({float(r['pct_peak']):.0f} %)")
            peers = [float(r["median_ms"]) for k, r in impls.items() if k != "attn"]
            ratio = f"{min(peers) / float(impls['attn']['median_ms']):.2f}×" if peers and "attn" in impls else "—"
            print(f"| {name} | " + " | ".join(cells) + f" | {ratio} |")


if __name__ == "__main__":
    main(sys.argv[1])
