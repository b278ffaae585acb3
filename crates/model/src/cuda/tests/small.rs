//! Checks on the smollm2-135m (and tiny) synthetic presets: CUDA vs the CPU
//! backend, GPU vs CPU sampling, and the short generation the
//! compute-sanitizer runs use.
//!
//! One file on purpose: these checks share the smollm2 and tiny models, the
//! CPU backend they compare with and the small helpers each builds on.

use super::*;
use crate::cpu::CpuBackend;
use contract::history::PenaltyHistory;
use contract::{Carried, TokenMask};
use std::sync::Arc;

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_smollm2_matches_cpu() {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    let kv = KvShape {
        num_blocks: 512,
        block_size: BS,
    };
    let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
    let mut cpu = CpuBackend::new(cfg, w, kv).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let worst = forward_error_vs_cpu(&mut gpu, &mut cpu, &mut pool);
    assert!(
        worst.0 <= 3e-2 && worst.1 <= 0.2,
        "smollm2 CUDA vs CPU: {worst:?}"
    );
    batch_matches_alone(&mut gpu, 2e-2, "smollm2-135m");
    // GPU sampling vs the CPU sampler on the same logits.
    let mut mism = 0;
    for (i, params) in sampler_cases().into_iter().enumerate() {
        mism += usize::from(!gpu_sample_matches_cpu(&mut gpu, &mut pool, i, params));
    }
    println!("RESULT smollm2 GPU sampler vs CPU sampler: {mism} of 6 draws differ");
    assert_eq!(mism, 0);
}

/// The worst (relative error, max |d logprob|) of the GPU's logits against
/// the CPU's: two prompts, then 64 generated tokens teacher-forced.
fn forward_error_vs_cpu(
    gpu: &mut CudaBackend,
    cpu: &mut CpuBackend,
    pool: &mut Pool,
) -> (f64, f64) {
    let vocab = gpu.config().vocab_size;
    let worst = prompts_vs_cpu(gpu, cpu, pool, &[7, 300], 5, "smollm2");
    let prompt = tokens(99, 40, vocab);
    let blocks = pool.take(40 + 64);
    let generated = generate(gpu, &prompt, &blocks, 64);
    let gpu_tf = teacher_forced(gpu, &prompt, &generated, &blocks);
    let mut full = prompt.clone();
    full.extend_from_slice(&generated[..63]);
    let cpu_all = chunk_logits(cpu, &full, 0, &blocks);
    let cpu_tf = &cpu_all[39 * vocab..];
    let (e, d) = (
        rel_err(&gpu_tf, cpu_tf),
        max_lp_diff(&gpu_tf, cpu_tf, vocab),
    );
    let agree = cpu_tf
        .chunks(vocab)
        .zip(&generated)
        .filter(|(r, g)| argmax(r) == **g)
        .count();
    println!(
        "RESULT smollm2 64 generated (teacher-forced decode): rel err {e:.3e}, max |dlogprob| {d:.3}, CPU argmax agrees on {agree}/64"
    );
    (worst.0.max(e), worst.1.max(d))
}

/// Sampling settings the GPU sampler is held to the CPU sampler with.
fn sampler_cases() -> Vec<SamplingParams> {
    vec![
        SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: 1,
            logprobs: 5,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 20,
            min_p: 0.02,
            seed: 2,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 0.6,
            repetition_penalty: 1.3,
            seed: 3,
            logprobs: 3,
            ..SamplingParams::default()
        },
        SamplingParams {
            logprobs: 2,
            ..SamplingParams::greedy()
        },
        // presence / frequency penalties and logit_bias
        SamplingParams {
            temperature: 0.7,
            repetition_penalty: 1.1,
            presence_penalty: 1.5,
            frequency_penalty: 0.8,
            logit_bias: Arc::from(vec![(3, -100.0), (17, 5.0), (400, 2.5)]),
            seed: 6,
            logprobs: 2,
            ..SamplingParams::default()
        },
        SamplingParams {
            frequency_penalty: -1.2,
            presence_penalty: 0.4,
            logit_bias: Arc::from(vec![(5, 100.0)]),
            ..SamplingParams::greedy()
        },
    ]
}

