//! LoRA adapters end to end on the CPU backend: adapters written in the
//! PEFT layout and read back through `checkpoint::lora`, run per row in a
//! step mixing adapters and the base model, give the teacher-forced
//! log-probabilities of the model with the adapter merged into its weights
//! (the f64 pass of `model::exact`, within 1e-4) on the synthetic `tiny`
//! model and on SmolLM2; in the engine, requests of more adapters than
//! slots all get their own adapter's tokens (equal to a run alone), the
//! prefix cache never serves one adapter's K/V to another, and unloading
//! gives every slot back.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use checkpoint::lora::{PeftSpec, load_adapter, write_peft_adapter};
use checkpoint::synth::{Preset, synth_model};
use contract::lora::LoraTarget;
use contract::{Backend, KvShape, LoraAdapter, ModelConfig};
use engine::{Engine, EngineConfig, GenerateRequest};
use lamina_tests::log_softmax;
use model::cpu::batch::{SeqChunk, build_step, contiguous_blocks};
use model::exact::{ExactWeights, forward};
use tokenizer::Tokenizer;

const BS: usize = 16;

fn tiny_dir() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("temp dir");
        let dir = tmp.path().join("tiny");
        synth_model(Preset::Tiny, 11, &dir).expect("synth tiny model");
        (tmp, dir)
    })
    .1
}

/// Adapters of several ranks and target sets, written as PEFT folders under
/// `root` and read back.
fn adapters(root: &Path, c: &ModelConfig, n: usize, amp: f32) -> Vec<Arc<LoraAdapter>> {
    use LoraTarget::*;
    let specs: [(usize, Vec<LoraTarget>, bool); 4] = [
        (4, vec![Q, V], false),
        (8, LoraTarget::ALL.to_vec(), true),
        (2, vec![O, Down], false),
        (16, vec![K, Gate, Up], false),
    ];
    specs
        .into_iter()
        .take(n)
        .enumerate()
        .map(|(k, (rank, targets, rslora))| {
            let dir = root.join(format!("adapter{k}"));
            let spec = PeftSpec {
                rank,
                alpha: 2.0 * rank as f32,
                targets,
                rslora,
                seed: 100 + k as u64,
                amp,
            };
            let written = write_peft_adapter(&dir, c, &spec).expect("write adapter");
            let read = load_adapter(&dir, c, 16).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(read, written);
            Arc::new(read)
        })
        .collect()
}

