#!/usr/bin/env python3
"""Time to first token of the first requests after start against later ones.
Starts `lamina serve ARGS...` on a free port, waits for /health, then sends
ROUNDS rounds of the same requests one after another (streamed completions
of several prompt lengths, so every prefill and decode shape is met for
the first time in round one) and prints each request's TTFT and the
round-one / later medians. A server that warms its step shapes at start
shows no first-round penalty.
Usage: first_requests.py LAMINA [serve arguments...]"""
import http.client
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

ROUNDS = 3
# words per prompt: one prefill shape each, from one chunk to several
LENGTHS = [4, 40, 200, 700, 1500, 3000]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, limit=120):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except OSError:
            time.sleep(0.05)
    return None


def ttft(port, words, salt):
    prompt = f"{salt} " + " ".join(f"word{i % 97}" for i in range(words))
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 4,
                       "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = None
    for line in resp:
        if line.startswith(b"data: {") and first is None:
            first = time.monotonic() - t0
    conn.close()
    if resp.status != 200 or first is None:
        raise RuntimeError(f"request of {words} words: HTTP {resp.status}")
    return first * 1000


def main():
    lamina, rest = sys.argv[1], sys.argv[2:]
    port = free_port()
    proc = subprocess.Popen([lamina, "serve", "--port", str(port), "--served-model-name", "m", *rest],
                            stderr=subprocess.PIPE, text=True)
    try:
        ready = wait_ready(port, proc)
        if ready is None:
            print("RESULT first requests: server never ready")
            return 1
        print(f"RESULT startup to ready: {ready:.2f} s")
        rounds = []
        for r in range(ROUNDS):
            # a new salt each round: no prefix-cache hit across rounds
            ms = [ttft(port, n, f"round{r}") for n in LENGTHS]
            rounds.append(ms)
            print(f"round {r + 1}: " + ", ".join(f"{n} words {t:.1f} ms" for n, t in zip(LENGTHS, ms)))
        first = statistics.median(rounds[0])
        later = statistics.median([t for ms in rounds[1:] for t in ms])
        print(f"RESULT first-round TTFT median {first:.1f} ms, later rounds {later:.1f} ms "
              f"(ratio {first / later:.2f}); worst first {max(rounds[0]):.1f} ms")
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
        for line in err.splitlines():
            if "started in" in line or "warm" in line:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