/// Samples case `i` on the GPU and with the CPU sampler over the GPU's
/// logits; log-probabilities and top ids must agree (asserted), and the
/// result says whether the sampled tokens do.
fn gpu_sample_matches_cpu(
    gpu: &mut CudaBackend,
    pool: &mut Pool,
    i: usize,
    params: SamplingParams,
) -> bool {
    let vocab = gpu.config().vocab_size;
    let toks = tokens(1000 + i as u64, 50, vocab);
    let blocks = pool.take(50);
    let logits = chunk_logits(gpu, &toks, 0, &blocks);
    // the last 20 tokens count as generated (presence / frequency)
    let mut history = PenaltyHistory::from_tokens(&toks[..30]);
    for &t in &toks[30..] {
        history.push_generated(t);
    }
    let req = SampleRequest {
        params,
        step: 5,
        history: Some(Arc::new(history)),
        allowed: None,
    };
    let chunk = SeqChunk {
        prompt_len: 0,
        tokens: toks.clone(),
        start: 0,
        blocks: blocks.clone(),
        sample: Some(req.clone()),
    };
    gpu.set_graphs(false);
    let got = gpu.step(&build_step(&[chunk], BS).unwrap()).unwrap()[0]
        .clone()
        .unwrap();
    let want = ops::sampling::sample(&logits[49 * vocab..], &req);
    assert!(
        (got.logprob - want.logprob).abs() < 1e-3,
        "{got:?} vs {want:?}"
    );
    let ids: Vec<u32> = got.top_logprobs.iter().map(|p| p.0).collect();
    let want_ids: Vec<u32> = want.top_logprobs.iter().map(|p| p.0).collect();
    assert_eq!(ids, want_ids);
    pool.free.extend(blocks);
    got.token == want.token
}

/// A short mixed generation (the compute-sanitizer target): three prompts,
/// greedy and sampled, with decode graphs, then the same with graphs off.
/// `LAMINA_SHORTGEN_PRESET=tiny` runs it on the tiny preset (head_dim 16).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_short_generation() {
    let preset = match std::env::var("LAMINA_SHORTGEN_PRESET").as_deref() {
        Ok("tiny") => Preset::Tiny,
        _ => Preset::Smollm2_135m,
    };
    let (cfg, w) = load(&synth_dir(preset));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 64,
        block_size: BS,
    };
    let mut b = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    let mut runs = Vec::new();
    for graphs in [true, false] {
        b.set_graphs(graphs);
        let mut pool = Pool::new(kv.num_blocks);
        let params = [
            SamplingParams::greedy(),
            SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                seed: 4,
                logprobs: 4,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 0.7,
                top_k: 10,
                repetition_penalty: 1.2,
                presence_penalty: 0.6,
                frequency_penalty: 0.4,
                logit_bias: Arc::from(vec![(7, -3.0), (11, 2.0)]),
                seed: 5,
                ..SamplingParams::default()
            },
        ];
        let mut chunks: Vec<SeqChunk> = [20usize, 5, 33]
            .iter()
            .zip(&params)
            .map(|(&n, p)| {
                let toks = tokens(n as u64, n, vocab);
                SeqChunk {
                    prompt_len: 0,
                    sample: Some(SampleRequest {
                        params: p.clone(),
                        step: 0,
                        history: Some(Arc::new(PenaltyHistory::from_tokens(&toks))),
                        allowed: None,
                    }),
                    blocks: pool.take(n + 8),
                    tokens: toks,
                    start: 0,
                }
            })
            .collect();
        let mut out = vec![Vec::new(); 3];
        for step in 0..8 {
            if step == 5 {
                // the batch shrinks from bucket 4 to bucket 2 (a GEMV bucket,
                // captured at once; with `CudaOptions::gemv_rows` 0 bucket 4's graph
                // serves it padded until bucket 2 is captured)
                chunks.truncate(2);
            }
            let res = b.step(&build_step(&chunks, BS).unwrap()).unwrap();
            for ((c, o), r) in chunks.iter_mut().zip(&mut out).zip(res) {
                let r = r.unwrap();
                assert!((r.token as usize) < vocab && r.logprob.is_finite() && r.logprob <= 0.0);
                o.push(r.token);
                c.start += c.tokens.len();
                c.tokens = vec![r.token];
                if let Some(s) = c.sample.as_mut() {
                    s.step = step + 1;
                    if let Some(h) = s.history.as_mut() {
                        Arc::make_mut(h).push_generated(r.token);
                    }
                }
            }
        }
        runs.push(out);
    }
    assert!(b.num_graphs() == 0);
    println!(
        "RESULT short generation tokens (graphs / eager): {:?} / {:?}",
        runs[0], runs[1]
    );
    // The prefill step runs the same kernels in both runs; decode steps may
    // differ in the last bits (GEMMs of the padded bucket size vs the batch size).
    for (s, (a, b)) in runs[0].iter().zip(&runs[1]).enumerate() {
        assert_eq!(a[0], b[0], "sequence {s}: first token differs");
    }
}

