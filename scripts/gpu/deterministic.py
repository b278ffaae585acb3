#!/usr/bin/env python3
"""Deterministic mode over HTTP: 200 completions (prompts of about 10 to
4,000 tokens, greedy and seeded sampling, half of them behind a shared
prefix, log-probabilities on) are sent once each alone, then at three
arrival rates, to `lamina serve --deterministic`, under two server
settings: prefill in chunks of 256 tokens with the prefix cache on, and
whole prompts (8,192-token steps) with the prefix cache off. Every answer
(its text and every token's log-probability, as JSON numbers, which name
an f32 exactly) must equal the first setting's lone answer.

Usage: deterministic.py LAMINA MODEL [--port P]; standard library only.
Prints one RESULT line per run and exits 1 on any difference.
"""
import argparse
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request

WORDS = ("harbor lantern granite tide beacon keeper storm rope compass "
         "north chart signal cliff gull anchor drift mist shore reef light").split()
SETTINGS = [
    ("chunks of 256, prefix cache on", ["--max-batch-tokens", "256"]),
    ("whole prompts, prefix cache off", ["--max-batch-tokens", "8192", "--no-prefix-cache"]),
]
RATES = [("10 req/s", 10.0), ("50 req/s", 50.0), ("all at once", None)]


def requests(n=200):
    rng = random.Random(36)
    prefix = " ".join(rng.choice(WORDS) for _ in range(800))
    out = []
    for i in range(n):
        words = int(10 * (400 ** rng.random()))  # ~10 to ~4,000 tokens, log-uniform
        body = " ".join(rng.choice(WORDS) for _ in range(words))
        prompt = prefix + " " + body if i % 2 else body
        req = {"prompt": prompt, "max_tokens": rng.choice([8, 16, 32]), "logprobs": 1,
               "ignore_eos": True}
        if i % 4 < 2:
            req["temperature"] = 0.0
        else:
            req.update(temperature=0.9, top_p=0.9, seed=1000 + i)
        out.append(req)
    return out


def post(port, req):
    data = json.dumps(dict(req, model="m")).encode()
    r = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=data,
                               headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(r, timeout=600) as resp:
        c = json.loads(resp.read())["choices"][0]
    return c["text"], c["logprobs"]["token_logprobs"]


def run(port, reqs, rate):
    got = [None] * len(reqs)
    if rate == 0.0:
        for i, q in enumerate(reqs):
            got[i] = post(port, q)
        return got

    def one(i):
        got[i] = post(port, reqs[i])

    threads = []
    t0 = time.time()
    for i in range(len(reqs)):
        if rate:
            time.sleep(max(0.0, t0 + i / rate - time.time()))
        t = threading.Thread(target=one, args=(i,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return got


def serve(lamina, model, port, extra):
    p = subprocess.Popen([lamina, "serve", "--device", "cuda", "-m", model, "--port", str(port),
                          "--deterministic", "--kv-memory-gib", "16", "--served-model-name", "m", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return p
        except Exception:
            if p.poll() is not None:
                sys.exit(f"lamina serve exited with {p.returncode}")
            time.sleep(0.5)
    p.kill()
    sys.exit("lamina serve did not come up")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lamina")
    ap.add_argument("model")
    ap.add_argument("--port", type=int, default=8431)
    a = ap.parse_args()
    reqs = requests()
    want = None
    bad = 0
    for label, extra in SETTINGS:
        p = serve(a.lamina, a.model, a.port, extra)
        try:
            for rate_label, rate in [("alone", 0.0)] + RATES:
                t = time.time()
                got = run(a.port, reqs, rate)
                if want is None:
                    want = got
                diff = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
                bad += len(diff)
                print(f"RESULT deterministic http [{label}] {rate_label}: {len(diff)} of "
                      f"{len(reqs)} differ ({time.time() - t:.1f} s){' e.g. ' + str(diff[:5]) if diff else ''}",
                      flush=True)
        finally:
            p.terminate()
            p.wait()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
