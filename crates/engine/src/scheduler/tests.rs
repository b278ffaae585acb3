//! Scheduler unit tests on the fake backend: step composition, preemption
//! of the youngest, recompute on re-admission, aborts.

use super::*;
use crate::testing::{FakeBackend, fake_config};
use contract::{Backend, KvShape, SampledToken};

#[test]
fn the_penalty_history_is_shared_and_updated_in_place() {
    let mut s = sched(64, 4, 8, 64);
    let mut fake = FakeBackend::new(
        fake_config().unwrap(),
        KvShape {
            num_blocks: 64,
            block_size: 4,
        },
    );
    let params = SamplingParams {
        repetition_penalty: 1.3,
        ..SamplingParams::greedy()
    };
    s.add(0, NewSeq::plain(vec![5, 3, 5, 1], params));
    s.add(1, NewSeq::plain(vec![5, 3], SamplingParams::greedy()));
    let mut seen = vec![5, 3, 5, 1];
    for _ in 0..4 {
        s.schedule().unwrap();
        let h = s.batch().samples[0]
            .as_ref()
            .unwrap()
            .history
            .clone()
            .unwrap();
        assert!(s.batch().samples[1].as_ref().unwrap().history.is_none());
        let mut want = seen.clone();
        want.sort_unstable();
        want.dedup();
        assert_eq!(h.as_slice(), want.as_slice());
        let at = Arc::as_ptr(&h);
        drop(h);
        let res = fake.step(s.batch()).unwrap();
        let mut out = Vec::new();
        commit(&mut s, res, &mut out);
        seen.push(out[0].1.token);
        let kept = s.seqs[&0].history.as_ref().unwrap();
        assert_eq!(Arc::as_ptr(kept), at, "updated in place, not copied");
    }
}

/// Records a step at once: launched, then landed with `res`.
fn commit(s: &mut Scheduler, res: Vec<Option<SampledToken>>, out: &mut Vec<(u64, SampledToken)>) {
    s.launched().unwrap();
    s.land(res, out).unwrap();
}

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

/// Runs one step on the fake and commits it; returns the sampled ids and
/// the step's batch (the scheduler releases its own at launch).
fn step(s: &mut Scheduler, fake: &mut FakeBackend) -> (Vec<u64>, StepBatch) {
    s.schedule().unwrap();
    let batch = s.batch().clone();
    let res = fake.step(&batch).unwrap();
    let mut out = Vec::new();
    commit(s, res, &mut out);
    (out.into_iter().map(|(id, _)| id).collect(), batch)
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
    s.add(0, NewSeq::plain(vec![1, 2, 3], SamplingParams::greedy()));
    s.add(
        1,
        NewSeq::plain((0..25).collect(), SamplingParams::greedy()),
    );
    // step 1: seq 0 whole (3), seq 1 its first 7
    let (ids, b) = step(&mut s, &mut fake);
    assert_eq!((ids, segs(&b)), (vec![0], vec![3, 7]));
    // step 2: seq 0 decodes (1), seq 1 gets the remaining 9 of the budget
    let (ids, b) = step(&mut s, &mut fake);
    assert_eq!((ids, segs(&b)), (vec![0], vec![1, 9]));
    assert_eq!(b.positions[..2], [3, 7]);
    // step 3: the decode, then seq 1's last 9 tokens, sampled
    let (ids, b) = step(&mut s, &mut fake);
    assert_eq!((ids, segs(&b)), (vec![0, 1], vec![1, 9]));
    assert!(b.samples.iter().all(Option::is_some));
    assert_eq!(s.summary(0).unwrap().generated, 3);
    assert_eq!(s.batch().num_seqs(), 0, "released at launch");
}

#[test]
fn the_prefill_cap_cuts_chunks_only_beside_other_sequences() {
    let shape = KvShape {
        num_blocks: 64,
        block_size: 4,
    };
    let mut fake = FakeBackend::new(fake_config().unwrap(), shape);
    // alone: the cap does not apply, the token budget does
    let mut s = sched(64, 4, 8, 10);
    s.set_prefill_cap(4);
    s.add(
        0,
        NewSeq::plain((0..25).collect(), SamplingParams::greedy()),
    );
    let (_, b) = step(&mut s, &mut fake);
    assert_eq!(segs(&b), vec![10]);
    // beside a decoding sequence: decodes whole, prefill cut to the cap
    let mut s = sched(64, 4, 8, 10);
    s.add(0, NewSeq::plain(vec![1, 2, 3], SamplingParams::greedy()));
    step(&mut s, &mut fake);
    s.set_prefill_cap(4);
    s.add(
        1,
        NewSeq::plain((0..25).collect(), SamplingParams::greedy()),
    );
    let (_, b) = step(&mut s, &mut fake);
    assert_eq!(segs(&b), vec![1, 4]);
    let (_, b) = step(&mut s, &mut fake);
    assert_eq!(segs(&b), vec![1, 4]);
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
    s.add(0, NewSeq::plain(vec![1, 2, 3], SamplingParams::greedy()));
    s.add(1, NewSeq::plain(vec![4, 5, 6], SamplingParams::greedy()));
    assert_eq!(step(&mut s, &mut fake).0, vec![0, 1]); // 4 tokens each, 4 blocks
    assert_eq!(step(&mut s, &mut fake).0, vec![0, 1]); // 5 tokens each need 6 blocks
    s.schedule().unwrap();
    assert_eq!(s.preemptions_total, 1);
    assert_eq!(s.counts().0, 1);
    assert_eq!(s.waiting.front(), Some(&1));
    // parked with its sampled token, nothing held by paged-kv
    assert_eq!(s.kv().seq_len(1), None);
    assert_eq!(s.seqs[&1].parked.len(), 5);
    assert_eq!(s.seqs[&1].next, None);
    assert_eq!(s.summary(1).unwrap().generated, 2);
    assert_eq!(s.planned_ids().collect::<Vec<_>>(), vec![0]);
    s.finish(0).unwrap();
    // re-admitted: all 5 known tokens recomputed, its 3rd token sampled
    s.schedule().unwrap();
    assert_eq!(segs(s.batch()), vec![5]);
    assert_eq!(s.batch().samples[0].as_ref().unwrap().step, 2);
    assert!(s.first_admitted().is_empty());
    let res = fake.step(s.batch()).unwrap();
    commit(&mut s, res, &mut Vec::new());
    s.finish(1).unwrap();
    assert_eq!(s.kv().num_used_blocks(), 0);
    assert!(s.is_idle());
}

