"""The official `openai` client's `embeddings.create` against `lamina serve`:
one text and a batch, as floats and as base64 (the client's default, which
it decodes itself), token-id input, the same text alone and in a batch
within 1e-3 cosine, usage, `dimensions` refused unless the hidden size;
and `lamina embed` printing the same vectors."""

import base64
import json
import math
import os
import struct
import subprocess

import openai

from common import MODEL, check, client, log

c = client()


def norm(v):
    return math.sqrt(sum(x * x for x in v))


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


TEXTS = ["The cat sat on the mat.", "Paris is the capital of France.", "def f(x): return x"]

one = c.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
check(one.object == "list" and len(one.data) == 1, f"one: {one.object} {len(one.data)}")
vec = one.data[0].embedding
hidden = len(vec)
check(hidden > 0 and abs(norm(vec) - 1) < 1e-3, f"unit vector of {hidden} values")
check(one.usage.prompt_tokens > 0, f"usage {one.usage}")

# the client's default is base64, which it decodes into floats
b64 = c.embeddings.create(model=MODEL, input=TEXTS[0])
check(cosine(b64.data[0].embedding, vec) > 1 - 1e-6, "base64 equals float")

batch = c.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
check([d.index for d in batch.data] == [0, 1, 2], "batch indexes")
check(cosine(batch.data[0].embedding, vec) > 1 - 1e-3, "alone vs batched within 1e-3 cosine")
check(cosine(batch.data[0].embedding, batch.data[1].embedding) < 0.9999, "different texts differ")
# asked for explicitly, base64 comes back as the string the server sent
b64_batch = c.embeddings.create(model=MODEL, input=TEXTS, encoding_format="base64")
for d, e in zip(b64_batch.data, batch.data):
    raw = base64.b64decode(d.embedding)
    floats = struct.unpack(f"<{len(raw) // 4}f", raw)
    check(len(floats) == hidden, f"base64 batch input {d.index}: {len(floats)} values")
    check(cosine(floats, e.embedding) > 1 - 1e-3, f"base64 batch input {d.index}")
singles = sum(c.embeddings.create(model=MODEL, input=t).usage.prompt_tokens for t in TEXTS)
check(batch.usage.prompt_tokens == singles, f"batch usage {batch.usage.prompt_tokens} vs {singles}")

# token ids
ids = c.embeddings.create(model=MODEL, input=[[1, 2, 3], [4, 5]], encoding_format="float")
check(len(ids.data) == 2 and ids.usage.prompt_tokens == 5, f"token ids usage {ids.usage}")

# dimensions: only the hidden size
c.embeddings.create(model=MODEL, input="x", dimensions=hidden)
try:
    c.embeddings.create(model=MODEL, input="x", dimensions=hidden // 2)
    check(False, "dimensions other than the hidden size accepted")
except openai.BadRequestError as e:
    check(e.body["param"] == "dimensions" and str(hidden) in e.body["message"], f"{e.body}")

# `lamina embed` prints the same vector
lamina = os.environ.get("LAMINA_BIN")
if lamina:
    args = os.environ.get("LAMINA_MODEL_ARGS", f"--model {MODEL}").split()
    out = subprocess.run([lamina, "embed", *args, TEXTS[0]], capture_output=True, text=True, check=True)
    line = json.loads(out.stdout.splitlines()[0])
    check(cosine(line["embedding"], vec) > 1 - 1e-3, "lamina embed vs /v1/embeddings")
log("embeddings: ok,", hidden, "dimensions")
