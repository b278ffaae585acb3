//! Throughput of the scheduler-facing bookkeeping: a batch of sequences is
//! admitted, decoded token by token (`can_append` + `append` +
//! `mark_computed` per token), and freed; plus admission of a prompt that
//! hits the prefix cache. One "element" is one manager call.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use paged_kv::{KvConfig, KvManager};

const SEQS: u64 = 64;
const PROMPT: u32 = 512;
const DECODE: u32 = 128;

fn decode_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("kv");
    for cache in [false, true] {
        let cfg = KvConfig {
            num_blocks: 8192,
            block_size: 16,
            enable_prefix_cache: cache,
        };
        let mut kv = KvManager::new(cfg);
        let prompts: Vec<Vec<u32>> = (0..SEQS as u32)
            .map(|s| (0..PROMPT).map(|t| s * PROMPT + t).collect())
            .collect();
        // Calls per iteration: per sequence can_admit + admit + mark_computed + free,
        // and per decoded token can_append + append + mark_computed.
        g.throughput(Throughput::Elements(SEQS * (4 + 3 * u64::from(DECODE))));
        let name = if cache {
            "admit_decode_free/prefix_cache_on"
        } else {
            "admit_decode_free/prefix_cache_off"
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                for (s, p) in prompts.iter().enumerate() {
                    let s = s as u64;
                    assert!(kv.can_admit(p));
                    black_box(kv.admit(s, p).ok());
                    black_box(kv.mark_computed(s, p.len()).ok());
                }
                for t in 0..DECODE {
                    for s in 0..SEQS {
                        if kv.can_append(s, 1) {
                            black_box(kv.append(s, &[t]).ok());
                            black_box(kv.mark_computed(s, (PROMPT + t + 1) as usize).ok());
                        }
                    }
                }
                for s in 0..SEQS {
                    black_box(kv.free(s).ok());
                }
                kv.clear_prefix_cache();
            })
        });
    }

    let mut kv = KvManager::new(KvConfig {
        num_blocks: 8192,
        block_size: 16,
        enable_prefix_cache: true,
    });
    let prompt: Vec<u32> = (0..PROMPT).collect();
    black_box(kv.admit(0, &prompt).ok());
    black_box(kv.mark_computed(0, prompt.len()).ok());
    black_box(kv.free(0).ok());
    g.throughput(Throughput::Elements(2));
    g.bench_function("admit_free_prefix_hit_512", |b| {
        b.iter(|| {
            black_box(kv.admit(1, &prompt).ok());
            black_box(kv.free(1).ok());
        })
    });
    g.finish();
}

criterion_group!(benches, decode_batch);
criterion_main!(benches);
