//! Deterministic mode end to end: the engine over the fast CPU backend
//! with `CpuBackend::with_deterministic` (the CLI's `--deterministic`), the
//! tiny synthetic model, BF16 weights and a BF16 KV cache (the CLI's
//! defaults). A greedy request with log-probabilities and a seeded sampled
//! one give the same tokens and the same log-probability bits alone, in a
//! batch of requests of other lengths, with prefill cut into chunks of 7
//! tokens, after a prefix-cache hit on most of their prompt, and with
//! sequences preempted and recomputed in a pool too small for the batch.
//! The companion test runs the same variants without the mode and finds
//! some of them differ in the bits: the mode is what makes them equal.
//!
//! Costs: a few hundred small steps of a 3-layer model, well under a
//! second in release.

use std::sync::Arc;

use contract::{KvCacheDtype, KvShape, SamplingParams};
use engine::{Completion, Engine, EngineConfig, GenerateRequest};
use tokenizer::Tokenizer;

const BLOCK_SIZE: usize = 16;
const MAX_TOKENS: usize = 24;

/// The engine's shape for one variant.
struct Setup {
    num_blocks: usize,
    max_num_seqs: usize,
    max_batch_tokens: usize,
    prefix_cache: bool,
}

const ROOMY: Setup = Setup {
    num_blocks: 64,
    max_num_seqs: 8,
    max_batch_tokens: 512,
    prefix_cache: false,
};

fn start(deterministic: bool, s: &Setup) -> Engine {
    let dir = lamina_tests::tiny_model(11);
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
    let tok = Arc::new(Tokenizer::from_dir(dir).expect("tokenizer"));
    let kv = KvShape {
        num_blocks: s.num_blocks,
        block_size: BLOCK_SIZE,
    };
    let backend = model::cpu::CpuBackend::with_path(
        loaded.config.clone(),
        weights,
        kv,
        model::cpu::CpuPath::Fast,
    )
    .expect("cpu backend")
    .with_kv_cache_dtype(KvCacheDtype::Bf16)
    .with_deterministic(deterministic);
    let e = Engine::start(
        Box::new(backend),
        tok,
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs: s.max_num_seqs,
            max_batch_tokens: s.max_batch_tokens,
            enable_prefix_cache: s.prefix_cache,
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    assert_eq!(e.deterministic(), deterministic);
    e
}

/// A prompt of `len` byte tokens, distinct per `salt`.
fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + salt * 13 + 3) % 251)
        .collect()
}

fn request(prompt: Vec<u32>, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling,
        max_tokens: MAX_TOKENS,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: true,
        lora: None,
    }
}

/// The two requests every variant compares: greedy with the top 5
/// alternatives, and seeded sampling with its log-probability.
fn targets() -> [GenerateRequest; 2] {
    [
        request(
            prompt(45, 1),
            SamplingParams {
                logprobs: 5,
                ..SamplingParams::greedy()
            },
        ),
        request(
            prompt(38, 2),
            SamplingParams {
                temperature: 0.9,
                seed: 77,
                logprobs: 1,
                ..SamplingParams::default()
            },
        ),
    ]
}

/// Requests of other lengths to batch the targets with.
fn others() -> Vec<GenerateRequest> {
    [3, 17, 29, 52, 9, 33]
        .iter()
        .enumerate()
        .map(|(i, &len)| request(prompt(len, 10 + i as u32), SamplingParams::greedy()))
        .collect()
}

