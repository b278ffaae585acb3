//! `Backend::hidden` on the GPU against the CPU backend: the final-normed
//! hidden states of a batch of prompts (GEMM path) and of a short one
//! (GEMV path), pooled as embeddings are (last token, mean) and
//! normalised, agree within 1e-2 cosine; a subset of rows equals the same
//! rows of the all-rows call.

use super::*;
use crate::cpu::CpuBackend;

/// `[hidden]` unit vectors of `states` (`[rows, hidden]`): the last row's
/// and the mean of all rows.
fn pooled(states: &[f32], hidden: usize) -> [Vec<f32>; 2] {
    let rows = states.len() / hidden;
    let unit = |mut v: Vec<f32>| {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.iter_mut().for_each(|x| *x /= n);
        v
    };
    let last = states[(rows - 1) * hidden..].to_vec();
    let mut mean = vec![0f32; hidden];
    for r in states.chunks_exact(hidden) {
        mean.iter_mut().zip(r).for_each(|(m, v)| *m += v);
    }
    [unit(last), unit(mean)]
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (n(a) * n(b))
}

/// The step of `lens` prompts, each in its own blocks, and its token rows
/// per prompt.
fn prompts(lens: &[usize], vocab: usize) -> (contract::StepBatch, Vec<std::ops::Range<usize>>) {
    let mut pool = Pool::new(256);
    let mut chunks = Vec::new();
    let mut ranges = Vec::new();
    let mut at = 0;
    for (i, &n) in lens.iter().enumerate() {
        chunks.push(SeqChunk {
            prompt_len: n,
            tokens: tokens(31 + i as u64, n, vocab),
            start: 0,
            blocks: pool.take(n),
            sample: None,
        });
        ranges.push(at..at + n);
        at += n;
    }
    (build_step(&chunks, BS).unwrap(), ranges)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_hidden_states_match_cpu() {
    for preset in [Preset::Tiny, Preset::Smollm2_135m] {
        let (cfg, w) = load(&synth_dir(preset));
        let (vocab, hidden) = (cfg.vocab_size, cfg.hidden_size);
        let kv = KvShape {
            num_blocks: 256,
            block_size: BS,
        };
        let mut gpu = CudaBackend::new(cfg.clone(), &w, kv, 0, CudaOptions::default()).unwrap();
        let mut cpu = CpuBackend::new(cfg, w, kv).unwrap();
        let mut worst = 1f32;
        for lens in [vec![7usize, 300, 33], vec![3]] {
            let (batch, ranges) = prompts(&lens, vocab);
            let rows: Vec<usize> = (0..batch.num_tokens()).collect();
            let g = gpu.hidden(&batch, &rows).unwrap();
            let c = cpu.hidden(&batch, &rows).unwrap();
            assert_eq!(g.len(), rows.len() * hidden);
            for r in &ranges {
                let (gs, cs) = (
                    &g[r.start * hidden..r.end * hidden],
                    &c[r.start * hidden..r.end * hidden],
                );
                for (a, b) in pooled(gs, hidden).iter().zip(&pooled(cs, hidden)) {
                    worst = worst.min(cosine(a, b));
                }
            }
            // a subset of rows: the same rows of the all-rows call
            let subset = [0, rows.len() - 1];
            let some = gpu.hidden(&batch, &subset).unwrap();
            for (i, &row) in subset.iter().enumerate() {
                let all = &g[row * hidden..(row + 1) * hidden];
                assert_eq!(&some[i * hidden..(i + 1) * hidden], all, "row {row}");
            }
        }
        println!("RESULT {preset:?} CUDA vs CPU embeddings: worst cosine {worst:.6}");
        assert!(worst >= 1.0 - 1e-2, "{preset:?}: worst cosine {worst}");
    }
}
