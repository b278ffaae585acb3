#!/usr/bin/env python3
"""Load/unload cycles of one model of a multi-model `lamina serve` under
light load: no request may fail, and the server's host RSS (and on CUDA the
GPU memory it holds) may not grow past --max-growth between the first
measured cycle and the last.

  model_cycles.py --lamina target/release/lamina --cycled MODEL \
      --other MODEL [--cycles 200] [--device cpu] [--max-growth 0.02] \
      [--port 8031] [--json OUT] [-- EXTRA SERVE FLAGS]

Starts `lamina serve OTHER CYCLED` (both preloaded), then each cycle:
`POST /models/unload` the cycled model, waits until `/models` shows it
unloaded, sends one chat request to it (loaded on demand) and one to the
other model. A thread sends one chat request a second to the other model
throughout. RSS is read from /proc/PID/status (VmRSS) after --settle
cycles and after the last; GPU memory from nvidia-smi when present.
Prints one JSON object (reload seconds p50 / max, RSS before / after,
requests sent / failed) and exits 1 when a request failed or memory grew
past the bound.
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


def call(base, method, path, body=None, timeout=600):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def state(base, name):
    _, v = call(base, "GET", "/models")
    for m in v["data"]:
        if m["id"] == name:
            return m["status"]["value"]
    raise SystemExit(f"{name} is not served: {v}")


def chat(base, name):
    body = {"model": name, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]}
    return call(base, "POST", "/v1/chat/completions", body)[0]


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
    return sum(int(m) for p, m in (l.split(",") for l in out.splitlines() if l)
               if int(p) == pid)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lamina", default="target/release/lamina")
    ap.add_argument("--cycled", required=True)
    ap.add_argument("--other", required=True)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--settle", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--max-growth", type=float, default=0.02)
    ap.add_argument("--port", type=int, default=8031)
    ap.add_argument("--json")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    names = [os.path.basename(a.other.rstrip("/")), os.path.basename(a.cycled.rstrip("/"))]
    server = subprocess.Popen(
        [a.lamina, "serve", "--device", a.device, "--port", str(a.port),
         "--served-model-name", names[0], a.other, a.cycled, *a.extra],
        stderr=subprocess.DEVNULL)
    try:
        t0 = time.time()
        while True:
            try:
                if call(base, "GET", "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() - t0 > 600 or server.poll() is not None:
                raise SystemExit("the server did not come up")
            time.sleep(0.5)
        _, v = call(base, "GET", "/models")
        cycled = v["data"][1]["id"]
        sent, failed, stop = [0], [0], threading.Event()

        def background():
            while not stop.is_set():
                sent[0] += 1
                failed[0] += chat(base, names[0]) != 200
                time.sleep(1.0)

        bg = threading.Thread(target=background, daemon=True)
        bg.start()
        reloads, before = [], None
        for i in range(a.cycles):
            if i == a.settle:
                before = (rss_kib(server.pid), gpu_mib(server.pid))
            code, v = call(base, "POST", "/models/unload", {"model": cycled})
            failed[0] += code != 200
            while state(base, cycled) != "unloaded":
                time.sleep(0.02)
            t = time.time()
            sent[0] += 2
            failed[0] += chat(base, cycled) != 200
            reloads.append(time.time() - t)
            failed[0] += chat(base, names[0]) != 200
        stop.set()
        bg.join()
        after = (rss_kib(server.pid), gpu_mib(server.pid))
        reloads.sort()
        grew = after[0] > before[0] * (1 + a.max_growth) or (
            before[1] is not None and after[1] > before[1] * (1 + a.max_growth))
        out = {"cycles": a.cycles, "requests": sent[0], "failed": failed[0],
               "reload_s_p50": reloads[len(reloads) // 2], "reload_s_max": reloads[-1],
               "rss_kib_before": before[0], "rss_kib_after": after[0],
               "gpu_mib_before": before[1], "gpu_mib_after": after[1],
               "max_growth": a.max_growth, "ok": not grew and failed[0] == 0}
        print(json.dumps(out))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        sys.exit(0 if out["ok"] else 1)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
