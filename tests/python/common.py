"""Shared helpers for the end-to-end scripts that drive `lamina serve`.

Environment (set by crates/cli/tests/server_e2e.rs):
  LAMINA_BASE_URL  http://127.0.0.1:<port> of the running server
  LAMINA_API_KEY   the key the server was started with
  LAMINA_MODEL     the served model id
  LAMINA_BIN       the `lamina` binary (for comparisons with `lamina generate`)
  LAMINA_MODEL_ARGS extra model flags shared with the server (space separated)
"""

import http.client
import json
import os
import sys
import time
import urllib.parse

import openai

BASE = os.environ["LAMINA_BASE_URL"]
API_KEY = os.environ.get("LAMINA_API_KEY", "none")
MODEL = os.environ.get("LAMINA_MODEL", "smollm2-135m-instruct")


def client(**kw):
    """An OpenAI client for the server; retries off so errors surface."""
    return openai.OpenAI(base_url=BASE + "/v1", api_key=API_KEY, max_retries=0, timeout=300, **kw)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def connection(timeout=300):
    u = urllib.parse.urlparse(BASE)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def request(method, path, body=None, headers=None, key=True):
    """One raw request; returns (status, headers dict, parsed JSON or text)."""
    h = {"content-type": "application/json"}
    if key:
        h["authorization"] = f"Bearer {API_KEY}"
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    conn = connection()
    try:
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        data = resp.read()
        hdrs = {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = data.decode("utf-8", "replace")
    return resp.status, hdrs, parsed


def metrics():
    """GET /metrics as {name: value}, labels dropped (first series wins);
    per-replica series (`engine` label) are skipped: the server's totals."""
    status, _, text = request("GET", "/metrics", key=False)
    check(status == 200, f"/metrics answered {status}")
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        if 'engine="' in name_labels:
            continue
        name = name_labels.split("{", 1)[0]
        if "{" in name_labels and "finished_reason=" in name_labels:
            reason = name_labels.split('finished_reason="', 1)[1].split('"', 1)[0]
            name = f"{name}:{reason}"
        out.setdefault(name, float(value))
    return out


def wait_idle(timeout=60.0):
    """Waits until /metrics shows nothing running or waiting and no KV block in use."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics()
        busy = (m["lamina_num_requests_running"], m["lamina_num_requests_waiting"], m["lamina_kv_blocks_used"])
        if busy == (0, 0, 0):
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"server not idle after {timeout}s: running, waiting, kv used = {busy}")
        time.sleep(0.1)


def wait_for(pred, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not pred(metrics()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
