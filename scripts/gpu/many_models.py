#!/usr/bin/env python3
"""Several models in one `lamina serve`, and embeddings: the checks of
scripts/gpu/many_models.sh, each printed as one PASS / FAIL line with its
figures. Standard library only (no `openai` client): the GPU machine may
not have it.

  many_models.py --lamina devrun/lamina --big DIR --small DIR \
      [--device cuda] [--out /tmp/out] PART...

PART is one of:
  throughput  b3 (--b3-requests all at once, fixed lengths and seed) and
              TTFT at --rate req/s through `lamina bench-serve`: each model
              served alone, then both served by one server and loaded at
              once (two bench-serve runs side by side, the small model's
              request count scaled so both runs last about as long). PASS:
              each keeps >= 0.45x its b3 output tok/s alone, and its TTFT
              p99 at --rate is at most 2x alone. Then /metrics must label
              each model's series with its own `model_name`.
  default     both models in one server with the default memory plan (no
              --kv-memory-gib: on CUDA --gpu-memory-utilization split by
              share): both start and answer.
  embed       the same texts embedded with `lamina embed` on the CPU and on
              --device (cosine distance <= 1e-2), and through
              /v1/embeddings one at a time vs all in one request vs all at
              once from threads (<= 1e-3).
  errors      a request, an embedding and a load naming an unknown model:
              404 naming it; a model whose KV pool does not fit: refused at
              start-up, and a 507 from POST /models/load, naming the memory
              needed and free; on CUDA a tiny --gpu-memory-utilization
              refused naming the memory.
The load/unload cycles are scripts/bench/model_cycles.py.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

RESULTS = []


def verdict(name, ok, figures):
    line = f"{'PASS' if ok else 'FAIL'} {name}: {figures}"
    RESULTS.append((name, ok))
    print(line, flush=True)


def call(base, method, path, body=None, timeout=600):
    """(status, parsed JSON body or text) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw or b"null")
    except ValueError:
        return status, raw.decode(errors="replace")


def error_message(body):
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(body)


class Server:
    """`lamina serve` on a port, up until /health answers; stopped on exit."""

    def __init__(self, a, args, log_name):
        self.a, self.base = a, f"http://127.0.0.1:{a.port}"
        self.log = open(os.path.join(a.out, log_name), "w")
        cmd = [a.lamina, "serve", "--device", a.device, "--port", str(a.port),
               "--max-client-requests", "0", *args]
        print("  $ " + " ".join(cmd), flush=True)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def __enter__(self):
        t0 = time.time()
        while time.time() - t0 < 900:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lamina serve exited {self.proc.returncode}: see {self.log.name}")
            try:
                if call(self.base, "GET", "/health", timeout=5)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"lamina serve never became healthy: see {self.log.name}")

    def __exit__(self, *_):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def models_file(a, entries):
    """A models file (JSON) of (name, source, share, preload) entries."""
    path = os.path.join(a.out, "models_" + "_".join(e[0] for e in entries) + ".json")
    with open(path, "w") as f:
        json.dump([{k: v for k, v in (("name", n), ("source", s), ("share", sh), ("preload", p))
                    if v is not None} for n, s, sh, p in entries], f)
    return path


def bench_cmd(a, model, n, rate, tag):
    out = os.path.join(a.out, f"bench_{tag}.json")
    cmd = [a.lamina, "bench-serve", "--url", f"http://127.0.0.1:{a.port}", "--model", model,
           "--num-prompts", str(n), "--request-rate", str(rate),
           "--input-len", str(a.input_len), "--output-len", str(a.output_len),
           "--seed", "0", "--warmup", str(a.warmup), "--json", out,
           # a synthetic model's filler tokens have no text: their log-probs
           # make each token an event, so TTFT is measured
           "--logprobs"]
    return cmd, out


def run_benches(a, jobs):
    """Runs the (model, n, rate, tag) bench-serve jobs side by side; each
    job's first run (as JSON) in order."""
    procs = []
    for model, n, rate, tag in jobs:
        cmd, out = bench_cmd(a, model, n, rate, tag)
        log = open(os.path.join(a.out, f"bench_{tag}.txt"), "w")
        procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), out, log, tag))
    runs = []
    for p, out, log, tag in procs:
        rc = p.wait()
        log.close()
        if not os.path.exists(out):
            raise RuntimeError(f"bench-serve {tag} exited {rc} without results: see {log.name}")
        runs.append(json.load(open(out))["runs"][0])
    return runs


