//! [`StepBatch::check`] never panics, accepts well-formed batches and rejects
//! every malformed one (property tests over arbitrary and mutated batches).

use super::*;
use crate::testing::{Malformation, malform, malformed_batches, well_formed};
use proptest::prelude::*;

const VOCAB: usize = 50;

fn kv(num_blocks: usize, block_size: usize) -> KvShape {
    KvShape {
        num_blocks,
        block_size,
    }
}

fn max_ctx(b: &StepBatch) -> usize {
    b.context_lens
        .iter()
        .map(|&c| c as usize)
        .max()
        .unwrap_or(0)
}

#[test]
fn the_named_malformed_batches_are_errors() {
    let shape = kv(8, 4);
    for (what, b) in malformed_batches(shape, VOCAB, 32) {
        let r = b.check(shape, VOCAB, 32);
        assert!(
            matches!(r, Err(BackendError::InvalidBatch(_))),
            "{what}: {r:?}"
        );
    }
}

#[test]
fn errors_name_the_field() {
    let shape = kv(8, 4);
    let cases = malformed_batches(shape, VOCAB, 32);
    let msg = |name: &str| {
        let (_, b) = cases
            .iter()
            .find(|(w, _)| w == name)
            .unwrap_or_else(|| panic!("no case {name}"));
        b.check(shape, VOCAB, 32)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    assert!(msg("positions [100, 1] with context 2").contains("positions[1] = 1"));
    assert!(msg("a block table shorter than the context").contains("block_tables row 0"));
    assert!(msg("a slot beyond the pool").contains("slot_mapping[0]"));
    assert!(msg("a block beyond the pool").contains("block 13 outside the pool"));
    assert!(msg("a position past the RoPE table").contains("positions[0] = 32 exceeds"));
    assert!(msg("cu_seqlens past the tokens").contains("cu_seqlens"));
    assert!(msg("a carried token past the tokens").contains("carried[0] names token 1"));
    let b = well_formed(shape, &[(6, 6)], |_, j| j as u32);
    assert_eq!(b.check(shape, VOCAB, 32).ok(), Some(()));
    assert!(
        b.check(kv(8, 0), VOCAB, 32)
            .is_err_and(|e| e.to_string().contains("kv shape"))
    );
}

#[test]
fn block_table_is_empty_past_the_rows() {
    let b = well_formed(kv(4, 2), &[(3, 1)], |_, j| j as u32);
    assert_eq!(b.block_table(0), &[0, 1]);
    assert_eq!(b.block_table(1), &[] as &[u32]);
    assert_eq!(b.block_table(usize::MAX), &[] as &[u32]);
}

/// Sequences as `(context_len, chunk)` plus their block choices.
fn seqs() -> impl Strategy<Value = Vec<(usize, usize, Vec<u32>)>> {
    prop::collection::vec(
        (
            1usize..=24,
            1usize..=24,
            prop::collection::vec(any::<u32>(), 24),
        ),
        1..=4,
    )
}

fn small_vec() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(prop_oneof![0u32..40, Just(u32::MAX), any::<u32>()], 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Arbitrary field values and shapes: `check` returns, never panics.
    #[test]
    fn arbitrary_batches_never_panic(
        tokens in small_vec(),
        positions in small_vec(),
        cu_seqlens in small_vec(),
        slot_mapping in small_vec(),
        context_lens in small_vec(),
        block_tables in small_vec(),
        max_blocks in prop_oneof![0usize..4, Just(usize::MAX)],
        samples in 0usize..6,
        drafts in small_vec(),
        num_blocks in prop_oneof![0usize..16, Just(usize::MAX)],
        block_size in prop_oneof![0usize..5, Just(usize::MAX)],
        max_positions in prop_oneof![0usize..64, Just(usize::MAX)],
    ) {
        let b = StepBatch {
            tokens, positions, cu_seqlens, slot_mapping, context_lens, block_tables,
            max_blocks, samples: vec![None; samples], prompt_lens: Vec::new(), carried: Vec::new(),
            drafts, draft_masks: Vec::new(), loras: Vec::new(),
        };
        let _ = b.check(kv(num_blocks, block_size), VOCAB, max_positions);
        let _ = b.validate(num_blocks, block_size);
        let _ = b.block_table(samples);
    }

    /// Batches built consistently pass; any one field broken fails.
    #[test]
    fn well_formed_pass_and_each_malformation_fails(
        seqs in seqs(),
        num_blocks in 1usize..12,
        block_size in 1usize..6,
        m in prop::sample::select(Malformation::ALL.to_vec()),
        at in any::<usize>(),
        by in prop_oneof![1u32..4, any::<u32>()],
    ) {
        let shape = kv(num_blocks, block_size);
        let plan: Vec<(usize, usize)> = seqs.iter().map(|(c, k, _)| (*c, *k)).collect();
        let b = well_formed(shape, &plan, |s, j| seqs[s].2[j]);
        let max_pos = max_ctx(&b);
        prop_assert!(b.check(shape, VOCAB, max_pos).is_ok(), "{b:?}");
        // one position short of the RoPE table is an error
        prop_assert!(b.check(shape, VOCAB, max_pos - 1).is_err());
        let bad = malform(&b, m, at, by, shape, VOCAB);
        let r = bad.check(shape, VOCAB, usize::MAX);
        prop_assert!(matches!(r, Err(BackendError::InvalidBatch(_))), "{m:?}: {bad:?}");
    }
}
