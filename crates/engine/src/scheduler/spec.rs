//! The scheduler's speculative decoding (contract point 7 of the module
//! doc above): drafting for the decode rows when planning (every drafting
//! sequence's proposal in one drafter call, so a draft model runs them as
//! one batch), cutting a constrained sequence's draft where its grammar
//! refuses a token, verifying the drafts when its step lands.
//!
//! Costs: one proposal call per step for all drafting sequences (the
//! drafter's cost, `crate::speculate`), O(drafts) bookkeeping to land it;
//! a constrained sequence adds a copy of its grammar state and one mask
//! per kept draft when planning, and one mask per step when landing (the
//! accepted drafts' masks are the ones computed when planning).

use std::collections::HashMap;
use std::sync::Arc;

use contract::SampledToken;
use paged_kv::{KvManager, SeqId};

use super::{SchedError, Scheduler, Seq};
use crate::speculate::{Drafter, Proposal, SpecConfig};

/// The scheduler's speculative decoding state.
pub(crate) struct Speculation {
    pub(super) cfg: SpecConfig,
    /// Sequences with a penalty history draft too (the backend applies
    /// it per verify row, `Backend::verifies_penalties`).
    pub(super) penalties: bool,
    /// Sequences with a grammar draft too (the backend applies a mask per
    /// verify row, `Backend::verifies_masks`).
    pub(super) masks: bool,
    /// An empty proposal backs off ([`VerifyCaps::overlap`]).
    pub(super) overlap: bool,
    pub(super) drafter: Box<dyn Drafter>,
    /// This plan's proposals by sequence ([`Scheduler::propose_drafts`]),
    /// taken by [`Scheduler::draft`].
    pub(super) proposals: HashMap<u64, Vec<u32>>,
    pub(super) stats: SpecStats,
}

/// Which backend capabilities let a sequence draft
/// ([`Scheduler::set_speculation`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VerifyCaps {
    /// `Backend::verifies_penalties`.
    pub penalties: bool,
    /// `Backend::verifies_masks`.
    pub masks: bool,
    /// `Backend::steps_overlap`: a sequence whose drafter proposed nothing
    /// backs off ([`missed`]) only where it does.
    pub overlap: bool,
}

/// Speculative decoding counters (totals since start).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SpecStats {
    /// Tokens drafted and verified.
    pub drafted: u64,
    /// Drafted tokens accepted.
    pub accepted: u64,
    /// Sequence steps that verified drafts.
    pub verifies: u64,
}

impl Scheduler {
    /// Turns speculative decoding on with `cfg` (checked by the caller)
    /// and its `drafter`, for sequences added from now on; `caps`: whether
    /// sequences with a penalty history, and with a grammar, draft too.
    pub(crate) fn set_speculation(
        &mut self,
        cfg: SpecConfig,
        drafter: Box<dyn Drafter>,
        caps: VerifyCaps,
    ) {
        self.spec = Some(Speculation {
            drafter,
            penalties: caps.penalties,
            masks: caps.masks,
            overlap: caps.overlap,
            cfg,
            proposals: HashMap::new(),
            stats: SpecStats::default(),
        });
    }

    /// Speculative decoding counters (`None`: off).
    pub(crate) fn spec_stats(&self) -> Option<SpecStats> {
        self.spec.as_ref().map(|s| s.stats)
    }

    /// Whether `q` may draft in the next step: it drafts at all, is not
    /// backing off after misses, and the running batch is small enough for
    /// speculation.
    pub(super) fn speculating(&self, q: &Seq) -> bool {
        q.spec_k > 0
            && q.spec_wait == 0
            && self
                .spec
                .as_ref()
                .is_some_and(|s| self.running.len() <= s.cfg.max_batch)
    }