#[test]
fn a_sequence_that_cannot_fit_an_empty_pool_is_aborted() {
    let mut s = sched(2, 2, 4, 16);
    s.add(
        0,
        NewSeq::plain(vec![1, 2, 3, 4, 5], SamplingParams::greedy()),
    );
    s.schedule().unwrap();
    assert_eq!(s.aborted(), &[0]);
    assert_eq!(s.batch().num_seqs(), 0);
}

/// `n > 1`: later choices wait for the first one's prompt, then fork from
/// it: the shared full blocks are not recomputed (prefix cache off here).
#[test]
fn choices_fork_after_the_prompt_is_computed() {
    let mut s = sched(64, 4, 8, 4);
    let mut fake = FakeBackend::new(
        fake_config().unwrap(),
        KvShape {
            num_blocks: 64,
            block_size: 4,
        },
    );
    let prompt: Vec<u32> = (1..=10).collect();
    s.add(0, NewSeq::plain(prompt.clone(), SamplingParams::greedy()));
    s.add(
        1,
        NewSeq {
            fork_of: Some(0),
            ..NewSeq::plain(prompt.clone(), SamplingParams::greedy())
        },
    );
    s.add(
        2,
        NewSeq {
            fork_of: Some(0),
            ..NewSeq::plain(prompt.clone(), SamplingParams::greedy())
        },
    );
    // a budget of 4: the first choice prefills in chunks, the others wait
    let (_, b) = step(&mut s, &mut fake);
    assert_eq!(segs(&b), vec![4]);
    assert_eq!(s.counts().1, 2);
    let (_, b) = step(&mut s, &mut fake);
    assert_eq!(segs(&b), vec![4]);
    // 8 of 10 computed: both full blocks exist, the others fork and run
    // only the last two prompt tokens each (budget permitting)
    let (sampled, b) = step(&mut s, &mut fake);
    assert_eq!(segs(&b), vec![2, 2]);
    assert_eq!(sampled, vec![0, 1]);
    let t0 = s.kv().block_table(0).unwrap().to_vec();
    let t1 = s.kv().block_table(1).unwrap().to_vec();
    assert_eq!(&t0[..2], &t1[..2]);
    assert_ne!(t0[2], t1[2]);
    let (sampled, b) = step(&mut s, &mut fake);
    assert_eq!(segs(&b), vec![1, 1, 2]);
    assert_eq!(sampled, vec![0, 1, 2]);
    s.kv().check_invariants().unwrap();
    assert_eq!(s.summary(0).unwrap().generated, 2);
    assert_eq!(s.summary(1).unwrap().generated, 2);
    assert_eq!(s.summary(2).unwrap().generated, 1);
}

/// A request that arrives while a long prompt is prefilled under the step
/// time cap is admitted at the next step, sharing the cap, instead of
/// waiting for the whole prefill; with nothing waiting the long prompt
/// takes the whole cap again.
#[test]
fn a_newcomer_shares_the_capped_prefill_budget() {
    for cap in [16u32, 40, 64] {
        let mut s = sched(1024, 4, 8, 512);
        s.set_prefill_cap(cap as usize);
        let mut fake = FakeBackend::new(
            fake_config().unwrap(),
            KvShape {
                num_blocks: 1024,
                block_size: 4,
            },
        );
        let long: Vec<u32> = (0..2000).map(|i| i % 50).collect();
        s.add(0, NewSeq::plain(long, SamplingParams::greedy()));
        // alone, it runs whole chunks of the token budget
        let (_, first) = step(&mut s, &mut fake);
        assert_eq!(segs(&first), vec![512], "cap {cap}");
        // a newcomer arrives mid-prefill: the chunk leaves it half the cap
        s.add(1, NewSeq::plain(vec![7; 3], SamplingParams::greedy()));
        let (sampled, second) = step(&mut s, &mut fake);
        assert_eq!(segs(&second), vec![cap - cap / 2, 3], "cap {cap}");
        assert_eq!(sampled, vec![1], "cap {cap}: its first token at once");
        // nothing waits: the long prefill takes the whole cap beside the decode
        let (_, third) = step(&mut s, &mut fake);
        assert_eq!(segs(&third), vec![1, cap], "cap {cap}");
    }
}