def throughput(a):
    names = {"big": a.big, "small": a.small}
    alone = {}
    for name, src in names.items():
        print(f"== {name} alone", flush=True)
        with Server(a, ["--kv-memory-gib", str(a.kv), "--served-model-name", name, src],
                    f"serve_alone_{name}.log"):
            b3, = run_benches(a, [(name, a.b3_requests, "inf", f"alone_b3_{name}")])
            ttft, = run_benches(a, [(name, a.rate_requests, a.rate, f"alone_rate_{name}")])
        alone[name] = (b3, ttft)
        print(f"  {name}: b3 {b3['output_throughput']:.1f} tok/s, TTFT p99 at {a.rate} req/s "
              f"{ttft['ttft_ms']['p99']:.1f} ms", flush=True)
    print("== both in one server", flush=True)
    spec = models_file(a, [(n, s, 0.5, True) for n, s in names.items()])
    with Server(a, ["--kv-memory-gib", str(2 * a.kv), "--models-file", spec],
                "serve_both.log") as srv:
        # the small model's requests scaled by the throughputs alone, so
        # that both runs overlap for their whole length
        scale = alone["small"][0]["output_throughput"] / max(alone["big"][0]["output_throughput"], 1e-9)
        n_small = max(a.b3_requests, min(round(a.b3_requests * scale), 16 * a.b3_requests))
        both = run_benches(a, [("big", a.b3_requests, "inf", "both_b3_big"),
                               ("small", n_small, "inf", "both_b3_small")])
        rates = run_benches(a, [("big", a.rate_requests, a.rate, "both_rate_big"),
                                ("small", a.rate_requests, a.rate, "both_rate_small")])
        check_metrics(srv.base, list(names))
    durations = [r["duration_s"] for r in both]
    overlap = min(durations) / max(max(durations), 1e-9)
    print(f"  side-by-side b3 durations {durations[0]:.1f} s / {durations[1]:.1f} s "
          f"(overlap {overlap:.0%}; small model {n_small} requests)", flush=True)
    for i, name in enumerate(names):
        b3_alone, ttft_alone = alone[name]
        got, want = both[i]["output_throughput"], b3_alone["output_throughput"]
        ratio = got / max(want, 1e-9)
        failed = both[i]["failed"] + rates[i]["failed"]
        verdict(f"b3 {name} beside the other", ratio >= 0.45 and failed == 0,
                f"{got:.1f} tok/s vs {want:.1f} alone = {ratio:.2f}x (>= 0.45x), {failed} failed")
        t1, t2 = ttft_alone["ttft_ms"]["p99"], rates[i]["ttft_ms"]["p99"]
        # bench-serve reports 0 when no request streamed a token
        measured = t1 > 0 and t2 > 0
        verdict(f"TTFT p99 {name} at {a.rate} req/s each", measured and t2 <= 2 * t1,
                f"{t2:.1f} ms vs {t1:.1f} ms alone = {t2 / max(t1, 1e-9):.2f}x (<= 2x)"
                + ("" if measured else "; not measured: no token was streamed"))


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)')
# server-wide series, not of any one model
GLOBAL = ("lamina_ignored_fields_total",)


def check_metrics(base, names):
    """Each model's series carry its `model_name`, both models generated
    tokens by their own counters, and no model series lacks the label."""
    _, text = call(base, "GET", "/metrics")
    text = text if isinstance(text, str) else ""
    with open(os.path.join(ARGS.out, "metrics_both.txt"), "w") as f:
        f.write(text)
    per_model = {n: set() for n in names}
    generated = dict.fromkeys(names, 0.0)
    unlabelled = set()
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or not m.group(1).startswith(("lamina_", "vllm:")):
            continue
        label = re.search(r'model_name="([^"]*)"', m.group(2) or "")
        if not label:
            if not m.group(1).startswith(GLOBAL):
                unlabelled.add(m.group(1))
            continue
        if label.group(1) in per_model:
            per_model[label.group(1)].add(m.group(1))
            if m.group(1) == "lamina_generation_tokens_total" and "engine=" not in m.group(2):
                generated[label.group(1)] += float(m.group(3))
    want = ["lamina_model_loaded", "lamina_model_memory_bytes", "lamina_requests_finished_total",
            "lamina_time_to_first_token_seconds", "lamina_generation_tokens_total",
            "lamina_kv_cache_usage_perc", "vllm:num_requests_running"]
    missing = {n: [w for w in want if not any(s.startswith(w) for s in per_model[n])]
               for n in names}
    ok = not any(missing.values()) and not unlabelled and all(generated.values())
    verdict("/metrics labelled by model", ok,
            "; ".join(f"{n}: {len(per_model[n])} series, {generated[n]:.0f} tokens generated"
                      + (f", missing {missing[n]}" if missing[n] else "") for n in names)
            + (f"; without model_name: {sorted(unlabelled)}" if unlabelled else ""))


