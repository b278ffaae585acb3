"""The official `anthropic` client against `lamina serve`'s Messages API:
a plain message, a streamed one (Anthropic's event sequence, `ping`
included), a prefilled one (a last assistant turn continued), a stop sequence, a two-turn tool round trip (`tool_use` then
`tool_result`) whole and streamed (also with the assistant's blocks sent
back as `model_dump()` dicts), `count_tokens`, the key as `x-api-key`,
and bad requests answered in Anthropic's error shape."""

import json

import anthropic

from common import API_KEY, BASE, MODEL, check, log, request

c = anthropic.Anthropic(base_url=BASE, api_key=API_KEY, max_retries=0, timeout=300)
MSG = [{"role": "user", "content": "What is the capital of France?"}]
# the 2026 client has no `temperature` argument (current models take none);
# lamina honours it, sent as an extra body field
GREEDY = {"temperature": 0}

# a plain message
m = c.messages.create(model=MODEL, max_tokens=16, messages=MSG, extra_body=GREEDY)
log("message:", m.content, m.stop_reason, m.usage)
check(m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), f"message {m}")
check(m.model == MODEL, f"model {m.model}")
check(len(m.content) == 1 and m.content[0].type == "text" and m.content[0].text, f"content {m.content}")
check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
prompt_tokens = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
check(prompt_tokens > 0 and 0 < m.usage.output_tokens <= 16, f"usage {m.usage}")
plain = m.content[0].text

# prefill: a last assistant turn is the start of the reply, which continues it
PRE = MSG + [{"role": "assistant", "content": "The capital of France is"}]
pm = c.messages.create(model=MODEL, max_tokens=8, messages=PRE, extra_body=GREEDY)
log("prefill:", pm.content, pm.stop_reason)
check(pm.content and pm.content[0].type == "text", f"prefill content {pm.content}")
cont = pm.content[0].text
check(cont.strip() and not cont.lstrip().startswith("The capital"), f"prefill reply repeats the turn: {cont!r}")
n = c.messages.count_tokens(model=MODEL, messages=PRE)
check(n.input_tokens == pm.usage.input_tokens + (pm.usage.cache_read_input_tokens or 0), f"prefill count {n}")

# count_tokens: the prompt as the model saw it
n = c.messages.count_tokens(model=MODEL, messages=MSG)
check(n.input_tokens == prompt_tokens, f"count_tokens {n.input_tokens} != {prompt_tokens}")

# streamed: the same greedy text, the event sequence in order
types, text = [], ""
with c.messages.stream(model=MODEL, max_tokens=16, messages=MSG, extra_body=GREEDY) as s:
    for ev in s:
        types.append(ev.type)
        if ev.type == "content_block_delta" and ev.delta.type == "text_delta":
            text += ev.delta.text
    final = s.get_final_message()
