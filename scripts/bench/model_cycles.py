#!/usr/bin/env python3
"""Load/unload cycles of one model of a multi-model `lamina serve` under
light load: no request may be lost or fail, the reload must be quick, and
the server's host RSS (and on CUDA the GPU memory it holds) may not grow
past --max-growth between the first measured cycle and the last.

  model_cycles.py --lamina target/release/lamina --cycled MODEL \
      --other MODEL [--cycles 200] [--device cpu] [--max-growth 0.02] \
      [--max-load-s 3] [--no-autoload] [--port 8031] [--json OUT] \
      [-- EXTRA SERVE FLAGS]

Starts `lamina serve OTHER CYCLED` (both preloaded), then each cycle:
starts a request to the cycled model, `POST /models/unload`s it while that
request runs (the request must still finish), waits until `/models` shows
it unloaded, then reloads it: on even cycles by a request naming it
(loaded on demand), on odd cycles by `POST /models/load` (the load time
reported). Two threads send one request a second each throughout, to the
other model and to the cycled one. RSS is read from /proc/PID/status
(VmRSS) and GPU memory from nvidia-smi (when present) at the start of
every cycle; the median of --window cycles after the first --settle (the
allocator's warm-up) is compared with the median of the last --window.

With --no-autoload the server runs with `--no-models-autoload`: every
reload is by `POST /models/load`, and a request naming the cycled model
while it is unloaded must be a 409 (404 accepted) whose message names the
model; those are counted as refused, not failed.

Prints PASS / FAIL lines and one JSON object (load seconds p50 / max,
first-request seconds after an on-demand load, RSS and GPU memory before /
after, requests sent / failed / refused) and exits 1 on a FAIL.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

CHAT = {"max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}


def call(base, method, path, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw.decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def entry(base, name):
    _, v = call(base, "GET", "/models")
    for m in v["data"]:
        if m["id"] == name:
            return m
    raise SystemExit(f"{name} is not served: {v}")


def message(body):
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", ""))
    return str(body)


class Tally:
    """Requests sent, failed (with the first few reasons) and refused."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent = self.failed = self.refused = 0
        self.reasons = []

    def chat(self, base, name, refusable=False, max_tokens=8):
        code, body = call(base, "POST", "/v1/chat/completions",
                          {**CHAT, "model": name, "max_tokens": max_tokens})
        with self.lock:
            self.sent += 1
            if code == 200:
                return True
            if refusable and code in (404, 409) and name in message(body):
                self.refused += 1
                return False
            self.failed += 1
            if len(self.reasons) < 5:
                self.reasons.append(f"{name}: {code} {message(body)[:200]}")
            return False

    def fail(self, why):
        with self.lock:
            self.failed += 1
            if len(self.reasons) < 5:
                self.reasons.append(why)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def gpu_mib(pid):
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory",
         "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    return sum(int(m) for p, m in (l.split(",") for l in out.splitlines() if l.strip())
               if int(p) == pid)


def wait_until(pred, secs):
    t0 = time.time()
    while time.time() - t0 < secs:
        if pred():
            return True
        time.sleep(0.02)
    return False


def unload_while_running(base, cycled, tally):
    """Starts a request to `cycled`, unloads it once the request runs; the
    request must still finish. Returns once the model shows unloaded."""
    inflight = threading.Thread(target=tally.chat, args=(base, cycled, False, 64))
    inflight.start()
    wait_until(lambda: entry(base, cycled)["running"] > 0, 5)
    code, body = call(base, "POST", "/models/unload", {"model": cycled})
    if code != 200:
        tally.fail(f"unload: {code} {message(body)[:200]}")
    inflight.join()
    if not wait_until(lambda: entry(base, cycled)["status"]["value"] == "unloaded", 120):
        tally.fail(f"{cycled} not unloaded within 120 s")


def reload(base, cycled, by_request, tally, loads, firsts):
    t = time.time()
    if by_request:
        tally.chat(base, cycled)
        firsts.append(time.time() - t)
        return
    code, body = call(base, "POST", "/models/load", {"model": cycled})
    if code != 200:
        tally.fail(f"load: {code} {message(body)[:200]}")
    loads.append(time.time() - t)


