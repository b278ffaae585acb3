"""Every malformed request gets the right status and an OpenAI error body,
and the server still serves a normal request afterwards.

Expects a server started with an API key, `--max-num-seqs 1 --max-queue 1`
(so a third concurrent request finds the queue full) and `--body-limit`
given in LAMINA_BODY_LIMIT."""

import json
import os

import openai

from common import API_KEY, MODEL, check, client, connection, log, request, wait_for, wait_idle

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
BODY_LIMIT = int(os.environ["LAMINA_BODY_LIMIT"])


def chat(**extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    body.update(extra)
    return body


def expect(status, param, method, path, body=None, headers=None, key=True, code=None):
    got, hdrs, v = request(method, path, body, headers, key)
    check(got == status, f"{method} {path} {str(body)[:80]}: status {got}, want {status}: {v}")
    check(isinstance(v, dict) and isinstance(v.get("error"), dict), f"no error object: {v}")
    e = v["error"]
    check(isinstance(e.get("message"), str) and e["message"], f"no message: {v}")
    check(isinstance(e.get("type"), str), f"no type: {v}")
    check("param" in e and "code" in e, f"missing param/code: {v}")
    check(e["param"] == param, f"param {e['param']!r}, want {param!r}: {v}")
    if code is not None:
        check(e["code"] == code, f"code {e['code']!r}, want {code!r}")
    return hdrs, e


cases = [
    # malformed JSON and wrong types
    (400, None, "POST", CHAT, '{"messages": [', "invalid_json"),
    (400, None, "POST", COMP, "not json at all", "invalid_json"),
    (400, "temperature", "POST", CHAT, chat(temperature="hot"), None),
    (400, "messages", "POST", CHAT, chat(messages="Hi"), None),
    (400, "prompt", "POST", COMP, {"model": MODEL}, None),
    # out-of-range parameters
    (400, "temperature", "POST", CHAT, chat(temperature=-0.5), None),
    (400, "top_p", "POST", CHAT, chat(top_p=0), None),
    (400, "top_p", "POST", CHAT, chat(top_p=1.5), None),
    (400, "max_tokens", "POST", CHAT, chat(max_tokens=0), None),
    (400, "max_tokens", "POST", COMP, {"model": MODEL, "prompt": "Hi", "max_tokens": -1}, None),
    (400, "stop", "POST", CHAT, chat(stop=["a", "b", "c", "d", "e"]), None),
    (400, "n", "POST", CHAT, chat(n=0), None),
    (400, "presence_penalty", "POST", CHAT, chat(presence_penalty=3), None),
    (400, "logit_bias", "POST", CHAT, chat(logit_bias={"not-an-id": 1}), None),
    (400, "logit_bias", "POST", CHAT, chat(logit_bias={"1": 200}), None),
    (400, "best_of", "POST", COMP, {"model": MODEL, "prompt": "Hi", "n": 2, "best_of": 1}, None),
    # prompt + max_tokens beyond the context
    (400, "max_tokens", "POST", CHAT, chat(max_tokens=10_000_000), "context_length_exceeded"),
    # unknown model
    (404, "model", "POST", CHAT, chat(model="gpt-9"), "model_not_found"),
    (404, "model", "GET", "/v1/models/gpt-9", None, "model_not_found"),
]
for status, param, method, path, body, code in cases:
    expect(status, param, method, path, body, code=code)

# API key: missing and wrong
expect(401, None, "POST", CHAT, chat(), key=False, code="invalid_api_key")
expect(401, None, "POST", CHAT, chat(), headers={"authorization": "Bearer wrong"}, code="invalid_api_key")
expect(401, None, "GET", "/v1/models", key=False)
try:
    openai.OpenAI(base_url=client().base_url, api_key="wrong", max_retries=0).models.list()
    check(False, "the openai client accepted a wrong key")
except openai.AuthenticationError as e:
    check(e.status_code == 401, "AuthenticationError status")

# body over the limit
big = json.dumps({"model": MODEL, "prompt": "x" * (BODY_LIMIT + 10)})
expect(413, None, "POST", COMP, big, code="request_too_large")

# the openai client surfaces 400s as BadRequestError
try:
    client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=-1)
    check(False, "temperature -1 accepted")
except openai.BadRequestError as e:
    check(e.status_code == 400 and e.body["param"] == "temperature", f"BadRequestError {e.body}")


# queue full: one running, one waiting, the third is refused with 429 + Retry-After
def open_stream(prompt):
    conn = connection()
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 400, "stream": True, "ignore_eos": True})
    conn.request("POST", COMP, body=body, headers={"content-type": "application/json", "authorization": f"Bearer {API_KEY}"})
    resp = conn.getresponse()
    check(resp.status == 200, f"stream status {resp.status}")
    return conn, resp


first = open_stream("One")
wait_for(lambda m: m["lamina_num_requests_running"] == 1, "the first request to run")
second = open_stream("Two")
wait_for(lambda m: m["lamina_num_requests_waiting"] == 1, "the second request to wait")
hdrs, e = expect(429, None, "POST", COMP, {"model": MODEL, "prompt": "Three", "max_tokens": 2}, code="queue_full")
check(hdrs.get("retry-after", "").isdigit(), f"no Retry-After: {hdrs}")
first[1].readline()
for conn, _ in (first, second):
    conn.close()
wait_idle(timeout=120)

# and the server still serves
r = client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
check(r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1, f"normal request after errors: {r}")
log("bad_input: every case answered as expected")
print("bad_input: ok")
