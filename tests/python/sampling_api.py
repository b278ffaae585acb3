"""The official `openai` client against `lamina serve` for the sampling API:
`n` choices (whole and streamed) each equal to a single request
with the documented derived seed, usage counting the prompt once, `best_of`,
`logit_bias` (-100 bans a token, +100 forces it), presence and frequency
penalties reducing repetition, `stop_token_ids`, `echo`, unknown fields
refused naming them, and /detokenize, /version, /openapi.json, /docs."""

from collections import Counter

import openai

from common import MODEL, check, client, log, request

c = client()
PROMPT = "Once upon a time, in a small village,"
MASK = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


CHOICE_STREAM = 0x0063686F69636573  # "\0choices"


def choice_seed(seed, i):
    """contract::sampling::choice_seed, as documented in the README."""
    return seed if i == 0 else splitmix64(seed ^ splitmix64(CHOICE_STREAM ^ i))


def as_i64(u):
    """A u64 seed as the signed 64-bit integer OpenAI's `seed` carries."""
    return u - (1 << 64) if u >= 1 << 63 else u


def ids_of(text):
    status, _, v = request("POST", "/tokenize", {"prompt": text, "add_special_tokens": False})
    check(status == 200, f"/tokenize {status} {v}")
    return v["tokens"]


def text_of(ids):
    status, _, v = request("POST", "/detokenize", {"tokens": ids})
    check(status == 200, f"/detokenize {status} {v}")
    return v["prompt"]


# --- n choices equal single requests with the derived seeds -------------
SEED = 4242
# plain sampling at temperature 1 (top_k / min_p are lamina extensions)
kw = dict(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=1.0, top_p=1.0)
kw_extra = {"top_k": -1, "min_p": 0.0}
many = c.completions.create(n=3, seed=SEED, extra_body=kw_extra, **kw)
check(len(many.choices) == 3, f"n=3 gave {len(many.choices)} choices")
singles = []
for i, ch in enumerate(sorted(many.choices, key=lambda x: x.index)):
    check(ch.index == i, f"choice index {ch.index}")
    one = c.completions.create(n=1, seed=as_i64(choice_seed(SEED, i)), extra_body=kw_extra, **kw)
    singles.append(one)
    check(ch.text == one.choices[0].text, f"choice {i}: {ch.text!r} != single {one.choices[0].text!r}")
log("n=3 texts:", [ch.text for ch in many.choices])
check(len({ch.text for ch in many.choices}) > 1, "three sampled choices all equal")
check(many.usage.prompt_tokens == singles[0].usage.prompt_tokens, f"prompt counted once: {many.usage}")
check(
    many.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles),
    f"completion tokens of every choice: {many.usage}",
)

# streamed, chat: the same per-choice texts as whole responses
MSG = [{"role": "user", "content": "Tell me a short story."}]
ckw = dict(model=MODEL, messages=MSG, max_tokens=8, temperature=1.0, top_p=1.0, seed=SEED, extra_body=kw_extra)
whole = c.chat.completions.create(n=3, **ckw)
stream = c.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **ckw)
texts, usage = ["", "", ""], None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for ch in chunk.choices:
        texts[ch.index] += ch.delta.content or ""
for ch in whole.choices:
    check(texts[ch.index] == ch.message.content, f"streamed choice {ch.index}: {texts[ch.index]!r} != {ch.message.content!r}")
    one = c.chat.completions.create(**{**ckw, "seed": as_i64(choice_seed(SEED, ch.index))})
    check(one.choices[0].message.content == ch.message.content, f"chat choice {ch.index} != single")
check(usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens, f"stream usage {usage}")
check(usage.completion_tokens == whole.usage.completion_tokens, f"stream usage {usage} vs {whole.usage}")

# best_of: n of best_of returned, every generated one billed
r = c.completions.create(best_of=3, n=1, seed=SEED, extra_body=kw_extra, **kw)
check(len(r.choices) == 1, "best_of returns n choices")
check(r.choices[0].text in [s.choices[0].text for s in singles], "best_of picks one of the generated choices")
check(r.usage.completion_tokens == many.usage.completion_tokens, f"best_of usage {r.usage}")

# --- logit_bias ------------------------------------------------------------
greedy = dict(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
base = c.completions.create(**greedy).choices[0].text
first = ids_of(base)[0]
banned = c.completions.create(logit_bias={str(first): -100}, **greedy).choices[0].text
log("greedy:", repr(base), "| first token banned:", repr(banned))
check(ids_of(banned)[0] != first, f"logit_bias -100 did not ban token {first}: {banned!r}")
forced_id = ids_of(" banana")[0]
for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 7}):
    args = {**greedy, **sampling}
    forced = c.completions.create(logit_bias={str(forced_id): 100}, **args).choices[0].text
    check(forced == text_of([forced_id] * 6), f"logit_bias +100 did not force {forced_id} ({sampling}): {forced!r}")
