//! Speculative decoding of constrained sequences in the scheduler, on the
//! fake backend with a scripted drafter: a draft is cut at the first token
//! the grammar refuses (that token never runs as a verify row), each kept
//! draft's row carries the grammar's mask after the drafts before it, and
//! the tokens are plain decoding's; an empty proposal backs off only where
//! the backend's steps overlap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use contract::{Backend, KvShape, SampleRequest, SampledToken, TokenMask};

use super::*;
use crate::grammar::{Constraint, GrammarCompiler};
use crate::speculate::{Drafter, SpecConfig, SpecMethod};
use crate::testing::{FakeBackend, fake_config, fake_next_token, fake_tokenizer};

/// Proposes whatever the test put in its script.
struct Scripted(Arc<Mutex<Vec<u32>>>);

impl Drafter for Scripted {
    fn propose(&mut self, _seq: u64, _tokens: &[u32], max: usize, out: &mut Vec<u32>) {
        let script = self.0.lock().unwrap();
        out.extend(script.iter().take(max));
    }
}

/// Counts its calls and proposes nothing.
struct Empty(Arc<AtomicUsize>);

impl Drafter for Empty {
    fn propose(&mut self, _seq: u64, _tokens: &[u32], _max: usize, _out: &mut Vec<u32>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

fn scheduler(drafter: Option<Box<dyn Drafter>>) -> Scheduler {
    scheduler_with(drafter, true)
}

/// [`scheduler`] for a backend whose steps overlap or not.
fn scheduler_with(drafter: Option<Box<dyn Drafter>>, overlap: bool) -> Scheduler {
    let kv = KvConfig {
        num_blocks: 64,
        block_size: 4,
        enable_prefix_cache: false,
    };
    let mut s = Scheduler::new(kv, 8, 64).unwrap();
    if let Some(d) = drafter {
        let cfg = SpecConfig {
            method: SpecMethod::Ngram,
            num_tokens: 8,
            max_batch: 8,
        };
        let caps = VerifyCaps {
            penalties: true,
            masks: true,
            overlap,
        };
        s.set_speculation(cfg, d, caps);
    }
    s
}

/// The fake's greedy token after `context` under `mask`.
fn fake_pick(context: &[u32], mask: &Arc<TokenMask>, vocab: usize) -> u32 {
    let req = SampleRequest {
        params: SamplingParams::greedy(),
        step: 0,
        history: None,
        allowed: Some(mask.clone()),
    };
    fake_next_token(context, vocab, &req)
}

fn first_refused(m: &TokenMask, vocab: usize) -> u32 {
    (0..vocab as u32).find(|&t| !m.allows(t)).unwrap()
}

/// Runs `id`'s sequence for `steps` steps on `fake`; returns its tokens
/// in landing order and every step's batch.
fn run(
    s: &mut Scheduler,
    fake: &mut FakeBackend,
    steps: usize,
    mut before: impl FnMut(&Scheduler),
) -> (Vec<u32>, Vec<StepBatch>) {
    let (mut tokens, mut batches) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        before(s);
        s.schedule().unwrap();
        let batch = s.batch().clone();
        let res = fake.step(&batch).unwrap();
        let mut out: Vec<(u64, SampledToken)> = Vec::new();
        s.launched().unwrap();
        s.land(res, &mut out).unwrap();
        assert!(s.take_grammar_failures().is_empty());
        tokens.extend(out.iter().map(|(_, t)| t.token));
        batches.push(batch);
    }
    (tokens, batches)
}

#[test]
fn grammar_refused_drafts_never_run_and_rows_take_their_masks() {
    let config = fake_config().unwrap();
    let vocab = config.vocab_size;
    let tok = Arc::new(fake_tokenizer(&config).unwrap());
    let compiler = GrammarCompiler::new(tok, config.eos_token_ids.clone(), vocab);
    let grammar = || {
        compiler
            .compile(&Constraint::Regex("[a-e]{40}".into()))
            .unwrap()
    };
    let shape = KvShape {
        num_blocks: 64,
        block_size: 4,
    };
    let new = || NewSeq {
        grammar: Some(grammar()),
        ..NewSeq::plain(vec![5, 6, 7], SamplingParams::greedy())
    };
    let mut plain = scheduler(None);
    plain.add(0, new());
    let (want, _) = run(
        &mut plain,
        &mut FakeBackend::new(config.clone(), shape),
        36,
        |_| {},
    );

    let script = Arc::new(Mutex::new(Vec::new()));
    let mut s = scheduler(Some(Box::new(Scripted(script.clone()))));
    s.add(0, new());
    // each step drafts the two tokens the fake will sample (the grammar
    // allows them), then one the grammar refuses
    let mut expect: Vec<(u32, [Arc<TokenMask>; 2])> = Vec::new();
    let (got, batches) = run(&mut s, &mut FakeBackend::new(config, shape), 10, |s| {
        let Some(q) = s.seqs.get(&0) else {
            return;
        };
        let Some(g) = q.grammar.as_deref() else {
            return;
        };
        let mut ctx = s.kv.seq_tokens(0).map(<[u32]>::to_vec).unwrap_or_default();
        ctx.extend(q.next);
        let mut trial = g.fork();
        let a = fake_pick(&ctx, &trial.mask(), vocab);
        trial.advance(a).unwrap();
        let after_a = trial.mask();
        ctx.push(a);
        let b = fake_pick(&ctx, &after_a, vocab);
        trial.advance(b).unwrap();
        let after_b = trial.mask();
        let bad = first_refused(&after_b, vocab);
        *script.lock().unwrap() = vec![a, b, bad, a];
        expect.push((bad, [after_a, after_b]));
    });
    assert!(got.len() > 20 && got.len() <= want.len(), "{got:?}");
    assert_eq!(got, want[..got.len()], "plain decoding's tokens");
    let mut drafted_steps = 0;
    for (batch, (bad, masks)) in batches.iter().zip(&expect) {
        let k = batch.drafts_of(0);
        if k == 0 {
            continue; // a prefill step, or backing off after a miss
        }
        drafted_steps += 1;
        assert_eq!(k, 2, "the draft is cut at the refused token");
        let rows = batch.sampled_rows(0);
        assert!(!batch.tokens[rows.start + 1..].contains(bad));
        for (j, m) in masks.iter().enumerate() {
            let req = batch.row_request(0, rows.start + 1 + j).unwrap();
            assert_eq!(req.allowed.unwrap().words(), m.words(), "row of draft {j}");
        }
    }
    assert!(drafted_steps >= 3, "{drafted_steps} steps drafted");
}

#[test]
fn an_empty_proposal_backs_off_only_where_steps_overlap() {
    let config = fake_config().unwrap();
    let shape = KvShape {
        num_blocks: 64,
        block_size: 4,
    };
    let asks = |overlap: bool| {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut s = scheduler_with(Some(Box::new(Empty(calls.clone()))), overlap);
        s.add(0, NewSeq::plain(vec![5, 6, 7], SamplingParams::greedy()));
        let mut fake = FakeBackend::new(config.clone(), shape);
        let (tokens, _) = run(&mut s, &mut fake, 16, |_| {});
        (calls.load(Ordering::Relaxed), tokens)
    };
    let (eager, eager_tokens) = asks(false);
    let (backing, backing_tokens) = asks(true);
    assert_eq!(eager_tokens, backing_tokens, "the same tokens either way");
    // 15 decode steps after the prompt's: asked at each, or after waits of 1, 3 and 7
    assert!(eager >= 14, "asked {eager} times without overlap");
    assert!(backing <= 4, "asked {backing} times with overlap");
}
