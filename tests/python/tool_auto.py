"""`tool_choice: "auto"` holds calls to their schemas: 20 seeded requests
(sampled at several temperatures, half streamed), each an agent loop's next
turn, over tools with varied schemas (enums, required fields, nested
objects, `additionalProperties: false`, patterns, bounds);
every call returned validates against its function's `parameters` (the
`jsonschema` package), and a reply that ended normally never holds a call
opening `{"name":` in its text (a started call cannot leave the schema)."""

import json
import random
import re

import jsonschema

from common import MODEL, check, client, log

c = client()


def fn(name, description, properties, required):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


TOOLS = [
    fn("get_weather", "The current weather in a city.",
       {"city": {"type": "string", "maxLength": 20}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
       ["city", "unit"]),
    fn("book_flight", "Books a flight between two airports.",
       {"origin": {"type": "string", "pattern": "^[A-Z]{3}$"}, "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"type": "string", "enum": ["economy", "business"]}},
       ["origin", "destination", "passengers"]),
    fn("create_event", "Adds an event to the calendar.",
       {"title": {"type": "string", "maxLength": 30},
        "when": {"type": "object", "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                                                  "hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                 "required": ["date", "hour"], "additionalProperties": False},
        "attendees": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
       ["title", "when"]),
    fn("set_light", "Switches a room's light.",
       {"room": {"type": "string", "enum": ["kitchen", "bedroom", "office"]}, "on": {"type": "boolean"},
        "brightness": {"type": "integer", "minimum": 0, "maximum": 100}},
       ["room", "on"]),
    fn("search", "Searches the web.",
       {"query": {"type": "string", "maxLength": 40}, "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
       ["query"]),
]
# each request continues an agent loop: an earlier call of one tool (valid
# arguments), its result, and a new ask for the same tool, which is what gets
# a 135M model to call at all
EXAMPLE = {
    "get_weather": ({"city": "Oslo", "unit": "celsius"}, "And in Lisbon?"),
    "book_flight": ({"origin": "OSL", "destination": "CDG", "passengers": 1}, "Now one from LIS to JFK for 2."),
    "create_event": ({"title": "Lunch", "when": {"date": "2026-12-01", "hour": 12}},
                     "Also a team meeting on 2026-12-03 at 10."),
    "set_light": ({"room": "office", "on": False}, "Now turn on the kitchen light."),
    "search": ({"query": "largest lake"}, "Now search for the tallest building in Europe."),
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

rng = random.Random(33)
calls_seen = 0
for i in range(20):
    tools = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    used = rng.choice(tools)["function"]["name"]
    args, ask = EXAMPLE[used]
    messages = [
        {"role": "user", "content": "Please help."},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "c0", "type": "function", "function": {"name": used, "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": "c0", "content": "done"},
        {"role": "user", "content": ask},
    ]
    kw = dict(model=MODEL, messages=messages, tools=tools, max_tokens=96, temperature=rng.choice([0, 0.3, 0.7]),
              seed=i, parallel_tool_calls=rng.random() < 0.5)
    if i % 2:
        calls, content, finish = {}, "", None
        for chunk in c.chat.completions.create(stream=True, **kw):
            for ch in chunk.choices:
                content += ch.delta.content or ""
                finish = ch.finish_reason or finish
                for tc in ch.delta.tool_calls or []:
                    cur = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                    cur["name"] += (tc.function.name or "") if tc.function else ""
                    cur["arguments"] += (tc.function.arguments or "") if tc.function else ""
        got = [(v["name"], v["arguments"]) for _, v in sorted(calls.items())]
    else:
        r = c.chat.completions.create(**kw)
        ch = r.choices[0]
        content, finish = ch.message.content or "", ch.finish_reason
        got = [(t.function.name, t.function.arguments) for t in ch.message.tool_calls or []]
    names = [t["function"]["name"] for t in tools]
    log(f"auto {i}: finish {finish}, calls {got}, content {content[:60]!r}")
    for name, args in got:
        check(name in names, f"request {i}: call of undeclared {name}")
        jsonschema.validate(json.loads(args), SCHEMAS[name])
        calls_seen += 1
    if got:
        check(finish == "tool_calls", f"request {i}: finish {finish} with calls")
        check(kw["parallel_tool_calls"] or len(got) == 1, f"request {i}: {len(got)} calls without parallel_tool_calls")
    if finish == "stop":
        check(not re.search(r'\{\s*"name"\s*:', content), f"request {i}: a started call came back as text: {content!r}")
check(calls_seen > 0, "no request of 20 made a call: the grammar's call branch was never exercised")
log(f"tool_auto.py: {calls_seen} calls, all valid")
