"""Structured output and tool calling through the official `openai` client:
`chat.completions.parse` with a Pydantic model returns a parsed
object; `json_object` and `guided_regex` hold; a tool-calling round trip
(the model calls a function, the client sends the `tool` result, the model
answers) works whole and streamed; bad schemas, grammars and tool
definitions are 400s naming the field, and the server keeps serving."""

import json
import re

import openai
from pydantic import BaseModel, Field

from common import MODEL, check, client, log, request

c = client()
CHAT = "/v1/chat/completions"


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)
    population_millions: int = Field(ge=0, le=40)


# chat.completions.parse with a Pydantic model
r = c.chat.completions.parse(
    model=MODEL,
    messages=[{"role": "user", "content": "Describe Paris as JSON with its name, country and population in millions."}],
    response_format=City,
    max_tokens=64,
    temperature=0,
)
ch = r.choices[0]
log("parse:", repr(ch.message.content), ch.finish_reason)
check(ch.finish_reason == "stop", f"parse finish_reason {ch.finish_reason}")
check(isinstance(ch.message.parsed, City), f"parsed {ch.message.parsed!r}")
check(0 <= ch.message.parsed.population_millions <= 40, f"parsed {ch.message.parsed!r}")

# json_object: any JSON object
r = c.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Give a JSON object describing a cat."}],
    response_format={"type": "json_object"},
    max_tokens=48,
    temperature=0,
)
text = r.choices[0].message.content
log("json_object:", repr(text), r.choices[0].finish_reason)
if r.choices[0].finish_reason == "stop":
    check(isinstance(json.loads(text), dict), f"json_object gave {text!r}")
else:
    check(text.startswith("{"), f"json_object gave {text!r}")

# lamina extension: guided_regex (and on completions too)
r = c.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "When did the Berlin wall fall?"}],
    max_tokens=16,
    temperature=0,
    extra_body={"guided_regex": "[12][0-9]{3}"},
)
year = r.choices[0].message.content
check(re.fullmatch("[12][0-9]{3}", year) is not None, f"guided_regex gave {year!r}")
r = c.completions.create(
    model=MODEL, prompt="The answer is", max_tokens=8, temperature=0,
    extra_body={"guided_grammar": 'start: " yes" | " no"'},
)
check(r.choices[0].text in (" yes", " no"), f"guided_grammar gave {r.choices[0].text!r}")

# bad schemas and grammars: 400 naming the field, and the server goes on
def bad(param, needle, **extra):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    body.update(extra)
    status, _, v = request("POST", CHAT, body)
    check(status == 400, f"{extra}: status {status}: {v}")
    e = v["error"]
    check(e["param"] == param, f"{extra}: param {e['param']!r}, want {param!r}: {e}")
    check(needle in e["message"], f"{extra}: message {e['message']!r} does not name {needle!r}")


bad("response_format", "frobnicate",
    response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frobnicate"}}})
bad("response_format.json_schema.name", "name",
    response_format={"type": "json_schema", "json_schema": {"name": "no spaces", "schema": {"type": "object"}}})
bad("response_format.type", "xml", response_format={"type": "xml"})
bad("guided_regex", "regex", guided_regex="[a-")
bad("guided_grammar", "undefined_rule", guided_grammar="start: undefined_rule")
bad("guided_grammar", "combined", guided_regex="a", guided_grammar='start: "a"')

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
bad("tools[0].function.name", "letters", tools=[{"type": "function", "function": {"name": "get weather"}}])
bad("tools[0].function.parameters", "object", tools=[{"type": "function", "function": {"name": "f", "parameters": 3}}])
bad("tools[0].type", "retrieval", tools=[{"type": "retrieval", "function": {"name": "f"}}])
bad("tools", "frobnicate",
    tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}}])
bad("parallel_tool_calls", "boolean", tools=[WEATHER], parallel_tool_calls="yes")
bad("tool_choice.function.name", "nope", tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
bad("tool_choice", "tools", tool_choice="auto")
bad("functions", "Unsupported", functions=[{"name": "f"}])

# tool-calling round trip, not streamed
Q = [{"role": "user", "content": "What is the weather in Paris?"}]
r = c.chat.completions.create(
    model=MODEL, messages=Q, tools=[WEATHER], tool_choice="required", max_tokens=48, temperature=0,
)
ch = r.choices[0]
log("tool call:", ch.message.tool_calls, ch.finish_reason)
check(ch.finish_reason == "tool_calls", f"finish_reason {ch.finish_reason}: {ch.message}")
check(ch.message.content is None, f"content {ch.message.content!r}")
call = ch.message.tool_calls[0]
check(call.type == "function" and call.function.name == "get_weather" and call.id, f"call {call}")
args = json.loads(call.function.arguments)
check(isinstance(args.get("city"), str), f"arguments {args}")
history = Q + [
    {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
    {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"celsius": 21, "sky": "sunny"})},
]
r = c.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=32, temperature=0)
answer = r.choices[0]
log("answer:", repr(answer.message.content), answer.finish_reason)
check(answer.finish_reason in ("stop", "length", "tool_calls"), f"answer {answer}")
check(answer.message.content or answer.message.tool_calls, f"empty answer {answer}")

# the same round trip streamed, with a named function
stream = c.chat.completions.create(
    model=MODEL, messages=Q, tools=[WEATHER], max_tokens=48, temperature=0, stream=True,
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
)
calls, finish, content = {}, None, ""
for chunk in stream:
    for choice in chunk.choices:
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            cur = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            cur["id"] = tc.id or cur["id"]
            if tc.function is not None:
                cur["name"] += tc.function.name or ""
                cur["arguments"] += tc.function.arguments or ""
        finish = choice.finish_reason or finish
log("streamed call:", calls, finish)
check(finish == "tool_calls" and content == "", f"stream finish {finish}, content {content!r}")
check(list(calls) == [0] and calls[0]["name"] == "get_weather" and calls[0]["id"], f"calls {calls}")
check(json.loads(calls[0]["arguments"]) == args, f"streamed arguments {calls[0]['arguments']!r} != {args}")
history = Q + [
    {"role": "assistant", "tool_calls": [{"id": calls[0]["id"], "type": "function",
                                          "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}]},
    {"role": "tool", "tool_call_id": calls[0]["id"], "content": "21 degrees and sunny"},
]
stream = c.chat.completions.create(
    model=MODEL, messages=history, tools=[WEATHER], tool_choice="none", max_tokens=24, temperature=0, stream=True,
)
text, finish = "", None
for chunk in stream:
    for choice in chunk.choices:
        check(not choice.delta.tool_calls, "tool_choice none made a call")
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
log("streamed answer:", repr(text), finish)
check(text and finish in ("stop", "length"), f"streamed answer {text!r} {finish}")

# the server still serves a plain request
r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
check(r.choices[0].message.content is not None, "plain request after the errors")
print("structured.py: ok")
