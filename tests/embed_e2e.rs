//! Embeddings through the engine on the real CPU backend (reference and
//! fast paths) with the synthetic `tiny` model: a text's vector is the
//! same alone and in a batch (within 1e-3 cosine), cut into chunks over
//! several passes or not, beside generation or not, and equals the pooled
//! hidden states of one plain `Backend::hidden` call; no KV block is kept.

use std::sync::Arc;
use std::time::Duration;

use contract::{Backend, KvShape, SamplingParams, StepBuilder};
use engine::{EmbedRequest, Engine, EngineConfig, GenerateRequest, Pooling};
use model::cpu::{CpuBackend, CpuPath};
use tokenizer::Tokenizer;

const BLOCK_SIZE: usize = 16;

fn backend(path: CpuPath, num_blocks: usize) -> CpuBackend {
    let dir = lamina_tests::tiny_model(5);
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
    let kv = KvShape {
        num_blocks,
        block_size: BLOCK_SIZE,
    };
    CpuBackend::with_path(loaded.config, weights, kv, path).expect("cpu backend")
}

fn start(path: CpuPath, max_batch_tokens: usize) -> Engine {
    let dir = lamina_tests::tiny_model(5);
    let tok = Arc::new(Tokenizer::from_dir(dir).expect("tokenizer"));
    let cfg = EngineConfig {
        max_num_seqs: 8,
        max_batch_tokens,
        ..EngineConfig::default()
    };
    Engine::start(Box::new(backend(path, 128)), tok, vec![], cfg).expect("engine")
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 31 + salt * 17 + 5) % 250)
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (n(a) * n(b))
}

fn embed(engine: &Engine, inputs: Vec<Vec<u32>>, pooling: Pooling) -> Vec<Vec<f32>> {
    let h = engine
        .embed(EmbedRequest { inputs, pooling })
        .expect("accepted");
    h.blocking_wait().expect("embedded").vectors
}

/// The pooled, normalised states of `ids` from one plain hidden call.
fn direct(path: CpuPath, ids: &[u32], pooling: Pooling) -> Vec<f32> {
    let mut b = backend(path, 64);
    let hidden = b.config().hidden_size;
    let table: Vec<u32> = (0..ids.len().div_ceil(BLOCK_SIZE) as u32).collect();
    let mut sb = StepBuilder::new(BLOCK_SIZE);
    sb.begin();
    sb.push(ids, 0, &table, None).expect("push");
    sb.set_prompt_len(ids.len());
    let rows: Vec<usize> = match pooling {
        Pooling::Last => vec![ids.len() - 1],
        Pooling::Mean => (0..ids.len()).collect(),
    };
    let states = b.hidden(sb.finish(), &rows).expect("hidden");
    let mut v = vec![0f32; hidden];
    for r in states.chunks_exact(hidden) {
        v.iter_mut().zip(r).for_each(|(a, x)| *a += x);
    }
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter().map(|x| x / n).collect()
}

fn wait_free(engine: &Engine) {
    for _ in 0..5000 {
        let s = engine.stats();
        if s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("engine kept KV blocks: {:?}", engine.stats());
}

#[test]
fn alone_and_batched_agree_on_both_paths() {
    let inputs: Vec<Vec<u32>> = [5usize, 140, 17, 64, 1]
        .iter()
        .enumerate()
        .map(|(i, &n)| prompt(n, i as u32))
        .collect();
    for path in [CpuPath::Reference, CpuPath::Fast] {
        // a budget of 48 cuts the long inputs into chunks over several passes
        let engine = start(path, 48);
        for pooling in Pooling::ALL {
            let batched = embed(&engine, inputs.clone(), pooling);
            for (i, ids) in inputs.iter().enumerate() {
                let alone = embed(&engine, vec![ids.clone()], pooling);
                let c = cosine(&alone[0], &batched[i]);
                assert!(c > 1.0 - 1e-3, "{path:?} {pooling}: input {i}: cosine {c}");
                let d = cosine(&direct(path, ids, pooling), &batched[i]);
                assert!(
                    d > 1.0 - 1e-3,
                    "{path:?} {pooling}: input {i} vs direct: {d}"
                );
                let n = batched[i].iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((n - 1.0).abs() < 1e-4, "norm {n}");
            }
        }
        wait_free(&engine);
        engine.shutdown();
    }
}

#[test]
fn embeddings_beside_generation_change_neither() {
    let engine = start(CpuPath::Fast, 64);
    let ids = prompt(90, 9);
    let alone = embed(&engine, vec![ids.clone()], Pooling::Mean);
    let greedy = |n: usize| GenerateRequest {
        prompt: prompt(30 + n, 40 + n as u32),
        sampling: SamplingParams::greedy(),
        max_tokens: 12,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: false,
        lora: None,
    };
    let reqs: Vec<GenerateRequest> = (0..3).map(greedy).collect();
    let before = lamina_tests::run_all(&engine, &reqs);
    let e2 = engine.clone();
    let during = std::thread::spawn(move || embed(&e2, vec![ids; 3], Pooling::Mean));
    let after = lamina_tests::run_all(&engine, &reqs);
    for v in during.join().expect("embedder") {
        let c = cosine(&v, &alone[0]);
        assert!(c > 1.0 - 1e-3, "beside generation: cosine {c}");
    }
    for (a, b) in before.iter().zip(&after) {
        assert_eq!(a.tokens, b.tokens);
    }
    wait_free(&engine);
}
