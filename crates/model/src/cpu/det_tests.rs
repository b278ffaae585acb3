//! Deterministic mode on the fast path: a token's logits are the same bits
//! whatever its step holds (its sequence's prompt in one chunk, in chunks
//! shorter and longer than the segment GEMM's minimum, token by token as
//! generated tokens, beside another sequence's prompt, with many or one
//! row asked of the LM head), for BF16 weights with a tied and an untied
//! head and for Q4_1 blocks; and by default the same variants differ,
//! which is what the mode is for.

use super::batch::{SeqChunk, build_step, contiguous_blocks};
use super::tests::{BS, LONG_PROMPT, PROMPT, chunk, config_with, weights};
use super::*;
use contract::Backend;

/// The weight formats the variants run over.
#[derive(Clone, Copy, Debug)]
enum Format {
    Bf16 { tied: bool },
    Q4_1,
}

fn backend(format: Format, deterministic: bool) -> CpuBackend {
    let tied = matches!(format, Format::Bf16 { tied: true });
    let c = config_with(tied, 64); // whole Q4_1 blocks of 32
    let w = weights(&c, tied);
    let kv = KvShape {
        num_blocks: 32,
        block_size: BS,
    };
    let fmt = match format {
        Format::Bf16 { .. } => CpuWeights::Stored,
        Format::Q4_1 => CpuWeights::Quantize(cpu_kernels::quant::QuantType::Q4_1),
    };
    CpuBackend::with_weights(c, w, kv, CpuPath::Fast, fmt)
        .unwrap()
        .with_kv_cache_dtype(KvCacheDtype::Bf16)
        .with_deterministic(deterministic)
}

fn prompt(tokens: &[u32], start: usize, blocks: Vec<u32>) -> SeqChunk {
    SeqChunk {
        prompt_len: LONG_PROMPT.len(),
        ..chunk(tokens, start, blocks)
    }
}

/// `LONG_PROMPT`'s logits `[T, vocab]` with its prompt run in chunks of
/// `sizes` (all its rows asked at once per chunk).
fn chunked(b: &mut CpuBackend, sizes: &[usize]) -> Vec<f32> {
    let a = &LONG_PROMPT;
    let blocks = contiguous_blocks(0, a.len(), BS);
    let (mut out, mut at) = (Vec::new(), 0);
    for &n in sizes {
        let step = build_step(&[prompt(&a[at..at + n], at, blocks.clone())], BS).unwrap();
        out.extend(b.logits(&step, &(0..n).collect::<Vec<_>>()).unwrap());
        at += n;
    }
    assert_eq!(at, a.len());
    out
}

/// The variants of running `LONG_PROMPT`, each its logits `[T, vocab]`.
fn variants(format: Format, deterministic: bool) -> Vec<(&'static str, Vec<f32>)> {
    let a = &LONG_PROMPT;
    let n = a.len();
    let fresh = || backend(format, deterministic);
    let whole = chunked(&mut fresh(), &[n]);
    let small = chunked(&mut fresh(), &[3, 5, 2, 7, 4]);
    let mixed = chunked(&mut fresh(), &[2, 16, 3]);
    // one token a step, each a generated token, one row asked
    let mut b = fresh();
    let blocks = contiguous_blocks(0, n, BS);
    let mut generated = Vec::new();
    for i in 0..n {
        let step = build_step(&[chunk(&a[i..=i], i, blocks.clone())], BS).unwrap();
        generated.extend(b.logits(&step, &[0]).unwrap());
    }
    // beside another prompt (first in the step), in other blocks
    let mut b = fresh();
    let other = prompt(&PROMPT, 0, contiguous_blocks(20, PROMPT.len(), BS));
    let step = build_step(&[other, prompt(a, 0, vec![9, 0, 13, 5, 11, 1])], BS).unwrap();
    let rows: Vec<usize> = (PROMPT.len()..PROMPT.len() + n).collect();
    let beside = b.logits(&step, &rows).unwrap();
    vec![
        ("one chunk", whole),
        ("chunks of 2 to 7", small),
        ("chunks of 2, 16, 3", mixed),
        ("token by token, generated", generated),
        ("beside another prompt", beside),
    ]
}

const FORMATS: [Format; 3] = [
    Format::Bf16 { tied: true },
    Format::Bf16 { tied: false },
    Format::Q4_1,
];

#[test]
fn deterministic_logits_are_the_same_bits_however_the_prompt_is_stepped() {
    for format in FORMATS {
        assert!(backend(format, true).name().contains("deterministic"));
        let v = variants(format, true);
        let (name0, want) = &v[0];
        for (name, got) in &v[1..] {
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(want), "{format:?}: {name} vs {name0}");
        }
    }
}

/// What the mode changes: by default a prompt in one chunk of 16+ tokens
/// (GEMM attention, and the split products or the quantised GEMM where
/// the processor runs them) and the same tokens run one at a time (decode
/// attention, the row products) give different bits.
#[test]
fn by_default_the_stepping_changes_the_bits() {
    for format in FORMATS {
        let v = variants(format, false);
        let (one, tokens) = (&v[0].1, &v[3].1);
        assert_ne!(one, tokens, "{format:?}");
        // the rows agree to rounding all the same
        for (x, y) in one.iter().zip(tokens) {
            assert!(
                (x - y).abs() <= 1e-2 * (1.0 + x.abs()),
                "{format:?}: {x} vs {y}"
            );
        }
    }
}