TEXTS = [
    "The lighthouse keeper climbed the stairs at dusk.",
    "a cat",
    "Paged attention keeps the KV cache in fixed-size blocks so that memory is not wasted "
    "on the longest possible sequence; a block table maps each sequence's logical blocks "
    "to physical ones, and blocks are shared between sequences with a common prefix.",
    "1 2 3 4 5 6 7 8 9 10",
    "¿Dónde está la biblioteca? Est-ce loin d'ici ?",
    "def f(x):\n    return x * x\n",
    "Short.",
    "The quick brown fox jumps over the lazy dog. " * 6,
]


def cosine_distance(u, v):
    dot = sum(x * y for x, y in zip(u, v))
    nu, nv = math.sqrt(sum(x * x for x in u)), math.sqrt(sum(y * y for y in v))
    return 1.0 - dot / max(nu * nv, 1e-30)


def cli_embed(a, src, device):
    out = subprocess.run([a.lamina, "embed", "--device", device, "--model", src, *TEXTS],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"lamina embed --device {device} failed: {out.stderr.strip()[-2000:]}")
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
    return [r["embedding"] for r in sorted(rows, key=lambda r: r["index"])]


def http_embed(base, name, inputs):
    code, body = call(base, "POST", "/v1/embeddings", {"model": name, "input": inputs})
    if code != 200:
        raise RuntimeError(f"/v1/embeddings answered {code}: {error_message(body)}")
    return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]


def embed(a):
    for name, src in (("small", a.small), ("big", a.big)):
        ref = cli_embed(a, src, "cpu")
        dev = cli_embed(a, src, a.device)
        worst = max(cosine_distance(u, v) for u, v in zip(ref, dev))
        verdict(f"embeddings {name} CPU vs {a.device}", len(ref) == len(dev) == len(TEXTS)
                and worst <= 1e-2, f"max cosine distance {worst:.2e} over {len(TEXTS)} texts (<= 1e-2)")
        with Server(a, ["--kv-memory-gib", str(a.kv), "--served-model-name", name, src],
                    f"serve_embed_{name}.log") as srv:
            alone = [http_embed(srv.base, name, t)[0] for t in TEXTS]
            batched = http_embed(srv.base, name, TEXTS)
            together = [None] * len(TEXTS)

            def one(i):
                together[i] = http_embed(srv.base, name, [TEXTS[i]])[0]
            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(TEXTS))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        if any(v is None for v in together):
            verdict(f"embeddings {name} alone vs batched", False, "a concurrent request failed")
            continue
        d_batch = max(cosine_distance(u, v) for u, v in zip(alone, batched))
        d_conc = max(cosine_distance(u, v) for u, v in zip(alone, together))
        d_cli = max(cosine_distance(u, v) for u, v in zip(alone, dev))
        verdict(f"embeddings {name} alone vs batched", max(d_batch, d_conc) <= 1e-3,
                f"one request {d_batch:.2e}, concurrent requests {d_conc:.2e} (<= 1e-3); "
                f"server vs `lamina embed` {d_cli:.2e}")


def default(a):
    spec = models_file(a, [("big", a.big, None, True), ("small", a.small, None, True)])
    with Server(a, ["--models-file", spec], "serve_default.log") as srv:
        codes = {}
        for name in ("big", "small"):
            codes[name], _ = call(srv.base, "POST", "/v1/chat/completions", {
                "model": name, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
        _, models = call(srv.base, "GET", "/models")
        kv = {m["id"]: m.get("kv_bytes") for m in models.get("data", [])} if isinstance(models, dict) else {}
    verdict("both models with the default memory plan", all(c == 200 for c in codes.values()),
            ", ".join(f"{n}: {codes[n]}, KV pool {(kv.get(n) or 0) / 2**30:.1f} GiB" for n in codes))


def free_bytes(a):
    """Memory free where the model's KV pool would go: the GPU's (nvidia-smi)
    on CUDA, else the host's MemAvailable."""
    if a.device != "cpu" and shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.free", "--format=csv,noheader,nounits",
                              "-i", "0"], capture_output=True, text=True).stdout
        return int(out.split()[0]) << 20
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    raise RuntimeError("cannot tell the free memory")


