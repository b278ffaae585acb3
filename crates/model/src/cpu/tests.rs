//! Unit tests of the CPU backend on small random in-memory models: an
//! independent naive f64 forward pass, prefill vs decode, batching and
//! block-layout invariance, and batch validation.
//!
//! One file on purpose: one suite over shared small models and helpers (the
//! naive f64 pass, block pools), each test a few lines on top of them.

use super::batch::{SeqChunk, build_step, contiguous_blocks, generate_greedy};
use super::*;
use checkpoint::weights::{Extra, LayerWeights};
use contract::Backend;
use contract::backend::SampleRequest;
use contract::sampling::{SamplingParams, splitmix64};
use contract::testing::{Malformation, malform, malformed_batches, well_formed};
use half::bf16;

pub(super) const BS: usize = 4; // block size of the test pools

pub(crate) fn config(tied: bool) -> ModelConfig {
    config_with(tied, 48)
}

pub(crate) fn config_with(tied: bool, intermediate: usize) -> ModelConfig {
    let text = format!(
        r#"{{"hidden_size": 32, "intermediate_size": {intermediate}, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "tie_word_embeddings": {tied},
        "rope_scaling": {{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}}}"#
    );
    ModelConfig::from_json(&text, "test").unwrap()
}

fn tensor(name: &str, shape: &[usize], seed: u64, scale: f32, offset: f32) -> Tensor {
    let n: usize = shape.iter().product();
    let data = (0..n as u64)
        .map(|i| {
            let u = (splitmix64(i ^ seed.wrapping_mul(0x9E37)) >> 40) as f32 / (1u32 << 24) as f32;
            bf16::from_f32(offset + scale * (2.0 * u - 1.0))
        })
        .collect();
    Tensor {
        name: name.into(),
        shape: shape.to_vec(),
        data,
    }
}