raw = [t for t in types if t in ("message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop")]
check(raw == ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"], f"events {types}")
check(text == plain, f"streamed {text!r} != whole {plain!r}")
check(final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, f"final {final}")
# the wire: event names, and the ping after message_start
status, headers, body = request("POST", "/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": MSG, "stream": True},
                                headers={"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}, key=False)
check(status == 200 and headers["content-type"].startswith("text/event-stream"), f"stream {status} {headers}")
names = [l.split(": ", 1)[1] for l in body.splitlines() if l.startswith("event: ")]
check(names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"], f"event names {names}")

# a stop sequence: the text ends before it, and it is reported
words = plain.split()
if len(words) >= 2:
    stop = words[1]
    cut = c.messages.create(model=MODEL, max_tokens=16, messages=MSG, stop_sequences=[stop], extra_body=GREEDY)
    check(cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, f"stop {cut.stop_reason} {cut.stop_sequence}")
    check(cut.content[0].text == plain[: plain.index(stop)], f"cut text {cut.content[0].text!r}")

# a two-turn tool round trip
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
Q = [{"role": "user", "content": "What is the weather in Paris?"}]
m = c.messages.create(model=MODEL, max_tokens=48, tools=[WEATHER], tool_choice={"type": "any"}, messages=Q,
                      extra_body=GREEDY)
log("tool_use:", m.content, m.stop_reason)
check(m.stop_reason == "tool_use", f"stop_reason {m.stop_reason}: {m.content}")
uses = [b for b in m.content if b.type == "tool_use"]
check(len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_"), f"tool_use {m.content}")
check(isinstance(uses[0].input.get("city"), str), f"input {uses[0].input}")
history = Q + [
    {"role": "assistant", "content": m.content},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                  "content": json.dumps({"celsius": 21, "sky": "sunny"})}]},
]
m2 = c.messages.create(model=MODEL, max_tokens=32, tools=[WEATHER], messages=history, extra_body=GREEDY)
log("answer:", m2.content, m2.stop_reason)
check(m2.stop_reason in ("end_turn", "max_tokens", "tool_use"), f"answer {m2}")
check(m2.content, f"empty answer {m2}")
n = c.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
check(n.input_tokens == m2.usage.input_tokens + (m2.usage.cache_read_input_tokens or 0), f"count_tokens {n}")
# the same round trip as agent loops write it: the assistant's blocks as
# plain dicts, where `model_dump()` keeps `caller`, `toolset_name` and
# `citations` as null
dumped = [b.model_dump() for b in m.content]
check(any("caller" in b and "toolset_name" in b for b in dumped), f"model_dump {dumped}")
history3 = Q + [{"role": "assistant", "content": dumped}] + history[2:]
m3 = c.messages.create(model=MODEL, max_tokens=32, tools=[WEATHER], messages=history3, extra_body=GREEDY)
log("answer (dumped blocks):", m3.content, m3.stop_reason)
prompt = lambda u: u.input_tokens + (u.cache_read_input_tokens or 0)
check(prompt(m3.usage) == prompt(m2.usage), f"dumped prompt {m3.usage} != {m2.usage}")

# the call streamed: a tool_use block with its input as JSON deltas
with c.messages.stream(model=MODEL, max_tokens=48, tools=[WEATHER],
                       tool_choice={"type": "tool", "name": "get_weather"}, messages=Q, extra_body=GREEDY) as s:
    deltas = [ev.delta.type for ev in s if ev.type == "content_block_delta"]
    final = s.get_final_message()
check(final.stop_reason == "tool_use" and final.content[0].type == "tool_use", f"streamed call {final}")
check(final.content[0].input == uses[0].input, f"streamed input {final.content[0].input} != {uses[0].input}")
check(deltas and set(deltas) == {"input_json_delta"}, f"deltas {deltas}")

# structured output: output_config.format holds the reply to a JSON schema
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}},
        "required": ["name"], "additionalProperties": False}
m = c.messages.create(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "Name a city as JSON."}],
                      output_config={"format": {"type": "json_schema", "schema": CITY}}, extra_body=GREEDY)
log("output_config:", m.content, m.stop_reason)
if m.stop_reason == "end_turn":
    check(set(json.loads(m.content[0].text)) == {"name"}, f"output_config.format gave {m.content}")

# errors in Anthropic's shape
def bad(exc, status, kind, needle, **kw):
    try:
        c.messages.create(**kw)
    except exc as e:
        check(e.status_code == status, f"{kw}: status {e.status_code}")
        body = e.body
        check(body["type"] == "error" and body["error"]["type"] == kind, f"{kw}: body {body}")
        check(needle in body["error"]["message"], f"{kw}: {body['error']['message']!r} lacks {needle!r}")
        return
    raise AssertionError(f"{kw} was accepted")


bad(anthropic.BadRequestError, 400, "invalid_request_error", "thinking",
    model=MODEL, max_tokens=8, messages=MSG, thinking={"type": "enabled", "budget_tokens": 1024})
bad(anthropic.BadRequestError, 400, "invalid_request_error", "image",
    model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [{"type": "image"}]}])
bad(anthropic.BadRequestError, 400, "invalid_request_error", "stop_sequences",
    model=MODEL, max_tokens=8, messages=MSG, stop_sequences=["a", "b", "c", "d", "e"])
bad(anthropic.NotFoundError, 404, "not_found_error", "claude", model="claude-nope", max_tokens=8, messages=MSG)
status, _, v = request("POST", "/v1/messages", {"model": MODEL, "messages": MSG})
check(status == 400 and v["type"] == "error" and "max_tokens" in v["error"]["message"], f"no max_tokens: {status} {v}")
wrong = anthropic.Anthropic(base_url=BASE, api_key="wrong", max_retries=0)
try:
    wrong.messages.create(model=MODEL, max_tokens=4, messages=MSG)
    raise AssertionError("a wrong key was accepted")
except anthropic.AuthenticationError as e:
    check(e.body["error"]["type"] == "authentication_error", f"401 body {e.body}")
log("anthropic_api.py: ok")
