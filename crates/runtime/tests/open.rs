//! A runtime opened through the library alone: the tiny synthetic model on
//! the CPU, options as plain structs, one engine that generates.

use checkpoint::synth::{Preset, synth_model};
use contract::SamplingParams;
use engine::GenerateRequest;
use runtime::{Device, KvOptions, ReplicaPlan, Runtime, RuntimeError, RuntimeOptions};

/// The tiny model written to a fresh folder (kept alive by the guard).
fn tiny() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    synth_model(Preset::Tiny, 7, dir.path()).expect("the tiny model");
    let path = dir.path().to_string_lossy().into_owned();
    (dir, path)
}

fn cpu(blocks: usize) -> RuntimeOptions {
    RuntimeOptions {
        device: Device::Cpu,
        kv: KvOptions {
            blocks: Some(blocks),
            ..KvOptions::default()
        },
        ..RuntimeOptions::default()
    }
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt,
        sampling: SamplingParams::greedy(),
        max_tokens,
        stop: Vec::new(),
        ignore_eos: true,
        stop_token_ids: Vec::new(),
        constraint: None,
        speculative: false,
        lora: None,
    }
}

#[test]
fn a_runtime_opens_on_the_cpu_and_generates() {
    let (_guard, path) = tiny();
    let rt = Runtime::open(&path, cpu(8)).unwrap_or_else(|e| panic!("{e}"));
    assert!(!rt.cuda);
    assert!(rt.replicas.is_empty());
    assert_eq!(rt.sizing.kv_blocks, 8);
    assert_eq!(rt.sizing.replicas, 1);
    assert_eq!(rt.max_batch_tokens, runtime::CPU_MAX_BATCH_TOKENS);
    let prompt = rt.tokenizer.encode("the runtime", true).expect("encode");
    let vocab = rt.model.config.vocab_size as u32;
    let run = |n| {
        let h = rt.engine.submit(greedy(prompt.clone(), n)).expect("submit");
        h.blocking_collect()
    };
    let first = run(6);
    assert_eq!(first.error, None);
    assert_eq!(first.tokens.len(), 6);
    assert!(
        first.tokens.iter().all(|&t| t < vocab),
        "{:?}",
        first.tokens
    );
    // greedy: the same prompt gives the same tokens (from the prefix cache)
    assert_eq!(run(6).tokens, first.tokens);
    rt.engine.shutdown();
}

#[test]
fn cpu_replicas_start_one_engine_each() {
    let (_guard, path) = tiny();
    let opts = RuntimeOptions {
        replicas: ReplicaPlan::Count(2),
        ..cpu(4)
    };
    if std::thread::available_parallelism().map_or(1, |c| c.get()) < 2 {
        let e = Runtime::open(&path, opts)
            .err()
            .expect("refused on one core");
        assert!(e.to_string().contains("--data-parallel-size 2"), "{e}");
        return;
    }
    let rt = Runtime::open(&path, opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rt.engines().count(), 2);
    assert_eq!(rt.sizing.replicas, 2);
    for e in rt.engines() {
        e.shutdown();
    }
}

#[test]
fn bad_settings_are_refused_naming_them() {
    let (_guard, path) = tiny();
    let ctx = |n| RuntimeOptions {
        max_model_len: Some(n),
        ..cpu(4)
    };
    let e = Runtime::open(&path, ctx(1 << 30)).err().expect("too long");
    assert!(matches!(e, RuntimeError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("--max-model-len"), "{e}");
    let mut opts = cpu(4);
    opts.engine.max_num_seqs = 0;
    // refused before the model is read: no such model is needed
    let e = Runtime::open("/no/such/model", opts)
        .err()
        .expect("no sequences");
    assert!(e.to_string().contains("--max-num-seqs"), "{e}");
    let mut opts = cpu(4);
    opts.replicas = ReplicaPlan::Gpus(vec![0]);
    let e = Runtime::open(&path, opts).err().expect("GPUs on the CPU");
    assert!(e.to_string().contains("--devices"), "{e}");
}
