"""The official `openai` client against `lamina serve`: chat (whole and
streamed), a completion with `stop`, logprobs, seed reproducibility,
/v1/models, and greedy output equal to `lamina generate`."""

import json
import os
import subprocess

from common import MODEL, check, client, log, request

c = client()
MSG = [{"role": "user", "content": "What is the capital of France?"}]

# /v1/models
models = c.models.list()
ids = [m.id for m in models.data]
check(ids == [MODEL], f"/v1/models lists {ids}")
check(c.models.retrieve(MODEL).id == MODEL, "models.retrieve")

# non-streamed chat
r = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=16, temperature=0)
ch = r.choices[0]
check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), f"chat object {r.object} {r.id}")
check(ch.message.role == "assistant" and ch.message.content, f"chat message {ch.message}")
check(ch.finish_reason in ("stop", "length"), f"finish_reason {ch.finish_reason}")
check(r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 16, f"usage {r.usage}")
check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total_tokens")
log("chat:", repr(ch.message.content), ch.finish_reason)
greedy_chat = r

# streamed chat: same greedy text, usage chunk at the end
stream = c.chat.completions.create(
    model=MODEL, messages=MSG, max_tokens=16, temperature=0, stream=True,
    stream_options={"include_usage": True},
)
text, finish, usage, roles = "", None, None, []
for chunk in stream:
    check(chunk.object == "chat.completion.chunk", f"chunk object {chunk.object}")
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.role:
            roles.append(choice.delta.role)
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
check(roles == ["assistant"], f"roles {roles}")
check(text == greedy_chat.choices[0].message.content, f"streamed {text!r} != whole {greedy_chat.choices[0].message.content!r}")
check(finish == greedy_chat.choices[0].finish_reason, f"stream finish {finish}")
check(usage is not None and usage.completion_tokens == greedy_chat.usage.completion_tokens, f"stream usage {usage}")

# completion with stop: the text ends before the stop string
PROMPT = "The capital of France is"
full = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
full_text = full.choices[0].text
log("completion:", repr(full_text))
check(full.object == "text_completion", f"completion object {full.object}")
words = full_text.split()
check(len(words) >= 2, f"completion too short to test stop: {full_text!r}")
stop = words[1]
cut = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
check(cut.choices[0].finish_reason == "stop", f"stop finish {cut.choices[0].finish_reason}")
check(cut.choices[0].text == full_text[: full_text.index(stop)], f"stop text {cut.choices[0].text!r}")
check(stop not in cut.choices[0].text, "stop string leaked")

# logprobs, chat and completion shapes
r = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=5, temperature=0, logprobs=True, top_logprobs=3)
content = r.choices[0].logprobs.content
check(len(content) == r.usage.completion_tokens or len(content) == r.usage.completion_tokens - 1, "one entry per token")
for e in content:
    check(e.logprob <= 0 and len(e.top_logprobs) == 3, f"chat logprob entry {e}")
    check(bytes(e.bytes).decode("utf-8", "replace") == e.token or "\ufffd" in e.token, f"bytes of {e.token!r}")
    # greedy: the chosen token is the most likely one
    check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4, f"greedy pick not top-1: {e}")
if not any("\ufffd" in e.token for e in content):
    check("".join(e.token for e in content) == r.choices[0].message.content, "logprob tokens spell the text")
r = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
lp = r.choices[0].logprobs
check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset), "completion logprob lengths")
check(all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0, f"completion logprobs {lp}")

# seed reproducibility under sampling
def sample(seed):
    r = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=12, temperature=1.0, top_p=0.95, seed=seed)
    return r.choices[0].message.content

a, b = sample(1234), sample(1234)
check(a == b, f"same seed, different text: {a!r} vs {b!r}")
others = {sample(s) for s in (1, 2, 3)}
check(len(others | {a}) > 1, "different seeds all gave the same text")

# greedy output equals `lamina generate` for the same prompt and template
def generate(prompt, chat, max_tokens):
    cmd = [os.environ["LAMINA_BIN"], "generate", "--json", "--temperature", "0", "--max-tokens", str(max_tokens)]
    cmd += os.environ.get("LAMINA_MODEL_ARGS", "").split()
    if chat:
        cmd.append("--chat")
    cmd.append(prompt)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])

g = generate(MSG[0]["content"], True, 16)
status, _, tok = request("POST", "/tokenize", {"messages": MSG})
check(status == 200 and tok["tokens"] == g["prompt_tokens"], "server and generate build the same chat prompt")
check(g["text"] == greedy_chat.choices[0].message.content, f"generate {g['text']!r} != server {greedy_chat.choices[0].message.content!r}")
check(len(g["tokens"]) == greedy_chat.usage.completion_tokens, "same number of tokens")
check(g["finish_reason"] == greedy_chat.choices[0].finish_reason, "same finish reason")
g = generate(PROMPT, False, 24)
check(g["text"] == full_text, f"generate {g['text']!r} != server completion {full_text!r}")

print("openai_client: ok")