def names_memory(text):
    """Whether a message names the memory needed and the memory free."""
    t = text.lower()
    return bool(re.search(r"\d+(\.\d+)? ?(mib|gib|gb|mb)", t)) and "need" in t and ("free" in t or "left" in t)


def errors(a):
    too_much = 2 * free_bytes(a) / 2**30  # GiB of KV pool: twice what is free
    with Server(a, ["--kv-memory-gib", str(a.kv), "--models-file", models_file(
            a, [("small", a.small, 0.5, True), ("big", a.big, 0.5, False)])], "serve_errors.log") as srv:
        for path, body in (("/v1/chat/completions", {"model": "no-such-model", "max_tokens": 4,
                                                     "messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"model": "no-such-model", "prompt": "hi", "max_tokens": 4}),
                           ("/v1/embeddings", {"model": "no-such-model", "input": "hi"}),
                           ("/models/load", {"model": "no-such-model"}),
                           ("/models/unload", {"model": "no-such-model"})):
            code, resp = call(srv.base, "POST", path, body)
            msg = error_message(resp)
            verdict(f"unknown model on {path}", code == 404 and "no-such-model" in msg, f"{code}: {msg[:200]}")
    # the big model's pool larger than the free memory: a load refused
    # naming both (507), the small model and the server unharmed
    spec = models_file(a, [("small", a.small, 0.001, True), ("big", a.big, 0.999, False)])
    with Server(a, ["--kv-memory-gib", f"{too_much / 0.999:.1f}", "--models-file", spec],
                "serve_nofit.log") as srv:
        code, resp = call(srv.base, "POST", "/models/load", {"model": "big"})
        msg = error_message(resp)
        verdict("load that does not fit", code == 507 and "big" in msg and names_memory(msg),
                f"{code}: {msg[:300]}")
        code, resp = call(srv.base, "POST", "/v1/chat/completions", {
            "model": "small", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
        verdict("the other model serves after the refused load", code == 200, f"{code}")
    refused_at_start(a, "start-up with --kv-memory-gib past the free memory",
                     ["--kv-memory-gib", f"{too_much:.1f}", a.big])
    if a.device != "cpu":
        refused_at_start(a, "start-up with --gpu-memory-utilization 0.01",
                         ["--gpu-memory-utilization", "0.01", a.big])


def refused_at_start(a, name, args):
    cmd = [a.lamina, "serve", "--device", a.device, "--port", str(a.port), *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        code, text = out.returncode, (out.stdout + out.stderr).strip()
    except subprocess.TimeoutExpired:
        code, text = None, "still running after 600 s"
    last = text.splitlines()[-1] if text else ""
    verdict(name, code not in (0, None) and names_memory(text), f"exit {code}: {last[:300]}")


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lamina", default="devrun/lamina")
    ap.add_argument("--big", required=True, help="the larger model (synthetic llama-3.2-1b)")
    ap.add_argument("--small", required=True, help="the smaller model (synthetic smollm2-135m)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/out"))
    ap.add_argument("--port", type=int, default=8041)
    ap.add_argument("--kv", type=float, default=8.0, help="GiB of KV pool per model")
    ap.add_argument("--b3-requests", type=int, default=256)
    ap.add_argument("--input-len", default="512")
    ap.add_argument("--output-len", default="128")
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--rate-requests", type=int, default=320)
    ap.add_argument("--warmup", type=int, default=32)
    ap.add_argument("parts", nargs="+", choices=["throughput", "default", "embed", "errors"])
    a = ARGS = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for part in a.parts:
        try:
            {"throughput": throughput, "default": default, "embed": embed, "errors": errors}[part](a)
        except (RuntimeError, OSError, KeyError, ValueError) as e:
            verdict(part, False, f"stopped: {e}")
    bad = [n for n, ok in RESULTS if not ok]
    print(f"== {len(RESULTS) - len(bad)} of {len(RESULTS)} passed" + (f"; failed: {bad}" if bad else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