/// The targets' completions in each variant, by name.
fn variants(deterministic: bool) -> Vec<(&'static str, Vec<Completion>)> {
    let t = targets();
    let mut out = Vec::new();
    // alone: one request at a time, each prompt in one chunk
    let e = start(deterministic, &ROOMY);
    let alone = t
        .iter()
        .map(|r| lamina_tests::run_all(&e, std::slice::from_ref(r)).remove(0))
        .collect();
    out.push(("alone", alone));
    // batched: amid requests of other lengths, all submitted at once
    let e = start(deterministic, &ROOMY);
    let mut reqs = others();
    reqs.insert(2, t[0].clone());
    reqs.push(t[1].clone());
    let got = lamina_tests::run_all(&e, &reqs);
    out.push(("batched", vec![got[2].clone(), got[reqs.len() - 1].clone()]));
    // chunked prefill: at most 7 tokens a step
    let small = Setup {
        max_num_seqs: 4,
        max_batch_tokens: 7,
        ..ROOMY
    };
    let e = start(deterministic, &small);
    let mut reqs = t.to_vec();
    reqs.extend(others().into_iter().take(2));
    let got = lamina_tests::run_all(&e, &reqs);
    out.push(("chunked", got[..2].to_vec()));
    // prefix-cache hit: a request sharing the first two blocks runs first
    let cached = Setup {
        prefix_cache: true,
        ..ROOMY
    };
    let e = start(deterministic, &cached);
    let hits = t
        .iter()
        .map(|r| {
            let mut primer = r.prompt[..2 * BLOCK_SIZE].to_vec();
            primer.extend(prompt(5, 99));
            lamina_tests::run_all(&e, &[request(primer, SamplingParams::greedy())]);
            lamina_tests::run_all(&e, std::slice::from_ref(r)).remove(0)
        })
        .collect();
    assert!(e.stats().cached_tokens_total >= 4 * BLOCK_SIZE as u64);
    out.push(("prefix-cache hit", hits));
    // preemption: a pool too small for the batch's growth
    let tight = Setup {
        num_blocks: 14,
        max_num_seqs: 6,
        ..ROOMY
    };
    let e = start(deterministic, &tight);
    let mut reqs = t.to_vec();
    reqs.extend(others().into_iter().skip(1).take(3));
    let got = lamina_tests::run_all(&e, &reqs);
    assert!(e.stats().preemptions_total > 0, "{:?}", e.stats());
    out.push(("preempted", got[..2].to_vec()));
    out
}

/// A token's log-probability bits and its alternatives' (id, bits).
type LogprobBits = (u32, Vec<(u32, u32)>);

/// The tokens and the bits of every log-probability.
fn bits(c: &Completion) -> (Vec<u32>, Vec<LogprobBits>) {
    assert_eq!(c.error, None);
    assert_eq!(c.tokens.len(), MAX_TOKENS);
    let lp = c
        .logprobs
        .iter()
        .map(|(p, alts)| {
            let alts = alts.iter().map(|&(t, q)| (t, q.to_bits())).collect();
            (p.to_bits(), alts)
        })
        .collect();
    (c.tokens.clone(), lp)
}

#[test]
fn deterministic_outputs_are_the_same_bits_batched_chunked_cached_and_preempted() {
    let v = variants(true);
    let (base, want) = &v[0];
    for (name, got) in &v[1..] {
        for (i, (w, g)) in want.iter().zip(got).enumerate() {
            assert_eq!(bits(g), bits(w), "request {i}: {name} vs {base}");
        }
    }
}

/// Without the mode the same variants do not all agree in the bits (prompt
/// chunks of 16+ tokens run GEMM attention, shorter ones and recomputed
/// tails the decode kernel; prompt rows run other products than generated
/// ones where the processor has them).
#[test]
fn by_default_some_variants_differ_in_the_bits() {
    let v = variants(false);
    let (_, want) = &v[0];
    let differ: Vec<&str> = v[1..]
        .iter()
        .filter(|(_, got)| got.iter().zip(want).any(|(g, w)| bits(g) != bits(w)))
        .map(|(name, _)| *name)
        .collect();
    eprintln!("without the mode, differing from alone: {differ:?}");
    assert!(
        differ.contains(&"chunked"),
        "chunked prefill gave the same bits without the mode (differing: {differ:?})"
    );
}
