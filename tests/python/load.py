"""Bounded load test: 64 concurrent streaming clients that must all finish
without error, then 32 that hang up mid-stream; afterwards /metrics must
show no running or waiting request and no KV block in use."""

import time
from concurrent.futures import ThreadPoolExecutor

from common import MODEL, check, client, log, metrics, wait_idle

N_OK = 64
N_DROP = 32
c = client()


def complete(i):
    stream = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": f"Give me a word that rhymes with number {i}."}],
        max_tokens=8, temperature=0.8, seed=i, stream=True,
    )
    text, finish, chunks = "", None, 0
    for chunk in stream:
        chunks += 1
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    check(finish in ("stop", "length"), f"client {i}: finish_reason {finish}")
    check(chunks >= 2, f"client {i}: only {chunks} chunks")
    return text


def hang_up(i):
    stream = c.completions.create(
        model=MODEL, prompt=f"Story number {i}: once upon a time", max_tokens=400,
        temperature=0.8, seed=i, stream=True, extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            break
    stream.close()


before = metrics()
t0 = time.monotonic()
with ThreadPoolExecutor(N_OK) as ex:
    texts = list(ex.map(complete, range(N_OK)))
check(len(texts) == N_OK, "every client finished")
log(f"load: {N_OK} streaming clients done in {time.monotonic() - t0:.1f}s")
wait_idle()

t0 = time.monotonic()
with ThreadPoolExecutor(N_DROP) as ex:
    list(ex.map(hang_up, range(N_DROP)))
log(f"load: {N_DROP} clients hung up after {time.monotonic() - t0:.1f}s")
m = wait_idle(timeout=60)
cancelled = m.get("lamina_requests_finished_total:cancelled", 0) - before.get("lamina_requests_finished_total:cancelled", 0)
check(cancelled >= N_DROP, f"only {cancelled} of {N_DROP} hung-up requests were cancelled")
generated = m["lamina_generation_tokens_total"] - before["lamina_generation_tokens_total"]
check(generated < N_OK * 8 + N_DROP * 400, f"hung-up requests ran to the end ({generated} tokens)")
check(m["lamina_kv_blocks_total"] > 0, "kv_blocks_total reported")
check(m["lamina_time_to_first_token_seconds_count"] >= N_OK, "TTFT histogram counted the requests")
print("load: ok")
