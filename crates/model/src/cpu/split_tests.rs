//! The fast path's prompt rows on the split products
//! (`cpu_kernels::gemm_split`, where the processor has AVX-512 BF16 and
//! VNNI) and on the quantised GEMM (`cpu_kernels::quant::gemm`): close to
//! the exact forward pass, and a prompt token's logits the same bits
//! whatever else its step runs.

use super::batch::{SeqChunk, build_step, contiguous_blocks};
use super::tests::{
    BS, LONG_PROMPT, PROMPT, backend_on, chunk, config_with, naive, rel_err, weights,
};
use super::*;
use contract::Backend;

fn prompt(tokens: &[u32], start: usize, blocks: Vec<u32>, prompt_len: usize) -> SeqChunk {
    SeqChunk {
        prompt_len,
        ..chunk(tokens, start, blocks)
    }
}

#[test]
fn prompt_rows_are_close_to_the_exact_pass_and_generated_rows_unchanged() {
    if !cpu_kernels::isa::test_runs_here(
        cpu_kernels::isa::split_products(),
        concat!(
            module_path!(),
            "::prompt_rows_are_close_to_the_exact_pass_and_generated_rows_unchanged"
        ),
        "AVX-512 BF16 and VNNI",
    ) {
        return;
    }
    let mut split = backend_on(CpuPath::Fast, false, 16);
    assert!(split.name().contains("bf16/vnni"), "{}", split.name());
    let mut f32s = backend_on(CpuPath::Fast, false, 16).without_split_products();
    assert!(!f32s.name().contains("bf16/vnni"));
    let n = LONG_PROMPT.len();
    let want = naive(
        split.config(),
        &weights(split.config(), false),
        &LONG_PROMPT,
    );
    let blocks = contiguous_blocks(0, n, BS);
    let rows: Vec<usize> = (0..n).collect();
    let as_prompt = build_step(&[prompt(&LONG_PROMPT, 0, blocks.clone(), n)], BS).unwrap();
    let as_generated = build_step(&[chunk(&LONG_PROMPT, 0, blocks)], BS).unwrap();
    let (ls, lf) = (
        split.logits(&as_prompt, &rows).unwrap(),
        f32s.logits(&as_prompt, &rows).unwrap(),
    );
    let lg = split.logits(&as_generated, &rows).unwrap();
    assert_ne!(ls, lf, "the prompt rows ran the f32 products");
    assert_eq!(lg, lf, "generated rows must run the f32 products");
    for (r, w) in want.iter().enumerate() {
        let (es, ef) = (
            rel_err(&ls[r * 50..][..50], w),
            rel_err(&lf[r * 50..][..50], w),
        );
        assert!(es < 1e-3 && ef < 1e-5, "row {r}: split {es:e}, f32 {ef:e}");
    }
}

/// A prompt's rows give the same bits alone, beside another prompt and a
/// generated token, and for one token; a generated row beside prompts the
/// same bits as alone: BF16 weights on the split products.
#[test]
fn a_prompt_tokens_logits_do_not_depend_on_the_rest_of_the_step() {
    if !cpu_kernels::isa::test_runs_here(
        cpu_kernels::isa::split_products(),
        concat!(
            module_path!(),
            "::a_prompt_tokens_logits_do_not_depend_on_the_rest_of_the_step"
        ),
        "AVX-512 BF16 and VNNI",
    ) {
        return;
    }
    independent_of_the_step(|| backend_on(CpuPath::Fast, false, 32));
}

/// The same for Q4_1 blocks, whose prompt rows run the quantised GEMM.
#[test]
fn a_quantised_prompt_tokens_logits_do_not_depend_on_the_rest_of_the_step() {
    if !cpu_kernels::isa::test_runs_here(
        Isa::best() == Isa::Avx512 && cpu_kernels::quant::gemm::supported(),
        concat!(
            module_path!(),
            "::a_quantised_prompt_tokens_logits_do_not_depend_on_the_rest_of_the_step"
        ),
        "AVX-512 VNNI",
    ) {
        return;
    }
    independent_of_the_step(|| {
        let c = config_with(false, 64);
        let w = weights(&c, false);
        let kv = KvShape {
            num_blocks: 32,
            block_size: BS,
        };
        let fmt = CpuWeights::Quantize(cpu_kernels::quant::QuantType::Q4_1);
        CpuBackend::with_weights(c, w, kv, CpuPath::Fast, fmt).unwrap()
    });
}