def cycles(a, base, server, names):
    cycled, other = names[1], names[0]
    tally, stop = Tally(), threading.Event()
    # the light load on the cycled model pauses while it is unloaded by
    # hand (with autoload a request would load it again mid-cycle, and its
    # requests would muddle which one runs as the unload comes); with
    # autoload off it goes on while the model is unloaded
    gate = threading.Lock()

    def background(name, gated):
        while not stop.is_set():
            if gated:
                with gate:
                    tally.chat(base, name, refusable=a.no_autoload)
            else:
                tally.chat(base, name)
            time.sleep(1.0)

    threads = [threading.Thread(target=background, args=(other, False), daemon=True),
               threading.Thread(target=background, args=(cycled, True), daemon=True)]
    for t in threads:
        t.start()
    loads, firsts, samples = [], [], []
    t0 = time.time()
    for i in range(a.cycles):
        if a.budget_s and time.time() - t0 > a.budget_s:
            break
        a.done = i + 1
        # at the same point of every cycle: both models loaded, idle
        samples.append((rss_kib(server.pid), gpu_mib(server.pid)))
        if a.every and i % a.every == 0:
            print(f"  cycle {i}: RSS {samples[-1][0] / 1024:.0f} MiB, GPU {samples[-1][1]} MiB",
                  file=sys.stderr, flush=True)
        with gate:
            unload_while_running(base, cycled, tally)
            if not a.no_autoload:
                reload(base, cycled, i % 2 == 0, tally, loads, firsts)
        if a.no_autoload:
            # a request now is refused naming the model
            if tally.chat(base, cycled, refusable=True):
                tally.fail(f"{cycled} answered while unloaded with autoload off")
            reload(base, cycled, False, tally, loads, firsts)
        tally.chat(base, other)
    stop.set()
    for t in threads:
        t.join()
    samples.append((rss_kib(server.pid), gpu_mib(server.pid)))
    settle = min(a.settle, max(len(samples) // 2 - 1, 0))
    w = max(1, min(a.window, (len(samples) - settle) // 2))
    return tally, loads, firsts, median(samples[settle:settle + w]), median(samples[-w:])


def median(samples):
    """The median RSS and GPU memory of `samples` (each on its own)."""
    mid = lambda xs: sorted(xs)[len(xs) // 2]
    gpu = [g for _, g in samples if g is not None]
    return mid([r for r, _ in samples]), mid(gpu) if gpu else None


def start(a, base):
    names = [os.path.basename(a.other.rstrip("/")), os.path.basename(a.cycled.rstrip("/"))]
    flags = ["--no-models-autoload"] if a.no_autoload else []
    server = subprocess.Popen(
        [a.lamina, "serve", "--device", a.device, "--port", str(a.port),
         "--max-client-requests", "0", "--served-model-name", names[0], *flags,
         a.other, a.cycled, *a.extra], stderr=a.log, stdout=a.log)
    t0 = time.time()
    while call(base, "GET", "/health", timeout=5)[0] != 200:
        if time.time() - t0 > 600 or server.poll() is not None:
            server.kill()
            raise SystemExit("the server did not come up")
        time.sleep(0.5)
    _, v = call(base, "GET", "/models")
    return server, [v["data"][0]["id"], v["data"][1]["id"]]


def report(a, tally, loads, firsts, before, after):
    pct = lambda b, x: 100.0 * (x - b) / b if b else 0.0
    srt = sorted(loads) or [float("nan")]
    out = {"cycles": a.done, "cycles_asked": a.cycles, "no_autoload": a.no_autoload, "requests": tally.sent,
           "failed": tally.failed, "refused": tally.refused, "first_failures": tally.reasons,
           "load_s_p50": srt[len(srt) // 2], "load_s_max": srt[-1],
           "first_request_s_p50": sorted(firsts)[len(firsts) // 2] if firsts else None,
           "rss_kib_before": before[0], "rss_kib_after": after[0],
           "gpu_mib_before": before[1], "gpu_mib_after": after[1], "max_growth": a.max_growth}
    mode = "autoload off" if a.no_autoload else "on-demand and endpoint loads"
    # None: reported only (--max-growth 0)
    judge = lambda grew: grew <= 100 * a.max_growth if a.max_growth else None
    bound = f", <= {100 * a.max_growth:.0f}%" if a.max_growth else ", not judged"
    checks = [
        (f"cycles ({mode}): no request lost or failed", tally.failed == 0,
         f"{tally.sent} requests, {tally.failed} failed, {tally.refused} refused naming the model"
         + (f"; first: {tally.reasons}" if tally.reasons else "")),
        (f"reload under {a.max_load_s} s", bool(loads) and srt[-1] <= a.max_load_s,
         f"POST /models/load median {srt[len(srt) // 2]:.2f} s, max {srt[-1]:.2f} s over {len(loads)}"
         + (f"; first request of an on-demand load median {out['first_request_s_p50']:.2f} s"
            if firsts else "")),
        ("host RSS growth", judge(pct(before[0], after[0])),
         f"{before[0] / 1024:.0f} -> {after[0] / 1024:.0f} MiB ({pct(before[0], after[0]):+.2f}%{bound})"),
    ]
    if a.done < a.cycles:
        checks.append(("cycles run", False, f"{a.done} of {a.cycles} within --budget-s {a.budget_s}"))
    if before[1] is not None:
        checks.append(("GPU memory growth", judge(pct(before[1], after[1])),
                       f"{before[1]} -> {after[1]} MiB ({pct(before[1], after[1]):+.2f}%{bound})"))
    for name, ok, figures in checks:
        tag = "INFO" if ok is None else "PASS" if ok else "FAIL"
        print(f"{tag} {name}: {figures}", flush=True)
    out["ok"] = all(ok is not False for _, ok, _ in checks)
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return out["ok"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lamina", default="target/release/lamina")
    ap.add_argument("--cycled", required=True)
    ap.add_argument("--other", required=True)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--settle", type=int, default=20,
                    help="cycles before the first memory window (the allocator's warm-up)")
    ap.add_argument("--window", type=int, default=10,
                    help="cycles whose median memory is compared, first and last")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-growth", type=float, default=0.02,
                    help="largest memory growth allowed (0: report it only)")
    ap.add_argument("--max-load-s", type=float, default=3.0)
    ap.add_argument("--no-autoload", action="store_true")
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop cycling after this many seconds (0: none); fewer cycles than asked is a FAIL")
    ap.add_argument("--every", type=int, default=0, help="print RSS and GPU memory every N cycles")
    ap.add_argument("--port", type=int, default=8031)
    ap.add_argument("--json")
    ap.add_argument("--server-log", help="the server's output (default: discarded)")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    a.settle = min(a.settle, max(a.cycles // 2 - 1, 0))
    a.done = 0
    a.log = open(a.server_log, "w") if a.server_log else subprocess.DEVNULL
    base = f"http://127.0.0.1:{a.port}"
    server, names = start(a, base)
    try:
        ok = report(a, *cycles(a, base, server, names))
    finally:
        server.terminate()
        server.wait()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