/// A mixed step where some sequences are mid-prefill (no sample request):
/// results come back exactly where asked, each the argmax of that row's logits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_partial_sampling() {
    let (cfg, w) = load(&synth_dir(Preset::Tiny));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 64,
        block_size: BS,
    };
    let mut b = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    for pattern in [
        [false, true, false],
        [true, false, false],
        [false, false, true],
        [true, false, true],
    ] {
        let mut pool = Pool::new(kv.num_blocks);
        let chunks: Vec<SeqChunk> = [20usize, 5, 33]
            .iter()
            .zip(pattern)
            .map(|(&n, sampled)| {
                let toks = tokens(n as u64 + 11, n, vocab);
                SeqChunk {
                    prompt_len: 0,
                    sample: sampled.then(|| greedy(0)).flatten(),
                    blocks: pool.take(n),
                    tokens: toks,
                    start: 0,
                }
            })
            .collect();
        let batch = build_step(&chunks, BS).unwrap();
        let res = b.step(&batch).unwrap();
        assert_eq!(res.len(), 3);
        for (s, (r, sampled)) in res.iter().zip(pattern).enumerate() {
            assert_eq!(r.is_some(), sampled, "pattern {pattern:?}, sequence {s}");
            if let Some(r) = r {
                let row = batch.cu_seqlens[s + 1] as usize - 1;
                let logits = b.logits(&batch, &[row]).unwrap();
                assert_eq!(
                    r.token,
                    argmax(&logits),
                    "pattern {pattern:?}, sequence {s}"
                );
            }
        }
    }
    println!("RESULT partial sampling: ok");
}

/// The named malformed batches of `contract::testing` (the same the CPU
/// backend rejects): each is an `InvalidBatch` error before anything is
/// staged or launched, and a well-formed step still runs afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_rejects_malformed_batches() {
    use contract::testing::{malformed_batches, well_formed};
    let (cfg, w) = load(&synth_dir(Preset::Tiny));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 8,
        block_size: BS,
    };
    let mut b = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    let max_pos = b.model.rope_rows;
    for (what, batch) in malformed_batches(kv, vocab, max_pos) {
        let r = b.step(&batch);
        assert!(
            matches!(r, Err(BackendError::InvalidBatch(_))),
            "{what}: {r:?}"
        );
    }
    let ok = well_formed(kv, &[(20, 20), (3, 1)], |s, j| (2 * s + j) as u32);
    assert_eq!(b.step(&ok).unwrap(), vec![None, None]);
    println!("RESULT malformed batches: rejected");
}

/// Logits of a few rows of a prefill (the last layer then runs its O
/// projection and MLP on those rows alone) equal the same rows of the
/// all-rows logits, within bf16 noise (log-probabilities within 2e-2).
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_row_subsets_match_all_rows() {
    let (cfg, w) = load(&synth_dir(Preset::Tiny));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 64,
        block_size: BS,
    };
    let mut b = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    let n = 300;
    let toks = tokens(77, n, vocab);
    let blocks: Vec<u32> = (0..n.div_ceil(BS) as u32).collect();
    let all = chunk_logits(&mut b, &toks, 0, &blocks);
    let chunk = SeqChunk {
        prompt_len: 0,
        tokens: toks,
        start: 0,
        blocks,
        sample: None,
    };
    let batch = build_step(&[chunk], BS).unwrap();
    let subset = [0usize, 7, 150, 298, 299];
    let some = b.logits(&batch, &subset).unwrap();
    let logp = |z: &[f32]| {
        let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + z.iter().map(|v| (v - m).exp()).sum::<f32>().ln();
        z.iter().map(|v| v - lse).collect::<Vec<f32>>()
    };
    let mut worst = 0f32;
    for (i, &row) in subset.iter().enumerate() {
        let (a, s) = (
            logp(&all[row * vocab..][..vocab]),
            logp(&some[i * vocab..][..vocab]),
        );
        let d = a
            .iter()
            .zip(&s)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d);
    }
    assert!(worst < 2e-2, "row subset vs all rows: max |dlogp| {worst}");
    println!("RESULT row subsets vs all rows: max |dlogp| {worst:.2e}");
}

