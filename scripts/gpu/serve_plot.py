#!/usr/bin/env python3
"""Latency against throughput from a `lamina bench-serve --json` sweep.

  serve_plot.py SWEEP.json [OUT.svg]

Prints one table row per arrival rate (output tok/s, TTFT and TPOT p50 /
p99) as markdown; with OUT.svg and matplotlib importable, also plots TTFT
and TPOT (p50 and p99) against output tok/s, one point per rate.
"""
import json
import sys


def main():
    doc = json.load(open(sys.argv[1]))
    runs = doc["runs"]
    print(f"{doc['num_prompts']} requests, prompts {doc['input_len']} tokens, "
          f"outputs {doc['output_len']} tokens")
    print("| rate (req/s) | req/s | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 / p99 (ms) | ITL p99 (ms) |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        rate = r["request_rate"]
        rate = rate if isinstance(rate, str) else f"{rate:g}"
        print(f"| {rate} | {r['request_throughput']:.1f} | {r['output_throughput']:,.0f} | "
              f"{r['ttft_ms']['p50']:.1f} / {r['ttft_ms']['p99']:.1f} | "
              f"{r['tpot_ms']['p50']:.2f} / {r['tpot_ms']['p99']:.2f} | {r['itl_ms']['p99']:.2f} |")
    if len(sys.argv) < 3:
        return
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plot")
        return
    x = [r["output_throughput"] for r in runs]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, name in ((a, "ttft_ms", "time to first token"), (b, "tpot_ms", "time per output token")):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(x, [r[key][q] for r in runs], style, label=q)
        ax.set_xlabel("output tok/s")
        ax.set_ylabel("ms")
        ax.set_title(name)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"lamina serve, H200: {doc['input_len']} in, {doc['output_len']} out, "
                 "Poisson arrivals (one point per rate)")
    fig.tight_layout()
    fig.savefig(sys.argv[2])
    print(f"plot: {sys.argv[2]}")


if __name__ == "__main__":
    main()
