//! Step metadata: slot mapping of runs of positions and dense block-table
//! rows padded with 0 to the batch's longest.

use paged_kv::{KvConfig, KvError, KvManager, StepMetadataBuilder, build_step_metadata};

fn ok<T>(r: Result<T, KvError>) -> T {
    r.unwrap_or_else(|e| panic!("unexpected error: {e}"))
}

#[test]
fn mixed_prefill_chunk_and_decode() {
    let mut kv = ok(KvManager::try_new(KvConfig {
        num_blocks: 16,
        block_size: 4,
        enable_prefix_cache: true,
    }));
    ok(kv.admit(10, &(0..10).collect::<Vec<u32>>())); // 3 blocks
    ok(kv.admit(20, &[1, 2, 3])); // 1 block
    let (a, b) = (
        kv.block_table(10).unwrap_or_default().to_vec(),
        kv.block_table(20).unwrap_or_default().to_vec(),
    );
    // seq 10: prefill chunk 3..6 (context 6 -> 2 blocks); seq 20: decode position 2.
    let md = ok(build_step_metadata(&kv, &[(10, 3..6), (20, 2..3)]));
    let slot = |blk: u32, off: u32| blk * 4 + off;
    assert_eq!(
        md.slot_mapping,
        vec![slot(a[0], 3), slot(a[1], 0), slot(a[1], 1), slot(b[0], 2)]
    );
    assert_eq!(md.context_lens, vec![6, 3]);
    assert_eq!(md.max_blocks, 2);
    assert_eq!(md.block_tables, vec![a[0], a[1], b[0], 0]);
    for (i, (s, p)) in [(10, 3), (10, 4), (10, 5), (20, 2)].into_iter().enumerate() {
        assert_eq!(kv.slot(s, p), Some(md.slot_mapping[i]));
    }

    // Builder reuse across steps.
    let mut bld = StepMetadataBuilder::new();
    ok(bld.push(&kv, 20, 0..3));
    ok(bld.push(&kv, 10, 0..10));
    assert_eq!((bld.num_seqs(), bld.num_tokens()), (2, 13));
    let md = bld.build();
    assert_eq!(md.max_blocks, 3);
    assert_eq!(md.block_tables, vec![b[0], 0, 0, a[0], a[1], a[2]]);
    bld.clear();
    assert_eq!(bld.build(), Default::default());
}

#[test]
fn bad_runs_are_reported_and_add_nothing() {
    let mut kv = ok(KvManager::try_new(KvConfig {
        num_blocks: 4,
        block_size: 2,
        enable_prefix_cache: false,
    }));
    ok(kv.admit(1, &[1, 2, 3]));
    let mut bld = StepMetadataBuilder::new();
    assert_eq!(bld.push(&kv, 2, 0..1), Err(KvError::UnknownSeq(2)));
    assert_eq!(
        bld.push(&kv, 1, 2..2),
        Err(KvError::EmptyRun { seq: 1, start: 2 })
    );
    let e = bld.push(&kv, 1, 1..4);
    assert_eq!(
        e,
        Err(KvError::PositionOutOfRange {
            seq: 1,
            start: 1,
            end: 4,
            len: 3
        })
    );
    assert_eq!((bld.num_seqs(), bld.num_tokens()), (0, 0));
    assert!(build_step_metadata(&kv, &[(1, 0..3), (5, 0..1)]).is_err());
}
