#!/usr/bin/env python3
"""Output tok/s against batch size, lamina and transformers in one GPU run.

  batch_sweep.py --model DIR [--batches 1,2,...,256] [--prompt 128] [--gen 64]
                 [--lamina devrun/lamina] [--json OUT] [--plot OUT.svg]

For each batch size B: `lamina bench --workloads b3 --b3-batch B` (B random
prompts of --prompt tokens, --gen greedy tokens each, EOS ignored, output
tok/s over the whole run, prefill included) and transformers eager
`generate` on the same weights with the same shapes (the workload of
`torch_baseline.py`'s b3 at other batch sizes). Prints a table; writes the
figures as JSON and, when matplotlib is importable, the plot.
"""
import argparse, json, os, re, subprocess, sys, time


def lamina(binary, model, b, prompt, gen):
    out = subprocess.run(
        [binary, "bench", "--device", "cuda", "--model", model, "--workloads", "b3",
         "--b3-batch", str(b), "--b3-prompt", str(prompt), "--b3-gen", str(gen)],
        capture_output=True, text=True, timeout=300)
    m = re.search(r"b3 throughput .*: ([0-9.]+) output tok/s", out.stdout)
    if not m:
        sys.exit(f"lamina bench at batch {b} failed:\n{out.stdout}\n{out.stderr}")
    return float(m.group(1))


def transformers_eager(model_dir, batches, prompt, gen):
    import torch
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    vocab = model.config.vocab_size
    g = torch.Generator(device="cuda").manual_seed(0)
    res = {}
    with torch.inference_mode():
        def run(ids, n):
            return model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)
        run(torch.randint(0, min(vocab, 128000), (1, 16), device="cuda", generator=g), 4)
        for b in batches:
            ids = torch.randint(0, min(vocab, 128000), (b, prompt), device="cuda", generator=g)
            torch.cuda.synchronize()
            t = time.perf_counter()
            run(ids, gen)
            torch.cuda.synchronize()
            res[b] = b * gen / (time.perf_counter() - t)
            print(f"transformers eager batch {b}: {res[b]:.0f} output tok/s", flush=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--lamina", default="devrun/lamina")
    ap.add_argument("--json")
    ap.add_argument("--plot")
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    lam = {}
    for b in batches:
        lam[b] = lamina(a.lamina, a.model, b, a.prompt, a.gen)
        print(f"lamina batch {b}: {lam[b]:.0f} output tok/s", flush=True)
    hf = transformers_eager(a.model, batches, a.prompt, a.gen)
    print(f"\n| batch | lamina tok/s | transformers eager tok/s | ratio |")
    print(f"|---|---|---|---|")
    for b in batches:
        print(f"| {b} | {lam[b]:.0f} | {hf[b]:.0f} | {lam[b] / hf[b]:.1f}x |")
    res = {"prompt": a.prompt, "gen": a.gen, "lamina": lam, "transformers_eager": hf}
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib not importable: no plot", file=sys.stderr)
            return
        plot(res, a.plot, plt)


def plot(res, path, plt):
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in [("lamina", "lamina"), ("transformers_eager", "transformers eager")]:
        xs = sorted(int(b) for b in res[key])
        ax.plot(xs, [res[key][b if b in res[key] else str(b)] for b in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (sequences decoding together)")
    ax.set_ylabel("output tokens / s")
    ax.set_title(f"Llama-3.2-1B (synthetic), H200: {res['prompt']} in, {res['gen']} out")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plot-only":
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        r = json.load(open(sys.argv[2]))
        plot(r, os.path.splitext(sys.argv[2])[0] + ".svg", plt)
    else:
        main()