fn independent_of_the_step(backend: impl Fn() -> CpuBackend) {
    let a: &[u32] = &LONG_PROMPT;
    let b: &[u32] = &PROMPT;
    let mut alone = backend();
    let la = alone
        .logits(
            &build_step(
                &[prompt(a, 0, contiguous_blocks(0, a.len(), BS), a.len())],
                BS,
            )
            .unwrap(),
            &(0..a.len()).collect::<Vec<_>>(),
        )
        .unwrap();
    // b prefilled, then its next token alone (a generated row, 1 token)
    let bt = contiguous_blocks(8, b.len() + 1, BS);
    alone
        .logits(
            &build_step(&[prompt(b, 0, bt.clone(), b.len())], BS).unwrap(),
            &[],
        )
        .unwrap();
    let gen_step = build_step(&[prompt(&[7], b.len(), bt, b.len())], BS).unwrap();
    let lb = alone.logits(&gen_step, &[0]).unwrap();
    // together: b's generated token, a's prompt, and a one-token prompt
    let mut both = backend();
    let bt2 = vec![20, 3, 17];
    both.logits(
        &build_step(&[prompt(b, 0, bt2.clone(), b.len())], BS).unwrap(),
        &[],
    )
    .unwrap();
    let step = build_step(
        &[
            prompt(&[7], b.len(), bt2, b.len()),
            prompt(a, 0, vec![9, 0, 13, 5, 11, 1], a.len()),
            prompt(&a[..1], 0, vec![30], 1),
        ],
        BS,
    )
    .unwrap();
    // rows asked one call at a time where alone asked one: the LM head's
    // regime follows the number of rows asked (not what this tests)
    let l = both
        .logits(&step, &(1..=a.len()).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(l, la, "the prompt rows");
    assert_eq!(both.logits(&step, &[0]).unwrap(), lb, "the generated row");
    let one = alone
        .logits(
            &build_step(&[prompt(&a[..1], 0, vec![31], 1)], BS).unwrap(),
            &[0],
        )
        .unwrap();
    let l1 = both.logits(&step, &[a.len() + 1]).unwrap();
    assert_eq!(l1, one, "the one-token prompt");
}

/// Sizes that are not whole panels, pairs or quads (hidden 40, an odd
/// intermediate size, head size 8) run the split products close to the
/// exact pass.
#[test]
fn ragged_shapes_run_the_split_products_close_to_the_exact_pass() {
    let text = r#"{"hidden_size": 40, "intermediate_size": 75, "num_hidden_layers": 2,
        "num_attention_heads": 5, "num_key_value_heads": 1, "vocab_size": 50,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_theta": 10000.0,
        "tie_word_embeddings": false}"#;
    let c = contract::config::ModelConfig::from_json(text, "test").unwrap();
    let kv = KvShape {
        num_blocks: 16,
        block_size: BS,
    };
    let mut b = CpuBackend::with_path(c.clone(), weights(&c, false), kv, CpuPath::Fast).unwrap();
    let want = naive(&c, &weights(&c, false), &LONG_PROMPT);
    let n = LONG_PROMPT.len();
    let batch = build_step(
        &[prompt(&LONG_PROMPT, 0, contiguous_blocks(0, n, BS), n)],
        BS,
    )
    .unwrap();
    let l = b.logits(&batch, &(0..n).collect::<Vec<_>>()).unwrap();
    for (r, w) in want.iter().enumerate() {
        let e = rel_err(&l[r * 50..][..50], w);
        assert!(e < 1e-3, "row {r}: rel err {e:e}");
    }
}
