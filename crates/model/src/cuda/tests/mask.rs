//! The grammar's allowed-token mask (`SampleRequest::allowed`) in
//! the GPU sampler against the CPU sampler on the same logits: greedy and
//! sampled rows, with penalties and `logit_bias`, masks allowing a random
//! eighth of the vocabulary (the unmasked best token forbidden), one token,
//! or everything; a masked row batched with an unmasked one; eager and in
//! a captured decode graph.

use super::*;
use contract::TokenMask;
use std::sync::Arc;

/// A mask allowing about one token in eight (by `seed`), never `forbid`,
/// always `keep`.
fn random_mask(vocab: usize, seed: u64, forbid: u32, keep: u32) -> TokenMask {
    let ids: Vec<u32> = (0..vocab as u32)
        .filter(|&i| i == keep || (i != forbid && splitmix64(seed ^ i as u64).is_multiple_of(8)))
        .collect();
    TokenMask::from_ids(vocab, &ids)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_sampler_applies_the_grammar_mask_like_the_cpu() {
    let (cfg, w) = load(&synth_dir(Preset::Smollm2_135m));
    let vocab = cfg.vocab_size;
    let kv = KvShape {
        num_blocks: 256,
        block_size: BS,
    };
    let mut gpu = CudaBackend::new(cfg, &w, kv, 0, CudaOptions::default()).unwrap();
    let mut pool = Pool::new(kv.num_blocks);
    let params = [
        SamplingParams {
            logprobs: 3,
            ..SamplingParams::greedy()
        },
        SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: 11,
            logprobs: 2,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: 1.0,
            top_k: 5,
            repetition_penalty: 1.2,
            presence_penalty: 0.5,
            logit_bias: Arc::from(vec![(7, 50.0)]),
            seed: 12,
            ..SamplingParams::default()
        },
    ];
    let mut checked = 0;
    for (i, p) in params.iter().enumerate() {
        let toks = tokens(2000 + i as u64, 40, vocab);
        let blocks = pool.take(41);
        // the unmasked twin writes its own blocks
        let twin = pool.take(41);
        let logits = chunk_logits(&mut gpu, &toks, 0, &blocks);
        let last = &logits[39 * vocab..];
        let best = argmax(last);
        let masks = [
            random_mask(vocab, i as u64, best, (best + 1) % vocab as u32),
            TokenMask::from_ids(vocab, &[(best + 13) % vocab as u32]),
            TokenMask::from_ids(vocab, &(0..vocab as u32).collect::<Vec<_>>()),
        ];
        let rows = Rows {
            toks: &toks,
            blocks: &blocks,
            twin: &twin,
            last,
        };
        for mask in masks {
            rows.check(&mut gpu, i, p, Arc::new(mask));
            checked += 1;
        }
        pool.free.extend(blocks);
        pool.free.extend(twin);
    }
    graph_steps_follow_their_masks(&mut gpu, &mut pool);
    println!(
        "RESULT GPU grammar mask vs CPU sampler: {checked} rows agree; graph steps follow their masks"
    );
}

/// One prompt's rows: its tokens, its blocks and its unmasked twin's, and
/// the logits of its last token.
struct Rows<'a> {
    toks: &'a [u32],
    blocks: &'a [u32],
    twin: &'a [u32],
    last: &'a [f32],
}

impl Rows<'_> {
    /// Params `p` (case `i`) with `mask`, eager: alone, exactly the CPU
    /// sampler's token and log-probability; batched with the same row
    /// unmasked, the mask stays on its row.
    fn check(&self, gpu: &mut CudaBackend, i: usize, p: &SamplingParams, mask: Arc<TokenMask>) {
        let req = SampleRequest {
            params: p.clone(),
            step: 3,
            history: Some(Arc::new(contract::PenaltyHistory::from_tokens(self.toks))),
            allowed: Some(mask.clone()),
        };
        let free = SampleRequest {
            allowed: None,
            ..req.clone()
        };
        gpu.set_graphs(false);
        // alone: exactly the CPU sampler's token and log-probability
        let alone = SeqChunk {
            prompt_len: 0,
            tokens: self.toks.to_vec(),
            start: 0,
            blocks: self.blocks.to_vec(),
            sample: Some(req.clone()),
        };
        let g = gpu
            .step(&build_step(std::slice::from_ref(&alone), BS).unwrap())
            .unwrap()[0]
            .clone()
            .unwrap();
        let want = ops::sampling::sample(self.last, &req);
        assert!(
            mask.allows(g.token),
            "GPU sampled forbidden token {}",
            g.token
        );
        assert_eq!(g.token, want.token, "params {i}: {g:?} vs {want:?}");
        assert!((g.logprob - want.logprob).abs() < 1e-3, "{g:?} vs {want:?}");
        // batched with the same row unmasked: the mask stays on its row
        let twin_chunk = SeqChunk {
            prompt_len: 0,
            tokens: self.toks.to_vec(),
            start: 0,
            blocks: self.twin.to_vec(),
            sample: Some(free.clone()),
        };
        let got = gpu
            .step(&build_step(&[alone, twin_chunk], BS).unwrap())
            .unwrap();
        let (m, f) = (got[0].clone().unwrap(), got[1].clone().unwrap());
        assert!(mask.allows(m.token), "batched: forbidden token {}", m.token);
        if p.temperature == 0.0 {
            let want_free = ops::sampling::sample(self.last, &free);
            assert_eq!(f.token, want_free.token, "the unmasked row changed");
        }
    }
}

/// In a captured decode graph: one token per sequence, masks change per
/// step, and each greedy step samples the one token its mask allows.
fn graph_steps_follow_their_masks(gpu: &mut CudaBackend, pool: &mut Pool) {
    let vocab = gpu.config().vocab_size;
    gpu.set_graphs(true);
    let toks = tokens(77, 20, vocab);
    let blocks = pool.take(20 + 8);
    let _ = chunk_logits(gpu, &toks[..19], 0, &blocks);
    for step in 0..4u64 {
        let allowed = (step as u32 * 101 + 5) % vocab as u32;
        let req = SampleRequest {
            params: SamplingParams::greedy(),
            step,
            history: None,
            allowed: Some(Arc::new(TokenMask::from_ids(vocab, &[allowed]))),
        };
        let chunk = SeqChunk {
            prompt_len: 0,
            tokens: vec![toks[19]],
            start: 19,
            blocks: blocks.clone(),
            sample: Some(req),
        };
        let got = gpu.step(&build_step(&[chunk], BS).unwrap()).unwrap()[0]
            .clone()
            .unwrap();
        assert_eq!(got.token, allowed, "graph step {step}");
    }
}