/// Every sequence of `prompt` in one step, sequence `s` with LoRA slot
/// `slots[s]`, on the reference CPU backend holding `ads` in slots 1..;
/// teacher-forced log-probabilities checked against the merged f64 pass,
/// and each sequence alone equal to its row of the mixed step.
fn check_merged(dir: &Path, prompt: &[u32], ads: &[Arc<LoraAdapter>], slots: &[u32]) {
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let c = loaded.config.clone();
    let weights = checkpoint::loader::load_weights(dir, &c).expect("weights");
    let seqs = slots.len();
    let kv = KvShape {
        num_blocks: seqs * prompt.len().div_ceil(BS),
        block_size: BS,
    };
    let mut b = model::cpu::CpuBackend::new(c.clone(), weights.clone(), kv)
        .expect("backend")
        .with_max_loras(ads.len());
    for (k, a) in ads.iter().enumerate() {
        b.set_lora(k as u32 + 1, Some(a.clone())).expect("set_lora");
    }
    let per = prompt.len().div_ceil(BS);
    let chunks: Vec<SeqChunk> = (0..seqs)
        .map(|s| SeqChunk {
            prompt_len: 0,
            tokens: prompt.to_vec(),
            start: 0,
            blocks: contiguous_blocks((s * per) as u32, prompt.len(), BS),
            sample: None,
        })
        .collect();
    let mut mixed = build_step(&chunks, BS).expect("step");
    mixed.loras = slots.to_vec();
    let rows: Vec<usize> = (0..mixed.num_tokens()).collect();
    let got = b.logits(&mixed, &rows).expect("logits");
    let v = c.vocab_size;
    let exact_of = |w: &checkpoint::ModelWeights| {
        ExactWeights::from_weights(w, |t| t.data.iter().map(|x| x.to_f32() as f64).collect())
            .expect("projections decode")
    };
    let base = forward(&c, &exact_of(&weights), prompt);
    for (s, &slot) in slots.iter().enumerate() {
        let want = match slot {
            0 => base.clone(),
            k => {
                let mut ex = exact_of(&weights);
                ex.merge_lora(&c, &ads[k as usize - 1]);
                forward(&c, &ex, prompt)
            }
        };
        let a = s * prompt.len();
        let mut moved = 0f64;
        // teacher forcing: the log-probability of each next prompt token
        for r in 0..prompt.len() - 1 {
            let row = &got[(a + r) * v..(a + r + 1) * v];
            let lg = log_softmax(row.iter().map(|&x| x as f64));
            let lw = log_softmax(want[r].iter().copied());
            let lb = log_softmax(base[r].iter().copied());
            let next = prompt[r + 1] as usize;
            let d = (lg[next] - lw[next]).abs();
            assert!(
                d < 1e-4,
                "{dir:?} seq {s} (slot {slot}) position {r}: logprob off by {d}"
            );
            let worst = lg
                .iter()
                .zip(&lw)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(
                worst < 1e-4,
                "{dir:?} seq {s} position {r}: a logprob off by {worst}"
            );
            moved = moved.max((lw[next] - lb[next]).abs());
        }
        if slot > 0 {
            assert!(
                moved > 1e-3,
                "{dir:?} adapter {slot} changes nothing ({moved})"
            );
        }
        let mut alone = build_step(&chunks[s..s + 1], BS).expect("step");
        alone.loras = vec![slot];
        let n = alone.num_tokens();
        let one = b
            .logits(&alone, &(0..n).collect::<Vec<_>>())
            .expect("logits");
        assert!(
            one[..] == got[a * v..(a + n) * v],
            "{dir:?} seq {s} alone differs"
        );
    }
}

#[test]
fn teacher_forced_logprobs_equal_the_merged_model_on_tiny() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tiny_dir();
    let c = checkpoint::loader::load_config(dir).expect("config").config;
    let ads = adapters(tmp.path(), &c, 4, 0.05);
    let prompt: Vec<u32> = (0..21).map(|i| (i * 37 + 11) % 250).collect();
    // the base model and four adapters in one step
    check_merged(dir, &prompt, &ads, &[1, 0, 2, 3, 4]);
}

#[test]
fn teacher_forced_logprobs_equal_the_merged_model_on_smollm2() {
    let m = lamina_tests::smollm2();
    let tmp = tempfile::tempdir().expect("temp dir");
    let c = checkpoint::loader::load_config(&m.dir)
        .expect("config")
        .config;
    let ads = adapters(tmp.path(), &c, 2, 0.01);
    let prompt = m
        .tok
        .encode("The capital of France is Paris, and", true)
        .expect("encode");
    check_merged(&m.dir, &prompt, &ads, &[2, 0, 1]);
}

fn start(dir: &Path, max_loras: usize) -> Engine {
    let loaded = checkpoint::loader::load_config(dir).expect("config");
    let weights = checkpoint::loader::load_weights(dir, &loaded.config).expect("weights");
    let tok = Arc::new(Tokenizer::from_dir(dir).expect("tokenizer"));
    let kv = KvShape {
        num_blocks: 64,
        block_size: BS,
    };
    let backend = model::cpu::CpuBackend::with_path(
        loaded.config.clone(),
        weights,
        kv,
        model::cpu::CpuPath::Fast,
    )
    .expect("cpu backend")
    .with_max_loras(max_loras);
    Engine::start(
        Box::new(backend),
        tok,
        loaded.eos_ids.clone(),
        EngineConfig {
            max_num_seqs: 8,
            max_batch_tokens: 256,
            max_loras,
            ..EngineConfig::default()
        },
    )
    .expect("engine")
}