/// Pipelined steps give exactly the tokens of plain steps: each step is
/// launched before the previous one is collected, with its decode tokens
/// carried on the device (placeholder ids on the host). The batch changes
/// on the way: a long prompt joins (a mixed eager step that grows the
/// workspace while a step is in flight), a sequence leaves (another graph
/// bucket); with graphs and without. With grammar-like masks that depend on
/// each sequence's last sample (even sequences), held steps (launched with
/// stale masks, released with the final ones once the step before is
/// collected) give exactly the tokens of plain steps with the final masks,
/// and every masked sample is allowed by its mask.
#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_pipelined_steps_equal_plain_steps() {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    for graphs in [true, false] {
        let runs: Vec<Vec<Vec<u32>>> = [
            (Mode::Plain, false),
            (Mode::Piped, false),
            (Mode::Plain, true),
            (Mode::Held, true),
        ]
        .into_iter()
        .map(|(mode, masked)| {
            let kv = KvShape {
                num_blocks: 256,
                block_size: BS,
            };
            let mut b = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
            b.set_graphs(graphs);
            PipeRun::new(&mut b, kv, mode, masked).run()
        })
        .collect();
        println!("RESULT pipelined (graphs {graphs}): {:?}", runs[1]);
        println!("RESULT held (graphs {graphs}): {:?}", runs[3]);
        assert_eq!(runs[0], runs[1], "graphs {graphs}: pipelined tokens differ");
        assert_eq!(runs[2], runs[3], "graphs {graphs}: held-step tokens differ");
        assert_ne!(
            runs[0], runs[2],
            "graphs {graphs}: the masks changed nothing"
        );
        assert_eq!(
            runs[0][3].len(),
            9,
            "the late sequence sampled from step 5 on"
        );
    }
}

/// How [`PipeRun`] steps: one at a time, pipelined, or pipelined with held
/// steps wherever a token is carried.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Plain,
    Piped,
    Held,
}

/// A sequence of [`PipeRun`]: its prompt, the samples collected, the tokens
/// run so far.
struct PipeSeq {
    prompt: Vec<u32>,
    generated: Vec<u32>,
    run: usize,
    blocks: Vec<u32>,
}

impl PipeSeq {
    /// The prompt and the samples collected.
    fn known(&self) -> Vec<u32> {
        self.prompt.iter().chain(&self.generated).copied().collect()
    }
}

/// 14 steps of four sequences in one mode: sequence 3 (a 700-token
/// prompt) joins at step 5, sequence 1 leaves after step 8.
struct PipeRun<'a> {
    b: &'a mut CudaBackend,
    vocab: usize,
    mode: Mode,
    masked: bool,
    seqs: Vec<PipeSeq>,
    /// The sequences of the launch not collected yet, in batch order.
    pending: Option<Vec<usize>>,
    held_steps: usize,
}

impl<'a> PipeRun<'a> {
    fn new(b: &'a mut CudaBackend, kv: KvShape, mode: Mode, masked: bool) -> Self {
        let vocab = b.config().vocab_size;
        let mut pool = Pool::new(kv.num_blocks);
        let seqs = [9usize, 40, 3, 700]
            .iter()
            .map(|&n| PipeSeq {
                prompt: tokens(n as u64 + 7, n, vocab),
                generated: Vec::new(),
                run: 0,
                blocks: pool.take(n + 24),
            })
            .collect();
        PipeRun {
            b,
            vocab,
            mode,
            masked,
            seqs,
            pending: None,
            held_steps: 0,
        }
    }

    fn params(i: usize) -> SamplingParams {
        SamplingParams {
            temperature: if i.is_multiple_of(2) { 0.0 } else { 0.8 },
            seed: i as u64,
            logprobs: i % 3,
            ..SamplingParams::default()
        }
    }