    /// Most tokens sequence `id` may draft this step within `budget`: 0
    /// unless it decodes with its last token known and may speculate;
    /// never past `max_tokens`.
    fn draft_room(&self, id: u64, budget: usize) -> usize {
        let Some(q) = self.seqs.get(&id) else {
            return 0;
        };
        if !self.speculating(q) || q.carried_from.is_some() || q.next.is_some() {
            return 0;
        }
        let Some(len) = self.kv.seq_len(id as SeqId) else {
            return 0;
        };
        // this step samples generated token `generated`; 1 + accepted follow
        let generated = len - q.prompt_len;
        let room = q
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(generated + 1));
        q.spec_k.min(room).min(budget)
    }

    /// Proposes the drafts of every running sequence that decodes in the
    /// coming plan and may draft, in one drafter call, each at most what
    /// [`Scheduler::schedule`]'s decode pass will leave it of `budget`
    /// (one token per decode first, then its drafts, in running order).
    pub(super) fn propose_drafts(&mut self, mut budget: usize) -> Result<(), SchedError> {
        let Some(spec) = self.spec.as_mut() else {
            return Ok(());
        };
        spec.proposals.clear();
        let mut asks: Vec<(u64, usize)> = Vec::new();
        for &id in &self.running {
            let Some(q) = self.seqs.get(&id) else {
                continue;
            };
            let sid = id as SeqId;
            let (len, computed) = match (self.kv.seq_len(sid), self.kv.num_computed(sid)) {
                (Some(l), Some(c)) => (l, c),
                _ => return Err(SchedError::UnknownSeq(id)),
            };
            if q.last_in_flight || len - computed != 1 || budget == 0 {
                continue;
            }
            budget -= 1;
            let k = self.draft_room(id, budget);
            if k > 0 {
                budget -= k;
                asks.push((id, k));
            }
        }
        if asks.is_empty() {
            return Ok(());
        }
        let mut reqs: Vec<Proposal<'_>> = Vec::with_capacity(asks.len());
        for &(id, max) in &asks {
            let tokens = tokens_now(&self.kv, id as SeqId)?;
            reqs.push(Proposal {
                seq: id,
                tokens,
                max,
            });
        }
        let mut out = vec![Vec::new(); reqs.len()];
        let Some(spec) = self.spec.as_mut() else {
            return Ok(());
        };
        spec.drafter.propose_all(&reqs, &mut out);
        spec.proposals
            .extend(asks.iter().map(|&(id, _)| id).zip(out));
        Ok(())
    }

    /// Drafts for decoding sequence `id` (its tokens all known) at most
    /// `budget` tokens from its proposal ([`Scheduler::propose_drafts`]),
    /// cut where its grammar would refuse a token: appends them to its KV
    /// tokens and returns how many.
    pub(super) fn draft(&mut self, id: u64, budget: usize) -> Result<usize, SchedError> {
        let k = self.draft_room(id, budget);
        let (Some(spec), Some(seq), true) = (self.spec.as_mut(), self.seqs.get_mut(&id), k > 0)
        else {
            return Ok(0);
        };
        let Some(mut draft) = spec.proposals.remove(&id) else {
            return Ok(0); // not asked (the budget ran out first)
        };
        draft.truncate(k);
        seq.draft_masks = match seq.grammar.as_deref() {
            Some(g) => g.filter_draft(&mut draft),
            None => Vec::new(),
        };
        let n = draft.len();
        let sid = id as SeqId;
        if n == 0 {
            if spec.overlap {
                missed(seq);
            }
            return Ok(0);
        }
        if !self.kv.can_append(sid, n) {
            seq.draft_masks.clear();
            return Ok(0);
        }
        self.kv.append(sid, &draft)?;
        seq.drafted = n;
        Ok(n)
    }

    /// Lands the sample `t` of sequence `id`, which verified `drafted`
    /// drafts: accepts them while each equals the sample before it, rolls
    /// the rejected ones back, marks the accepted ones computed, makes the
    /// first differing sample (or the one after the last draft) its next
    /// token, and pushes the accepted samples and that one to `out`.
    pub(super) fn land_verified(
        &mut self,
        id: u64,
        drafted: usize,
        mut t: SampledToken,
        out: &mut Vec<(u64, SampledToken)>,
    ) -> Result<(), SchedError> {
        let sid = id as SeqId;
        if t.draft_rows.len() != drafted {
            return Err(SchedError::ResultMismatch {
                seq: id,
                what: "draft-row samples not one per draft",
            });
        }
        let len = self.kv.seq_len(sid).ok_or(SchedError::UnknownSeq(id))?;
        let base = len - drafted; // verified tokens
        let tokens = self.kv.seq_tokens(sid).ok_or(SchedError::UnknownSeq(id))?;
        let rows = std::mem::take(&mut t.draft_rows);
        let samples = std::iter::once(t).chain(rows);
        let drafts = &tokens[base..];
        let mut accepted = 0;
        let mut next = None;
        for (j, s) in samples.enumerate() {
            let hit = drafts.get(j) == Some(&s.token);
            if next.is_none() {
                if !hit {
                    next = Some(s.token);
                } else {
                    accepted += 1;
                }
                out.push((id, s));
            }
        }
        let next = next.ok_or(SchedError::ResultMismatch {
            seq: id,
            what: "no sample after the drafts",
        })?;
        self.kv.truncate(sid, base + accepted)?;
        self.kv.mark_computed(sid, base + accepted)?;
        let kmax = self.spec.as_ref().map_or(0, |s| s.cfg.num_tokens);
        if let Some(spec) = self.spec.as_mut() {
            spec.stats.drafted += drafted as u64;
            spec.stats.accepted += accepted as u64;
            spec.stats.verifies += 1;
        }
        let seq = self.seqs.get_mut(&id).ok_or(SchedError::UnknownSeq(id))?;
        let kept = tokens_now(&self.kv, sid)?;
        if let Some(h) = seq.history.as_mut() {
            // unique now that the batch is released: updated in place
            let h = Arc::make_mut(h);
            for &t in &kept[base..] {
                h.push_generated(t);
            }
            h.push_generated(next);
        }
        let masks = std::mem::take(&mut seq.draft_masks);
        if let Some(g) = seq.grammar.as_deref_mut() {
            // the accepted drafts' masks were computed when drafting
            let advanced = kept[base..]
                .iter()
                .zip(masks)
                .try_for_each(|(&t, m)| g.advance_known(t, m))
                .and_then(|()| g.advance(next));
            if let Err(why) = advanced {
                self.grammar_failures.push((id, why));
            }
        }
        seq.next = Some(next);
        match accepted {
            0 => missed(seq),
            _ => seq.spec_miss = 0,
        }
        seq.spec_k = match accepted == drafted {
            true => (seq.spec_k + 1).min(kmax),
            false => (accepted + 1).min(kmax),
        };
        Ok(())
    }
}

