#!/usr/bin/env python3
"""Start-up to ready: runs `lamina serve ARGS...` on a free port and times
from the process start to the first 200 from GET /health (the serve line
"started in" is printed beside it), then stops the server.
Usage: startup.py LAMINA [serve arguments...]"""
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    lamina, rest = sys.argv[1], sys.argv[2:]
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen([lamina, "serve", "--port", str(port), *rest],
                            stderr=subprocess.PIPE, text=True)
    ready = None
    try:
        while time.monotonic() - t0 < 60 and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        ready = time.monotonic() - t0
                        break
            except OSError:
                time.sleep(0.02)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    started = [l for l in err.splitlines() if "started in" in l]
    print(f"RESULT startup to ready: {ready:.2f} s" if ready is not None else "RESULT startup: never ready")
    for line in started:
        print(f"RESULT {line}")
    if ready is None:
        print(err[-2000:])
        sys.exit(1)


if __name__ == "__main__":
    main()
