"""The official `openai` client against `lamina serve`'s Responses API:
`responses.create` plain, streamed (the semantic events, numbered), with a
function tool round trip through `function_call_output`, continued with
`previous_response_id`, `retrieve` / `delete` and `store: false`, with a
JSON schema format; bad requests naming the field. Also the chat API's
harmless fields (accepted, ignored, counted) and `parallel_tool_calls`,
and the gateway gauges under vLLM's names."""

import json

import openai

from common import MODEL, check, client, log, request

c = client()
Q = "What is the capital of France?"

# plain
r = c.responses.create(model=MODEL, input=Q, max_output_tokens=16, temperature=0)
log("response:", repr(r.output_text), r.status, r.usage)
check(r.object == "response" and r.id.startswith("resp_") and r.model == MODEL, f"response {r}")
check(r.status in ("completed", "incomplete") and r.output_text, f"status {r.status}: {r.output}")
check(r.output[0].type == "message" and r.output[0].content[0].type == "output_text", f"output {r.output}")
check(r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 16, f"usage {r.usage}")
check(r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens, "total_tokens")
if r.status == "incomplete":
    check(r.incomplete_details.reason == "max_output_tokens", f"incomplete {r.incomplete_details}")

# streamed: the same greedy text; created first, completed last, numbered
events = list(c.responses.create(model=MODEL, input=Q, max_output_tokens=16, temperature=0, stream=True))
types = [e.type for e in events]
log("events:", types[:4], "...", types[-4:])
check(types[:2] == ["response.created", "response.in_progress"], f"first events {types[:2]}")
check(types[-1] in ("response.completed", "response.incomplete"), f"last event {types[-1]}")
for t in ("response.output_item.added", "response.content_part.added", "response.output_text.delta",
          "response.output_text.done", "response.content_part.done", "response.output_item.done"):
    check(t in types, f"no {t} in {types}")
check([e.sequence_number for e in events] == list(range(len(events))), "sequence numbers")
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
check(text == r.output_text, f"streamed {text!r} != whole {r.output_text!r}")
check(events[-1].response.output_text == r.output_text, "final object text")

# a function tool round trip through function_call_output
TOOLS = [{
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}]
W = [{"role": "user", "content": "What is the weather in Paris?"}]
r1 = c.responses.create(model=MODEL, input=W, tools=TOOLS, tool_choice="required", max_output_tokens=48, temperature=0)
calls = [o for o in r1.output if o.type == "function_call"]
log("function_call:", calls)
check(len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id, f"calls {r1.output}")
check(isinstance(json.loads(calls[0].arguments).get("city"), str), f"arguments {calls[0].arguments}")
follow = W + r1.output + [{"type": "function_call_output", "call_id": calls[0].call_id,
                           "output": json.dumps({"celsius": 21, "sky": "sunny"})}]
r2 = c.responses.create(model=MODEL, input=follow, tools=TOOLS, max_output_tokens=32, temperature=0)
log("answer:", r2.output)
check(r2.output and r2.usage.input_tokens > r1.usage.input_tokens, f"answer {r2}")
# the call streamed: arguments as one delta, then done
events = list(c.responses.create(model=MODEL, input=W, tools=TOOLS, tool_choice="required",
                                 max_output_tokens=48, temperature=0, stream=True))
types = [e.type for e in events]
check("response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types, f"{types}")
done = [e for e in events if e.type == "response.function_call_arguments.done"][0]
check(done.arguments == calls[0].arguments, f"streamed arguments {done.arguments}")

# previous_response_id: the stored conversation continues
a = c.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=8, temperature=0)
b = c.responses.create(model=MODEL, previous_response_id=a.id, input="What is my name?", max_output_tokens=8, temperature=0)
check(b.previous_response_id == a.id, f"previous_response_id {b.previous_response_id}")
check(b.usage.input_tokens > a.usage.input_tokens + a.usage.output_tokens, f"continued usage {a.usage} {b.usage}")
got = c.responses.retrieve(a.id)
check(got.id == a.id and got.output_text == a.output_text, f"retrieve {got}")
c.responses.delete(a.id)
for rid in (a.id,):
    try:
        c.responses.retrieve(rid)
        raise AssertionError("a deleted response was found")
    except openai.NotFoundError:
        pass
s = c.responses.create(model=MODEL, input=Q, max_output_tokens=4, temperature=0, store=False)
try:
    c.responses.retrieve(s.id)
    raise AssertionError("a response with store false was stored")
except openai.NotFoundError:
    pass

# a JSON schema format
CITY = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
        "country": {"type": "string", "maxLength": 20}}, "required": ["name", "country"], "additionalProperties": False}
r = c.responses.create(model=MODEL, input="Describe Paris as JSON with its name and country.", max_output_tokens=64,
                       temperature=0, text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}})
log("json_schema:", repr(r.output_text))
obj = json.loads(r.output_text)
check(set(obj) == {"name", "country"}, f"json_schema gave {obj}")

# bad requests name the field
def bad(param, body):
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 4, **body}
    status, _, v = request("POST", "/v1/responses", body)
    check(status == 400 and v["error"]["param"] == param, f"{body}: {status} {v}")


bad("include", {"include": ["message.output_text.logprobs"]})
bad("previous_response_id", {"previous_response_id": "resp_nope"})
bad("max_output_tokens", {"max_output_tokens": 0})
bad("tools[0].type", {"tools": [{"type": "web_search", "name": "w"}]})
bad("text.format.name", {"text": {"format": {"type": "json_schema", "name": "no spaces", "schema": {}}}})

# chat: harmless fields accepted and counted; parallel_tool_calls accepted
before = request("GET", "/metrics", key=False)[2]
cc = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": Q}], max_tokens=4, temperature=0,
                               store=False, metadata={"k": "v"}, service_tier="auto", reasoning_effort="low", user="u")
check(cc.choices[0].message.content is not None, "harmless fields")
cc = c.chat.completions.create(model=MODEL, messages=W, max_tokens=48, temperature=0, parallel_tool_calls=True,
                               tools=[{"type": "function", "function": {"name": t["name"], "parameters": t["parameters"]}} for t in TOOLS],
                               tool_choice="required")
check(cc.choices[0].finish_reason == "tool_calls", f"parallel_tool_calls {cc}")
text = request("GET", "/metrics", key=False)[2]


def count(text, field):
    for line in text.splitlines():
        if line.startswith("lamina_ignored_fields_total{") and f'field="{field}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


for f in ("store", "metadata", "service_tier", "reasoning_effort", "user"):
    check(count(text, f) == count(before, f) + 1, f"ignored field {f} not counted")
for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
    check(any(l.startswith(name + "{") for l in text.splitlines()), f"no {name}")
check(any(l.startswith("vllm:cache_config_info{") and "num_gpu_blocks=" in l for l in text.splitlines()), "vllm:cache_config_info")
log("responses_api.py: ok")