r = c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=4, temperature=0, logit_bias={str(forced_id): 100})
check(r.choices[0].message.content == text_of([forced_id] * 4), f"chat logit_bias: {r.choices[0].message.content!r}")

# --- presence and frequency penalties reduce repetition ----------------------
REP = "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,"
rkw = dict(model=MODEL, prompt=REP, max_tokens=24, temperature=0)


def most_common(text):
    return Counter(ids_of(text)).most_common(1)[0][1]


plain = c.completions.create(**rkw).choices[0].text
freq = c.completions.create(frequency_penalty=2.0, **rkw).choices[0].text
log("repeat:", repr(plain), "| frequency 2:", repr(freq))
check(most_common(freq) < most_common(plain), f"frequency_penalty did not reduce repetition: {freq!r} vs {plain!r}")

# exactly OpenAI's definition: token j generated c_j times so far gets
# logit - c_j * frequency_penalty - (c_j > 0) * presence_penalty. Emulated one
# token at a time with logit_bias on a token-id prompt, it must give the
# same greedy text as the penalties themselves.
changed = 0
for text, fp, pp in ((REP, 2.0, 0.0), (REP, 1.0, 2.0), (REP, 0.0, 2.0), (PROMPT, -2.0, 0.5)):
    P = ids_of(text)
    steps = 12
    plain_ids = c.completions.create(model=MODEL, prompt=P, max_tokens=steps, temperature=0).choices[0].text
    whole = c.completions.create(
        model=MODEL, prompt=P, max_tokens=steps, temperature=0, frequency_penalty=fp, presence_penalty=pp
    ).choices[0].text
    emu, counts = [], Counter()
    for _ in range(steps):
        bias = {str(t): -(n * fp + pp) for t, n in counts.items()}
        one = c.completions.create(model=MODEL, prompt=P + emu, max_tokens=1, temperature=0, logit_bias=bias)
        t = ids_of(one.choices[0].text)
        check(len(t) == 1, f"one token re-tokenized as {t}")
        emu.append(t[0])
        counts[t[0]] += 1
    log(f"frequency {fp}, presence {pp}:", repr(whole), "| without:", repr(plain_ids))
    check(whole == text_of(emu), f"penalties ({fp}, {pp}) {whole!r} != emulated {text_of(emu)!r}")
    changed += whole != plain_ids
check(changed >= 2, f"the penalties changed only {changed} of 4 outputs")

# --- stop_token_ids, echo --------------------------------------------------------
full = c.completions.create(**{**greedy, "max_tokens": 12}).choices[0].text
toks = ids_of(full)
stop_id = toks[2]
cut = c.completions.create(extra_body={"stop_token_ids": [stop_id]}, **{**greedy, "max_tokens": 12}).choices[0]
check(cut.finish_reason == "stop", f"stop_token_ids finish {cut.finish_reason}")
check(full.startswith(cut.text) and len(cut.text) < len(full), f"stop_token_ids text {cut.text!r} of {full!r}")
e = c.completions.create(echo=True, **{**greedy, "max_tokens": 3}).choices[0].text
check(e.startswith(PROMPT) and e[len(PROMPT):] == base[: len(e) - len(PROMPT)], f"echo {e!r}")

# --- unknown fields are refused naming them --------------------------------------
for body in ({"functions": []}, {"frobnicate": 1}):
    try:
        c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2, extra_body=body)
        raise AssertionError(f"{body} accepted")
    except openai.BadRequestError as err:
        name = next(iter(body))
        err_body = err.body if isinstance(err.body, dict) else {}
        err_body = err_body.get("error", err_body)
        check(err.status_code == 400 and err_body.get("param") == name, f"{body}: {err_body}")
        check(name in str(err), f"message does not name {name}: {err}")
# `user` is accepted and ignored on purpose
c.chat.completions.create(model=MODEL, messages=MSG, max_tokens=2, user="someone")

# --- the small endpoints -----------------------------------------------------------
check(text_of(ids_of("Hello world")) == "Hello world", "detokenize(tokenize(x)) == x")
status, _, v = request("GET", "/version", key=False)
check(status == 200 and v["version"], f"/version {status} {v}")
status, _, doc = request("GET", "/openapi.json", key=False)
check(status == 200 and doc["openapi"].startswith("3.1"), f"/openapi.json {status}")
for path in ("/v1/chat/completions", "/v1/completions", "/detokenize", "/docs"):
    check(path in doc["paths"], f"{path} not documented")
status, hdrs, html = request("GET", "/docs", key=False)
check(status == 200 and hdrs["content-type"].startswith("text/html") and "/v1/completions" in html, "/docs")
models = c.models.list().data
check(models[0].model_extra.get("max_model_len", 0) > 0, f"/v1/models max_model_len: {models[0]}")
log("sampling_api.py: ok")