fn greedy(prompt: &[u32], lora: Option<&str>) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        sampling: contract::SamplingParams::greedy(),
        max_tokens: 12,
        stop: vec![],
        ignore_eos: true,
        stop_token_ids: vec![],
        constraint: None,
        speculative: false,
        lora: lora.map(str::to_string),
    }
}

#[test]
fn more_adapters_than_slots_each_request_gets_its_own() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tiny_dir();
    let c = checkpoint::loader::load_config(dir).expect("config").config;
    let ads = adapters(tmp.path(), &c, 3, 0.2);
    let names = ["a", "b", "c"];
    // one prompt for all: the prefix cache must keep their K/V apart
    let prompt: Vec<u32> = (0..40).map(|i| (i * 13 + 7) % 250).collect();
    let mut want = Vec::new();
    for lora in [None, Some(0), Some(1), Some(2)] {
        // alone: an engine of one slot per run, nothing else in it
        let e = start(dir, 1);
        if let Some(k) = lora {
            e.load_lora(names[k], ads[k].clone()).expect("load");
        }
        let out = e
            .submit(greedy(&prompt, lora.map(|k| names[k])))
            .expect("submit");
        want.push(out.blocking_collect().tokens);
        e.shutdown();
    }
    assert!(
        want[1..].iter().all(|w| *w != want[0]),
        "adapters change nothing"
    );
    // two slots, three adapters and the base model, all at once, twice
    let e = start(dir, 2);
    for (n, a) in names.iter().zip(&ads) {
        e.load_lora(n, a.clone()).expect("load");
    }
    let mut reqs = Vec::new();
    for _ in 0..2 {
        reqs.push(greedy(&prompt, None));
        reqs.extend(names.iter().map(|n| greedy(&prompt, Some(n))));
    }
    let outs = lamina_tests::run_all(&e, &reqs);
    for (i, o) in outs.iter().enumerate() {
        assert_eq!(o.tokens, want[i % 4], "request {i} ({:?})", reqs[i].lora);
    }
    assert_eq!(e.loras().requests().iter().map(|r| r.1).sum::<u64>(), 6);
    // unknown adapters are refused naming them
    let err = e
        .submit(greedy(&prompt, Some("nope")))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("`nope`"), "{err}");
    // unloading every adapter gives every slot back
    for n in names {
        e.unload_lora(n).expect("unload");
    }
    let done = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(5));
        e.lora_gauge().resident == 0
    });
    assert!(done, "slots still held: {:?}", e.lora_gauge());
    assert!(e.loras().names().is_empty());
    e.shutdown();
}

#[test]
fn a_thousand_load_unload_cycles_leak_nothing() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tiny_dir();
    let c = checkpoint::loader::load_config(dir).expect("config").config;
    let ads = adapters(tmp.path(), &c, 2, 0.2);
    let e = start(dir, 1);
    let prompt: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % 250).collect();
    let mut want = Vec::new();
    for cycle in 0..1000 {
        let k = cycle % 2;
        e.load_lora("x", ads[k].clone()).expect("load");
        // every 10th cycle runs a request on the adapter (so it takes the
        // one slot, evicting the other adapter's weights)
        if cycle % 10 < 2 {
            let out = e.submit(greedy(&prompt, Some("x"))).expect("submit");
            let tokens = out.blocking_collect().tokens;
            match want.get(k) {
                Some(w) => assert_eq!(&tokens, w, "cycle {cycle}: adapter {k}'s tokens changed"),
                None => want.push(tokens),
            }
        }
        e.unload_lora("x").expect("unload");
    }
    let done = (0..1000).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(5));
        e.lora_gauge().resident == 0
    });
    assert!(done, "slots still held: {:?}", e.lora_gauge());
    assert!(e.loras().names().is_empty());
    // nothing in the engine or the backend holds the adapters any more:
    // their memory is returned (a process-wide resident-set figure would
    // count the other tests of this binary)
    for (k, a) in ads.iter().enumerate() {
        assert_eq!(Arc::strong_count(a), 1, "adapter {k} still referenced");
    }
    e.shutdown();
}