/// Most steps a sequence waits between draft attempts after misses.
const MAX_SPEC_WAIT: u8 = 15;

/// A draft attempt of `seq` had nothing accepted, or proposed nothing on
/// a backend whose steps overlap: it waits 1, 3, 7, then 15 steps before
/// the next attempt. Drafting needs its last token on the host, so there
/// an attempt costs the pipelining of a step: a sequence with nothing to
/// copy (no proposals, or wrong ones) keeps its steps pipelined, one
/// attempt in 16 steps at worst. Where a step computes at launch (the CPU)
/// an empty proposal costs nothing and is retried at the next step.
fn missed(seq: &mut Seq) {
    seq.spec_miss = seq.spec_miss.saturating_add(1);
    seq.spec_wait = ((1u16 << seq.spec_miss.min(4)) - 1).min(MAX_SPEC_WAIT as u16) as u8;
}

/// One step of `seq` landed without drafts: a step less to wait.
pub(super) fn waited(seq: &mut Seq) {
    seq.spec_wait = seq.spec_wait.saturating_sub(1);
}

/// The tokens `kv` holds for `sid`.
fn tokens_now(kv: &KvManager, sid: SeqId) -> Result<&[u32], SchedError> {
    kv.seq_tokens(sid).ok_or(SchedError::UnknownSeq(sid))
}