pub(crate) fn weights(c: &ModelConfig, tied: bool) -> ModelWeights {
    let (h, q, kv, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let layers = (0..c.num_layers as u64)
        .zip(&c.spec.layers)
        .map(|(l, ls)| {
            let s = 100 * (l + 1);
            // the extras the spec asks for: gains near 1, small biases
            let extras = (Extra::ALL.into_iter().filter(|e| e.wanted(ls)))
                .map(|e| {
                    let (scale, offset) = if e.is_norm() { (0.2, 1.0) } else { (0.2, 0.0) };
                    let t = tensor(e.hf_suffix(), &e.shape(c), s + 20 + e as u64, scale, offset);
                    (e, t)
                })
                .collect();
            LayerWeights {
                input_norm: tensor("in", &[h], s, 0.2, 1.0),
                q_proj: Projection::Bf16(tensor("q", &[q, h], s + 1, 0.4, 0.0)),
                k_proj: Projection::Bf16(tensor("k", &[kv, h], s + 2, 0.4, 0.0)),
                v_proj: Projection::Bf16(tensor("v", &[kv, h], s + 3, 0.4, 0.0)),
                o_proj: Projection::Bf16(tensor("o", &[h, q], s + 4, 0.3, 0.0)),
                post_norm: tensor("post", &[h], s + 5, 0.2, 1.0),
                gate_proj: Projection::Bf16(tensor("gate", &[i, h], s + 6, 0.3, 0.0)),
                up_proj: Projection::Bf16(tensor("up", &[i, h], s + 7, 0.3, 0.0)),
                down_proj: Projection::Bf16(tensor("down", &[h, i], s + 8, 0.3, 0.0)),
                extras,
            }
        })
        .collect();
    ModelWeights {
        embed: tensor("embed", &[c.vocab_size, h], 1, 1.0, 0.0),
        layers,
        norm: tensor("norm", &[h], 2, 0.2, 1.0),
        lm_head: (!tied)
            .then(|| Projection::Bf16(tensor("lm_head", &[c.vocab_size, h], 3, 0.5, 0.0))),
        kv_scales: None,
    }
}

fn backend(tied: bool, num_blocks: usize) -> CpuBackend {
    backend_on(CpuPath::Reference, tied, num_blocks)
}

pub(super) fn backend_on(path: CpuPath, tied: bool, num_blocks: usize) -> CpuBackend {
    let c = config(tied);
    let w = weights(&c, tied);
    CpuBackend::with_path(
        c,
        w,
        KvShape {
            num_blocks,
            block_size: BS,
        },
        path,
    )
    .unwrap()
}

const PATHS: [CpuPath; 2] = [CpuPath::Reference, CpuPath::Fast];

/// The textbook forward pass in f64 over a whole sequence: logits `[T][vocab]`.
pub(super) fn naive(c: &ModelConfig, w: &ModelWeights, toks: &[u32]) -> Vec<Vec<f64>> {
    naive_with(c, w, toks, &|t: &Tensor| {
        t.data.iter().map(|v| v.to_f32() as f64).collect()
    })
}

/// [`naive`] with each tensor's values given by `f` (the weights' exact
/// values where BF16 cannot hold them).
pub(super) fn naive_with(
    c: &ModelConfig,
    w: &ModelWeights,
    toks: &[u32],
    f: &dyn Fn(&Tensor) -> Vec<f64>,
) -> Vec<Vec<f64>> {
    let ex = crate::exact::ExactWeights::from_weights(w, f).expect("projections decode");
    crate::exact::forward(c, &ex, toks)
}

/// `t`'s rows quantised to `qt` (GGUF type `ty`), as a GGUF would hold
/// them.
pub(super) fn blocks(
    t: &Tensor,
    qt: cpu_kernels::quant::QuantType,
    ty: checkpoint::gguf::GgmlType,
) -> checkpoint::quantized::QuantTensor {
    let cols = t.shape[1];
    let mut data = Vec::new();
    for r in t.data.chunks_exact(cols) {
        let row: Vec<f32> = r.iter().map(|v| v.to_f32()).collect();
        cpu_kernels::quant::quantize_row(qt, &row, &mut data);
    }
    checkpoint::quantized::QuantTensor {
        name: t.name.clone(),
        rows: t.shape[0],
        cols,
        ty,
        data,
    }
}

pub(super) fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

pub(super) fn chunk(tokens: &[u32], start: usize, blocks: Vec<u32>) -> SeqChunk {
    SeqChunk {
        prompt_len: 0,
        tokens: tokens.to_vec(),
        start,
        blocks,
        sample: None,
    }
}

pub(super) const PROMPT: [u32; 11] = [3, 17, 42, 8, 8, 23, 1, 49, 0, 30, 12];
/// Long enough for the fast path's GEMM regime (16 tokens or more).
pub(super) const LONG_PROMPT: [u32; 21] = [
    3, 17, 42, 8, 8, 23, 1, 49, 0, 30, 12, 7, 7, 19, 33, 2, 48, 11, 5, 26, 40,
];

#[test]
fn prefill_matches_naive_reference_tied_and_untied() {
    for path in PATHS {
        for tied in [true, false] {
            for prompt in [&PROMPT[..], &LONG_PROMPT[..]] {
                let mut b = backend_on(path, tied, 8);
                let want = naive(b.config(), &weights(b.config(), tied), prompt);
                let batch = build_step(
                    &[chunk(prompt, 0, contiguous_blocks(0, prompt.len(), BS))],
                    BS,
                )
                .unwrap();
                let rows: Vec<usize> = (0..prompt.len()).collect();
                let got = b.logits(&batch, &rows).unwrap();
                for (r, w) in want.iter().enumerate() {
                    let e = rel_err(&got[r * 50..(r + 1) * 50], w);
                    assert!(e < 1e-5, "{path:?} tied={tied} row {r}: rel err {e}");
                }
            }
        }
    }
}

#[test]
fn weight_bytes_count_what_each_path_holds_and_a_tied_head_as_the_embedding() {
    // 2 layers of 7,680 BF16 weights, two f32 norm gains of 32 each
    let layers = 2 * (7680 * 2 + 2 * 32 * 4);
    let table = 50 * 32 * 2;
    for path in PATHS {
        for tied in [true, false] {
            let w = backend_on(path, tied, 8).weight_bytes();
            let at = format!("{path:?} tied={tied}: {w:?}");
            assert_eq!((w.layers, w.final_norm), (layers, 32 * 4), "{at}");
            // the head: its own matrix, or the table it reads when tied (the
            // fast path's panels pad the 50 rows to whole panels)
            let head = w.lm_head.unwrap_or(w.embed);
            let padded = path == CpuPath::Fast && head > table && head < 2 * table;
            assert!(head == table || padded, "{at}");
            if path == CpuPath::Reference {
                assert_eq!(w.lm_head.is_none(), tied, "{at}");
                assert_eq!(w.embed, table, "{at}");
            }
        }
    }
}

#[test]
fn prefill_equals_token_by_token_decode_and_chunked_prefill() {
    for path in PATHS {
        prefill_equals_decode_on(path);
    }
}

#[test]
fn long_chunks_on_scattered_blocks_equal_decode_on_the_fast_path() {
    // chunks of 16+ tokens take the fast path's GEMM attention; the cache
    // blocks are scattered and the second chunk attends to the first's keys
    let mut b = backend_on(CpuPath::Fast, false, 16);
    let blocks: Vec<u32> = vec![9, 3, 14, 0, 6, 11];
    let n = LONG_PROMPT.len();
    let whole = build_step(&[chunk(&LONG_PROMPT, 0, blocks.clone())], BS).unwrap();
    let all = b.logits(&whole, &(0..n).collect::<Vec<_>>()).unwrap();
    let want = naive(b.config(), &weights(b.config(), false), &LONG_PROMPT);
    for (r, w) in want.iter().enumerate() {
        assert!(rel_err(&all[r * 50..(r + 1) * 50], w) < 1e-5, "row {r}");
    }
    let mut c = backend_on(CpuPath::Fast, false, 16);
    let first = [LONG_PROMPT, LONG_PROMPT].concat();
    let long = &first[..n + 16];
    c.logits(
        &build_step(
            &[chunk(
                &long[..16],
                0,
                vec![2, 8, 5, 1, 12, 7, 4, 10, 13, 15],
            )],
            BS,
        )
        .unwrap(),
        &[],
    )
    .unwrap();
    let rest = c
        .logits(
            &build_step(
                &[chunk(
                    &long[16..],
                    16,
                    vec![2, 8, 5, 1, 12, 7, 4, 10, 13, 15],
                )],
                BS,
            )
            .unwrap(),
            &[n - 1],
        )
        .unwrap();
    let want = naive(c.config(), &weights(c.config(), false), long);
    assert!(rel_err(&rest, &want[n + 15]) < 1e-5);
}

fn prefill_equals_decode_on(path: CpuPath) {
    let mut b = backend_on(path, true, 8);
    let blocks = contiguous_blocks(2, PROMPT.len(), BS);
    let one = build_step(&[chunk(&PROMPT, 0, blocks.clone())], BS).unwrap();
    let all = b
        .logits(&one, &(0..PROMPT.len()).collect::<Vec<_>>())
        .unwrap();
    for (p, tok) in PROMPT.iter().enumerate() {
        let step = build_step(&[chunk(&[*tok], p, blocks.clone())], BS).unwrap();
        let row = b.logits(&step, &[0]).unwrap();
        assert!(
            rel_err(
                &row,
                &all[p * 50..(p + 1) * 50]
                    .iter()
                    .map(|&v| v as f64)
                    .collect::<Vec<_>>()
            ) < 1e-5
        );
    }
    // chunked prefill: 5 tokens, then the remaining 6
    b.logits(
        &build_step(&[chunk(&PROMPT[..5], 0, blocks.clone())], BS).unwrap(),
        &[],
    )
    .unwrap();
    let rest = b
        .logits(
            &build_step(&[chunk(&PROMPT[5..], 5, blocks)], BS).unwrap(),
            &[5],
        )
        .unwrap();
    let last: Vec<f64> = all[10 * 50..].iter().map(|&v| v as f64).collect();
    assert!(rel_err(&rest, &last) < 1e-5);
}

#[test]
fn mixed_batch_with_scattered_blocks_equals_each_alone() {
    for path in PATHS {
        mixed_batch_equals_alone_on(path);
    }
}

fn mixed_batch_equals_alone_on(path: CpuPath) {
    let backend = |tied, n| backend_on(path, tied, n);
    let a: &[u32] = &PROMPT;
    let bseq: &[u32] = &[5, 9, 44, 2, 2];
    // alone, contiguous blocks at the start of the pool
    let mut alone = backend(false, 16);
    let la = alone
        .logits(
            &build_step(&[chunk(a, 0, contiguous_blocks(0, a.len(), BS))], BS).unwrap(),
            &[10],
        )
        .unwrap();
    let lb = alone
        .logits(
            &build_step(&[chunk(bseq, 0, contiguous_blocks(0, 5, BS))], BS).unwrap(),
            &[4],
        )
        .unwrap();
    // together, interleaved non-contiguous blocks
    let (ta, tb) = (vec![13, 2, 7], vec![9, 0]);
    let mut both = backend(false, 16);
    let batch = build_step(&[chunk(a, 0, ta.clone()), chunk(bseq, 0, tb.clone())], BS).unwrap();
    let l = both.logits(&batch, &[10, a.len() + 4]).unwrap();
    assert!(rel_err(&l[..50], &la.iter().map(|&v| v as f64).collect::<Vec<_>>()) < 1e-6);
    assert!(rel_err(&l[50..], &lb.iter().map(|&v| v as f64).collect::<Vec<_>>()) < 1e-6);
    // a following decode step of both, with B's prefill chunked against A's decode
    let mut dec_alone = backend(false, 16);
    let ga = generate_greedy(&mut dec_alone, &[a], &[contiguous_blocks(0, 16, BS)], 4).unwrap();
    let gb = generate_greedy(&mut dec_alone, &[bseq], &[contiguous_blocks(4, 16, BS)], 4).unwrap();
    let mut dec_both = backend(false, 16);
    let g = generate_greedy(
        &mut dec_both,
        &[a, bseq],
        &[vec![13, 2, 7, 11], vec![9, 0, 15, 3]],
        4,
    )
    .unwrap();
    assert_eq!(g, vec![ga[0].clone(), gb[0].clone()]);
}

#[test]
fn step_samples_exactly_the_requested_sequences() {
    let mut b = backend(true, 16);
    let greedy = Some(SampleRequest {
        params: SamplingParams {
            logprobs: 2,
            ..SamplingParams::greedy()
        },
        step: 0,
        history: None,
        allowed: None,
    });
    let mut c0 = chunk(&PROMPT, 0, contiguous_blocks(0, 11, BS));
    c0.sample = greedy.clone();
    let c1 = chunk(&[1, 2], 0, vec![5]);
    let batch = build_step(&[c0.clone(), c1], BS).unwrap();
    let out = b.step(&batch).unwrap();
    assert!(out[1].is_none());
    let s = out[0].clone().unwrap();
    let z = backend(true, 16)
        .logits(&build_step(&[c0], BS).unwrap(), &[10])
        .unwrap();
    assert_eq!(s.token, ops::sampling::argmax(&z));
    assert_eq!(s.top_logprobs.len(), 2);
    assert_eq!(s.top_logprobs[0].0, s.token);
    assert!((s.logprob - s.top_logprobs[0].1).abs() < 1e-6 && s.logprob < 0.0);
}

#[test]
fn bad_batches_and_weights_are_errors_naming_the_field() {
    let mut b = backend(true, 4);
    let ok = build_step(&[chunk(&PROMPT[..3], 0, vec![1])], BS).unwrap();
    let err =
        |b: &mut CpuBackend, batch: &StepBatch| b.logits(batch, &[0]).unwrap_err().to_string();
    let mut bad = ok.clone();
    bad.tokens[1] = 50;
    assert!(err(&mut b, &bad).contains("tokens[1] = 50"));
    let mut bad = ok.clone();
    bad.slot_mapping[0] = 0;
    assert!(err(&mut b, &bad).contains("slot"));
    // a sequence at position 12 whose table points outside the 4-block pool
    let far = build_step(&[chunk(&[1], 12, vec![0, 1, 2, 9])], BS);
    assert!(err(&mut b, &far.unwrap()).contains("block 9 outside the pool"));
    let past = build_step(&[chunk(&[1], 17, vec![0, 1, 2, 3, 3])], BS).unwrap();
    assert!(err(&mut b, &past).contains("positions[0] = 17"));
    let mut unread = build_step(&[chunk(&[1], 5, vec![7, 1])], BS).unwrap();
    assert!(err(&mut b, &unread).contains("block 7"));
    unread.block_tables[0] = 0;
    assert!(
        b.logits(&unread, &[1])
            .unwrap_err()
            .to_string()
            .contains("row 1 is outside")
    );
    assert!(build_step(&[chunk(&PROMPT, 0, vec![0])], BS).is_err());
    let c = config(true);
    let mut w = weights(&c, true);
    w.layers[1].k_proj = Projection::Bf16(tensor(
        "model.layers.1.self_attn.k_proj.weight",
        &[3, 32],
        0,
        1.0,
        0.0,
    ));
    let e = CpuBackend::new(
        c.clone(),
        w,
        KvShape {
            num_blocks: 1,
            block_size: 1,
        },
    )
    .err()
    .unwrap();
    assert!(
        e.to_string()
            .contains("model.layers.1.self_attn.k_proj.weight"),
        "{e}"
    );
    let e = CpuBackend::new(
        c.clone(),
        weights(&c, true),
        KvShape {
            num_blocks: 0,
            block_size: 4,
        },
    );
    assert!(e.is_err());
}

/// The named malformed batches of `contract::testing` on the tiny synthetic
/// preset: every one is an `InvalidBatch` error, and the backend still runs
/// a well-formed step afterwards.
#[test]
fn malformed_batches_are_errors_on_the_tiny_preset() {
    let dir = tempfile::tempdir().unwrap();
    checkpoint::synth::synth_model(contract::presets::Preset::Tiny, 7, dir.path()).unwrap();
    let m = checkpoint::loader::load_config(dir.path()).unwrap();
    let w = checkpoint::loader::load_weights(dir.path(), &m.config).unwrap();
    let kv = KvShape {
        num_blocks: 8,
        block_size: BS,
    };
    let vocab = m.config.vocab_size;
    let mut b = CpuBackend::new(m.config, w, kv).unwrap();
    let max_pos = b.rope.positions();
    for (what, batch) in malformed_batches(kv, vocab, max_pos) {
        let r = b.step(&batch);
        assert!(
            matches!(r, Err(BackendError::InvalidBatch(_))),
            "{what}: {r:?}"
        );
        assert!(b.logits(&batch, &[0]).is_err(), "{what}");
    }
    let ok = well_formed(kv, &[(5, 5), (3, 1)], |s, j| (2 * s + j) as u32);
    assert_eq!(b.step(&ok).unwrap(), vec![None, None]);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// A random well-formed batch with one field broken is an error from
    /// `step`, never a panic.
    #[test]
    fn any_malformed_batch_is_an_error(
        plan in proptest::collection::vec((1usize..=16, 1usize..=16), 1..=3),
        m in proptest::sample::select(Malformation::ALL.to_vec()),
        at in proptest::prelude::any::<usize>(),
        by in proptest::prelude::any::<u32>(),
    ) {
        let mut b = backend(true, 16);
        let kv = b.kv;
        let ok = well_formed(kv, &plan, |s, j| (4 * s + j) as u32);
        proptest::prop_assert!(b.check_batch(&ok).is_ok());
        let bad = malform(&ok, m, at, by, kv, b.config.vocab_size);
        let r = b.step(&bad);
        proptest::prop_assert!(matches!(r, Err(BackendError::InvalidBatch(_))), "{:?}: {:?}", m, r);
    }
}

/// A NaN weight makes the logits
/// non-finite, and the sampled token's log-probability says so (NaN): the
/// flag the engine ends such a request on, without a host scan of the logits.
#[test]
fn non_finite_weights_give_a_nan_logprob() {
    for path in PATHS {
        for prompt in [&PROMPT[..], &LONG_PROMPT[..]] {
            let c = config(true);
            let mut w = weights(&c, true);
            if let Projection::Bf16(t) = &mut w.layers[1].down_proj {
                t.data[5] = bf16::NAN;
            }
            let kv = KvShape {
                num_blocks: 8,
                block_size: BS,
            };
            let mut b = CpuBackend::with_path(c, w, kv, path).unwrap();
            // the prompt, its last token sampled greedily
            let step = || {
                let mut ch = chunk(prompt, 0, contiguous_blocks(2, prompt.len(), BS));
                ch.sample = Some(SampleRequest {
                    params: SamplingParams::greedy(),
                    step: 0,
                    history: None,
                    allowed: None,
                });
                build_step(&[ch], BS).unwrap()
            };
            let out = b.step(&step()).unwrap();
            let tok = out[0].as_ref().expect("a sampled token");
            assert!(tok.logprob.is_nan(), "{path:?}: logprob {}", tok.logprob);
            // the healthy model's is finite
            let out = backend_on(path, true, 8).step(&step()).unwrap();
            assert!(out[0].as_ref().unwrap().logprob.is_finite(), "{path:?}");
        }
    }
}

/// The quantised fast path: close to the exact product (Q8_0 tighter than
/// Q4_1), prefill equal to decode, a GGUF's blocks equal to the same blocks
/// quantised at load, and the refusals.
mod quant {
    use super::*;
    use checkpoint::gguf::GgmlType;
    use cpu_kernels::quant::QuantType;

    /// `w` with each layer projection `keep` names replaced by its Q4_1
    /// blocks, and an untied head by its Q8_0 blocks, as a GGUF holds them.
    fn in_blocks(w: &ModelWeights, keep: &dyn Fn(&str) -> bool) -> ModelWeights {
        let mut out = w.clone();
        for p in out.layers.iter_mut().flat_map(|l| l.projections_mut()) {
            if let Projection::Bf16(t) = p
                && keep(&t.name)
            {
                *p = Projection::Blocks(blocks(t, QuantType::Q4_1, GgmlType::Q4_1));
            }
        }
        if let Some(Projection::Bf16(t)) = &out.lm_head {
            let b = blocks(t, QuantType::Q8_0, GgmlType::Q8_0);
            out.lm_head = Some(Projection::Blocks(b));
        }
        out
    }

    fn stored_backend(c: &ModelConfig, w: ModelWeights) -> CpuBackend {
        CpuBackend::with_weights(c.clone(), w, kv(8), CpuPath::Fast, CpuWeights::Stored).unwrap()
    }

    fn kv(num_blocks: usize) -> KvShape {
        KvShape {
            num_blocks,
            block_size: BS,
        }
    }

    fn quant_backend(tied: bool, format: CpuWeights) -> CpuBackend {
        let c = config_with(tied, 64);
        let w = weights(&c, tied);
        CpuBackend::with_weights(c, w, kv(8), CpuPath::Fast, format).unwrap()
    }

    fn logits_of(b: &mut CpuBackend, prompt: &[u32]) -> Vec<f32> {
        let batch = build_step(
            &[chunk(prompt, 0, contiguous_blocks(0, prompt.len(), BS))],
            BS,
        )
        .unwrap();
        b.logits(&batch, &(0..prompt.len()).collect::<Vec<_>>())
            .unwrap()
    }

    #[test]
    fn quantised_logits_track_the_exact_product() {
        for tied in [true, false] {
            let c = config_with(tied, 64);
            let w = weights(&c, tied);
            for prompt in [&PROMPT[..], &LONG_PROMPT[..]] {
                let want = naive(&c, &w, prompt);
                // random uniform weights are the worst case of a block
                // format (no outliers to spend the range on)
                let mut worst = Vec::new();
                for (qt, bound) in [(QuantType::Q8_0, 0.05), (QuantType::Q4_1, 0.5)] {
                    let mut b = quant_backend(tied, CpuWeights::Quantize(qt));
                    assert!(b.name().contains(&qt.name().to_lowercase()), "{}", b.name());
                    let got = logits_of(&mut b, prompt);
                    let mut max = 0f64;
                    for (r, w) in want.iter().enumerate() {
                        let e = rel_err(&got[r * 50..(r + 1) * 50], w);
                        assert!(e < bound, "{qt:?} tied={tied} row {r}: rel err {e}");
                        max = max.max(e);
                    }
                    worst.push(max);
                }
                assert!(
                    worst[0] < worst[1] / 3.0,
                    "Q8_0 {} vs Q4_1 {}",
                    worst[0],
                    worst[1]
                );
            }
        }
    }

    #[test]
    fn quantised_prefill_equals_decode() {
        let mut b = quant_backend(true, CpuWeights::Quantize(QuantType::Q4_1));
        let blocks = contiguous_blocks(2, LONG_PROMPT.len(), BS);
        let one = build_step(&[chunk(&LONG_PROMPT, 0, blocks.clone())], BS).unwrap();
        let all = b
            .logits(&one, &(0..LONG_PROMPT.len()).collect::<Vec<_>>())
            .unwrap();
        for (p, tok) in LONG_PROMPT.iter().enumerate() {
            let step = build_step(&[chunk(&[*tok], p, blocks.clone())], BS).unwrap();
            let row = b.logits(&step, &[0]).unwrap();
            let want: Vec<f64> = all[p * 50..(p + 1) * 50]
                .iter()
                .map(|&v| v as f64)
                .collect();
            // a prefill chunk's attention (two GEMMs) and a decode's sum
            // in different orders, so the 16-bit activations may round
            // differently: at most one rounding a quantised input on each
            // side (two layers of four inputs, and the head's), whichever
            // path the processor runs
            let roundings = (2 * 4 + 1) as f64;
            let bound = 2.0 * roundings * cpu_kernels::quant::ACT_ROUNDING;
            let e = rel_err(&row, &want);
            assert!(e < bound, "position {p}: {e} (bound {bound:.3e})");
        }
    }

    /// A sequence's logits do not depend on what else its step runs
    /// (batch vs alone bit for bit, decode rows of 1 and of 3 tokens).
    #[test]
    fn quantised_batch_equals_alone_bit_for_bit() {
        let fmt = CpuWeights::Quantize(QuantType::Q4_1);
        let a: &[u32] = &PROMPT;
        let mut alone = quant_backend(false, fmt);
        let one = build_step(&[chunk(a, 0, contiguous_blocks(0, a.len(), BS))], BS).unwrap();
        let la = alone.logits(&one, &[a.len() - 1]).unwrap();
        let d1 = build_step(
            &[chunk(&[7], a.len(), contiguous_blocks(0, a.len() + 1, BS))],
            BS,
        )
        .unwrap();
        let da = alone.logits(&d1, &[0]).unwrap();
        let c = config_with(false, 64);
        let mut both =
            CpuBackend::with_weights(c.clone(), weights(&c, false), kv(16), CpuPath::Fast, fmt)
                .unwrap();
        let (ta, tb, tc) = (vec![13, 2, 7, 5], vec![9, 0, 1, 3], vec![4, 6, 8, 10]);
        let batch = build_step(
            &[
                chunk(a, 0, ta.clone()),
                chunk(&[5, 9, 44], 0, tb.clone()),
                chunk(a, 0, tc.clone()),
            ],
            BS,
        )
        .unwrap();
        let l = both
            .logits(&batch, &[a.len() - 1, a.len() + 2 + a.len()])
            .unwrap();
        assert_eq!(&l[..50], &la[..]);
        assert_eq!(&l[50..], &la[..]);
        let d3 = build_step(
            &[
                chunk(&[7], a.len(), ta),
                chunk(&[1], 3, tb),
                chunk(&[7], a.len(), tc),
            ],
            BS,
        )
        .unwrap();
        let d = both.logits(&d3, &[0, 2]).unwrap();
        assert_eq!(&d[..50], &da[..]);
        assert_eq!(&d[50..], &da[..]);
    }

    #[test]
    fn gguf_blocks_equal_the_same_blocks_quantised_at_load_and_mixed_groups_stack() {
        let tied = false;
        let c = config_with(tied, 64);
        let w = weights(&c, tied);
        let mut from_gguf = stored_backend(&c, in_blocks(&w, &|_| true));
        assert!(
            from_gguf.name().contains("gguf Q4_1+Q8_0"),
            "{}",
            from_gguf.name()
        );
        let mut at_load = quant_backend(tied, CpuWeights::Quantize(QuantType::Q4_1));
        assert_eq!(
            logits_of(&mut from_gguf, &PROMPT),
            logits_of(&mut at_load, &PROMPT)
        );
        // one member of gate/up not kept: the kept one keeps its blocks
        // (a stack of parts), the other runs BF16: neither all-BF16 nor
        // all-Q4_1 (the stack's exactness: packed::tests)
        let mut m = stored_backend(&c, in_blocks(&w, &|n| n != "up"));
        let mut n = stored_backend(&c, in_blocks(&w, &|n| n != "up" && n != "gate"));
        let got = logits_of(&mut m, &PROMPT);
        let (bf, q) = (logits_of(&mut n, &PROMPT), logits_of(&mut at_load, &PROMPT));
        assert_ne!(got, bf);
        assert_ne!(got, q);
        let f64s = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
        assert!(rel_err(&got, &f64s(&bf)) < rel_err(&q, &f64s(&bf)));
    }

    #[test]
    fn quantised_formats_are_refused_where_they_cannot_run() {
        let c = config_with(true, 64);
        let err = CpuBackend::with_weights(
            c.clone(),
            weights(&c, true),
            kv(8),
            CpuPath::Reference,
            CpuWeights::Quantize(QuantType::Q8_0),
        )
        .err()
        .expect("reference path with quantised weights");
        assert!(err.to_string().contains("reference"), "{err}");
        // blocks on the reference path: refused naming the tensor and format
        let err = CpuBackend::with_weights(
            c.clone(),
            in_blocks(&weights(&c, true), &|n| n == "v"),
            kv(8),
            CpuPath::Reference,
            CpuWeights::Stored,
        )
        .err()
        .expect("reference path with blocks");
        let e = err.to_string();
        assert!(
            e.contains("`v`") && e.contains("q4_1") && e.contains("reference"),
            "{e}"
        );
        // rows of 48 values are not whole blocks of 32
        let c = config(true);
        let err = CpuBackend::with_weights(
            c.clone(),
            weights(&c, true),
            kv(8),
            CpuPath::Fast,
            CpuWeights::Quantize(QuantType::Q4_1),
        )
        .err()
        .expect("rows of 48");
        assert!(
            err.to_string().contains("`down`") && err.to_string().contains("48"),
            "{err}"
        );
    }
}
