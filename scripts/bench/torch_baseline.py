#!/usr/bin/env python3
"""The transformers baseline of `lamina bench`: the same workloads on the same
weights, run in the same GPU session so that speed is reported as a ratio.

  torch_baseline.py [--model HF_DIR] [--workloads b1,b2,b3] [--json OUT]
                    [--b1-prompt 128] [--b1-gen 256] [--b2-prompt 2048]
                    [--b3-batch 256] [--b3-prompt 512] [--b3-gen 256]

Without --model: random weights of Llama-3.2-1B's shape (seed 0). BF16 on
CUDA, random prompt ids, greedy, EOS ignored (every request generates
exactly its token count). The default sizes are `lamina bench`'s on CUDA
(`Sizes::CUDA` in crates/cli/src/bench.rs).

  b1  one stream, b1-prompt tokens then b1-gen tokens; tok/s = b1-gen over
      the whole `generate` call (prefill included), twice:
      - eager: transformers' dynamic cache, no compilation;
      - compiled: the gpt-fast recipe as transformers ships it (a static KV
        cache, which makes `generate` torch.compile the decode step and
        replay it as CUDA graphs); warmed until compiled, best of 3.
  b2  time to first token of a b2-prompt-token prompt (`generate` of one
      token), median of 10 after 3 warm-ups, eager.
  b3  b3-batch prompts of b3-prompt tokens, b3-gen tokens each, in one
      batch: output tok/s over the whole call, prefill included, eager.

JSON keys: engine, gpu, b1_eager_tok_s, b1_compiled_tok_s, b2_ttft_2048_ms
(named for the default size, whatever --b2-prompt is), b3_eager_out_tok_s,
and sizes.
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

# Llama-3.2-1B's config.json (what `lamina synth-model --preset llama-3.2-1b` writes)
LLAMA_3_2_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
}
# prompt ids stay below the special tokens of Llama 3's vocabulary
MAX_PROMPT_ID = 128000


def load(path):
    if path:
        return LlamaForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
    torch.manual_seed(0)
    with torch.device("cuda"):
        return LlamaForCausalLM(LlamaConfig(**LLAMA_3_2_1B)).to(torch.bfloat16).eval()


class Runner:
    def __init__(self, model):
        self.model = model
        self.ids = torch.Generator(device="cuda").manual_seed(0)
        self.top = min(model.config.vocab_size, MAX_PROMPT_ID)

    def prompts(self, batch, length):
        return torch.randint(0, self.top, (batch, length), device="cuda", generator=self.ids)

    def generate(self, ids, tokens):
        """Seconds to generate exactly `tokens` greedy tokens after `ids`."""
        torch.cuda.synchronize()
        start = time.perf_counter()
        self.model.generate(
            ids,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        torch.cuda.synchronize()
        return time.perf_counter() - start


def b1(run, sizes, compiled):
    ids = run.prompts(1, sizes.b1_prompt)
    if not compiled:
        run.generate(ids, 16)
        return sizes.b1_gen / run.generate(ids, sizes.b1_gen)
    run.model.generation_config.cache_implementation = "static"
    for _ in range(2):  # the first calls compile and capture
        run.generate(ids, sizes.b1_gen)
    return max(sizes.b1_gen / run.generate(ids, sizes.b1_gen) for _ in range(3))


def b2(run, sizes):
    ids = run.prompts(1, sizes.b2_prompt)
    for _ in range(3):
        run.generate(ids, 1)
    return statistics.median(run.generate(ids, 1) for _ in range(10)) * 1e3


def b3(run, sizes):
    ids = run.prompts(sizes.b3_batch, sizes.b3_prompt)
    run.generate(ids[:, :64], 4)
    return sizes.b3_batch * sizes.b3_gen / run.generate(ids, sizes.b3_gen)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="Hugging Face model directory (default: random Llama-3.2-1B weights)")
    ap.add_argument("--workloads", default="b1,b2,b3", help="comma-separated among b1, b2, b3")
    ap.add_argument("--json", help="write the results here too")
    for name, default in [("b1-prompt", 128), ("b1-gen", 256), ("b2-prompt", 2048),
                          ("b3-batch", 256), ("b3-prompt", 512), ("b3-gen", 256)]:
        ap.add_argument(f"--{name}", type=int, default=default)
    sizes = ap.parse_args()
    work = set(sizes.workloads.split(","))
    unknown = work - {"b1", "b2", "b3"}
    if unknown:
        ap.error(f"--workloads: unknown {sorted(unknown)} (known: b1, b2, b3)")
    engine = f"transformers {transformers.__version__} / torch {torch.__version__}"
    gpu = torch.cuda.get_device_name(0)
    print(engine, gpu, flush=True)
    run = Runner(load(sizes.model))
    res = {"engine": engine, "gpu": gpu,
           "sizes": {k: v for k, v in vars(sizes).items() if k.startswith("b")}}
    with torch.inference_mode():
        if "b1" in work:
            res["b1_eager_tok_s"] = b1(run, sizes, compiled=False)
            print(f"b1 eager: {res['b1_eager_tok_s']:.1f} tok/s", flush=True)
        if "b2" in work:
            res["b2_ttft_2048_ms"] = b2(run, sizes)
            print(f"b2 eager TTFT {sizes.b2_prompt} tokens: {res['b2_ttft_2048_ms']:.2f} ms", flush=True)
        if "b3" in work:
            res["b3_eager_out_tok_s"] = b3(run, sizes)
            print(f"b3 eager batch {sizes.b3_batch}: {res['b3_eager_out_tok_s']:.0f} output tok/s", flush=True)
        if "b1" in work:  # last: the static cache stays on the model
            res["b1_compiled_tok_s"] = b1(run, sizes, compiled=True)
            print(f"b1 static cache + torch.compile: {res['b1_compiled_tok_s']:.1f} tok/s", flush=True)
    print(json.dumps(res))
    if sizes.json:
        with open(sizes.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
