//! Scheduler unit tests on the fake backend: step composition, preemption
//! of the youngest, recompute on re-admission, aborts.

use super::*;
use crate::testing::{FakeBackend, fake_config};
use contract::{Backend, KvShape};

fn sched(blocks: usize, bs: usize, seqs: usize, budget: usize) -> Scheduler {
    let kv = KvConfig {
        num_blocks: blocks,
        block_size: bs,
        enable_prefix_cache: false,
    };
    Scheduler::new(kv, seqs, budget).expect("valid kv config")
}

fn segs(b: &StepBatch) -> Vec<u32> {
    b.cu_seqlens.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Runs one step on the fake and commits it; returns the sampled ids.
fn step(s: &mut Scheduler, fake: &mut FakeBackend) -> Vec<u64> {
    s.schedule().unwrap();
    let res = fake.step(s.batch()).unwrap();
    let mut out = Vec::new();
    s.commit(res, &mut out).unwrap();
    out.into_iter().map(|(id, _)| id).collect()
}

#[test]
fn decodes_first_then_chunks_under_the_budget() {
    let mut s = sched(64, 4, 8, 10);
    let mut fake = FakeBackend::new(
        fake_config().unwrap(),
        KvShape {
            num_blocks: 64,
            block_size: 4,
        },
    );
    s.add(0, vec![1, 2, 3], SamplingParams::greedy());
    s.add(1, (0..25).collect(), SamplingParams::greedy());
    // step 1: seq 0 whole (3), seq 1 its first 7
    assert_eq!(step(&mut s, &mut fake), vec![0]);
    assert_eq!(segs(s.batch()), vec![3, 7]);
    // step 2: seq 0 decodes (1), seq 1 gets the remaining 9 of the budget
    assert_eq!(step(&mut s, &mut fake), vec![0]);
    assert_eq!(segs(s.batch()), vec![1, 9]);
    assert_eq!(s.batch().positions[..2], [3, 7]);
    // step 3: the decode, then seq 1's last 9 tokens, sampled
    assert_eq!(step(&mut s, &mut fake), vec![0, 1]);
    assert_eq!(segs(s.batch()), vec![1, 9]);
    assert!(s.batch().samples.iter().all(Option::is_some));
    assert_eq!(s.seq(0).unwrap().generated(), 3);
}

#[test]
fn the_youngest_is_preempted_and_recomputed_first() {
    // 4 blocks of 2: two sequences of 3 tokens fill 4 blocks after one decode each
    let mut s = sched(4, 2, 4, 16);
    let mut fake = FakeBackend::new(
        fake_config().unwrap(),
        KvShape {
            num_blocks: 4,
            block_size: 2,
        },
    );
    s.add(0, vec![1, 2, 3], SamplingParams::greedy());
    s.add(1, vec![4, 5, 6], SamplingParams::greedy());
    assert_eq!(step(&mut s, &mut fake), vec![0, 1]); // 4 tokens each, 4 blocks
    assert_eq!(step(&mut s, &mut fake), vec![0, 1]); // 5 tokens each need 6 blocks
    s.schedule().unwrap();
    assert_eq!(s.preemptions_total, 1);
    assert_eq!(s.num_running(), 1);
    assert_eq!(s.waiting.front(), Some(&1));
    assert_eq!(s.seq(1).unwrap().num_computed, 0);
    assert_eq!(s.seq(1).unwrap().tokens.len(), 5);
    assert_eq!(s.planned_ids().collect::<Vec<_>>(), vec![0]);
    s.finish(0).unwrap();
    // re-admitted: all 5 known tokens recomputed, its 3rd token sampled
    s.schedule().unwrap();
    assert_eq!(segs(s.batch()), vec![5]);
    assert_eq!(s.batch().samples[0].as_ref().unwrap().step, 2);
    assert!(s.first_admitted().is_empty());
    let res = fake.step(s.batch()).unwrap();
    s.commit(res, &mut Vec::new()).unwrap();
    s.finish(1).unwrap();
    assert_eq!(s.kv().num_used_blocks(), 0);
    assert!(s.is_idle());
}

#[test]
fn a_sequence_that_cannot_fit_an_empty_pool_is_aborted() {
    let mut s = sched(2, 2, 4, 16);
    s.add(0, vec![1, 2, 3, 4, 5], SamplingParams::greedy());
    s.schedule().unwrap();
    assert_eq!(s.aborted(), &[0]);
    assert_eq!(s.batch().num_seqs(), 0);
}