    /// Even sequences: 64 allowed ids picked from the last known token.
    fn mask_for(&self, s: usize, known: &[u32]) -> Option<Arc<TokenMask>> {
        if s % 2 == 1 {
            return None;
        }
        let vocab = self.vocab;
        let h = known.last().map_or(5, |&t| t as usize * 31 + known.len());
        let ids: Vec<u32> = (0..64).map(|k| ((h + k * 7919) % vocab) as u32).collect();
        Some(Arc::new(TokenMask::from_ids(vocab, &ids)))
    }

    /// Runs the 14 steps; every sequence's samples.
    fn run(mut self) -> Vec<Vec<u32>> {
        for i in 0..14 {
            let ids: Vec<usize> = (0..self.seqs.len())
                .filter(|&s| (s != 3 || i >= 5) && (s != 1 || i <= 8))
                .collect();
            self.step(&ids);
        }
        if let Some(prev) = self.pending.take() {
            self.land(&prev);
        }
        assert!(self.b.collect().is_err(), "nothing left in flight");
        if self.mode == Mode::Held {
            let held = self.held_steps;
            assert!(held >= 10, "{held} held steps");
        }
        self.seqs.into_iter().map(|s| s.generated).collect()
    }

    /// Launches one step of `ids` (held where it carries a token in `Held`
    /// mode) and collects what the mode collects after it.
    fn step(&mut self, ids: &[usize]) {
        let prev = self.pending.clone().unwrap_or_default();
        let chunks = self.chunks(ids, &prev);
        let mut batch = build_step(&chunks, BS).unwrap();
        for (row, &s) in ids.iter().enumerate() {
            if let Some(from) = prev.iter().position(|&p| p == s) {
                batch.carried.push(Carried {
                    token: batch.cu_seqlens[row + 1] - 1,
                    from: from as u32,
                });
            }
        }
        let hold = self.mode == Mode::Held && !batch.carried.is_empty();
        if hold {
            self.b.launch_held(&batch).unwrap();
            self.held_steps += 1;
        } else {
            self.b.launch(&batch).unwrap();
        }
        for (c, &s) in chunks.iter().zip(ids) {
            self.seqs[s].run += c.tokens.len();
        }
        match self.mode {
            Mode::Plain => self.land(ids),
            Mode::Piped | Mode::Held => {
                if let Some(prev) = self.pending.replace(ids.to_vec()) {
                    self.land(&prev);
                }
            }
        }
        if hold {
            assert!(
                self.b.launch(&batch).is_err(),
                "a launch behind a held step"
            );
            let mut fin = batch.samples.clone();
            for (f, &s) in fin.iter_mut().zip(ids) {
                if let Some(r) = f.as_mut() {
                    r.allowed = self.mask_for(s, &self.seqs[s].known());
                }
            }
            self.b.release(&fin).unwrap();
        }
    }

    /// The chunks of `ids`; a sequence of the launch in flight (`prev`)
    /// gets a placeholder for its last sample, still on the device.
    fn chunks(&self, ids: &[usize], prev: &[usize]) -> Vec<SeqChunk> {
        ids.iter()
            .map(|&s| {
                let q = &self.seqs[s];
                let k = q.known();
                let mut toks = k[q.run.min(k.len())..].to_vec();
                let in_flight = prev.contains(&s);
                if in_flight {
                    toks.push(0); // its last sample is still on the device
                }
                SeqChunk {
                    prompt_len: 0,
                    sample: Some(SampleRequest {
                        params: Self::params(s),
                        step: (q.generated.len() + usize::from(in_flight)) as u64,
                        history: None,
                        // stale for a carried sequence: final at release
                        allowed: if self.masked {
                            self.mask_for(s, &k)
                        } else {
                            None
                        },
                    }),
                    blocks: q.blocks.clone(),
                    start: q.run,
                    tokens: toks,
                }
            })
            .collect()
    }

    /// Collects the oldest step (of `ids`); each masked sample must be one
    /// its final mask allows.
    fn land(&mut self, ids: &[usize]) {
        for (&s, r) in ids.iter().zip(self.b.collect().unwrap()) {
            let r = r.unwrap();
            assert!((r.token as usize) < self.vocab && r.logprob.is_finite());
            if self.masked
                && let Some(m) = self.mask_for(s, &self.seqs[s].known())
            {
                assert!(
                    m.allows(r.token),
                    "sequence {s} sampled {} outside its mask",
                    r.token
                );
            }
            self.seqs[s].generated.push(r.token);
        }
    }
}
