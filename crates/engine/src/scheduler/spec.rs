//! The scheduler's speculative decoding (contract point 7 of the module
//! doc above): drafting for a decode row when planning, verifying the
//! drafts when its step lands.
//!
//! Costs: a proposal per drafting sequence per step (the drafter's cost,
//! `crate::speculate`), O(drafts) bookkeeping to land it.

use contract::SampledToken;
use paged_kv::SeqId;

use super::{SchedError, Scheduler, Seq};
use crate::speculate::{Drafter, SpecConfig};

/// The scheduler's speculative decoding state.
pub(crate) struct Speculation {
    pub(super) cfg: SpecConfig,
    pub(super) drafter: Box<dyn Drafter>,
    /// The draft being proposed, and a landed one's tokens (reused).
    pub(super) draft: Vec<u32>,
    pub(super) stats: SpecStats,
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
    /// Turns speculative decoding on with `cfg` (checked by the caller),
    /// for sequences added from now on.
    pub(crate) fn set_speculation(&mut self, cfg: SpecConfig) {
        self.spec = Some(Speculation {
            drafter: cfg.drafter(),
            cfg,
            draft: Vec::new(),
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

    /// Drafts for decoding sequence `id` (its tokens all known) at most
    /// `budget` tokens: appends them to its KV tokens and returns how many.
    pub(super) fn draft(&mut self, id: u64, budget: usize) -> Result<usize, SchedError> {
        let eligible = match self.seqs.get(&id) {
            Some(q) => self.speculating(q) && q.carried_from.is_none() && q.next.is_none(),
            None => false,
        };
        let (Some(spec), Some(seq), true) = (self.spec.as_mut(), self.seqs.get_mut(&id), eligible)
        else {
            return Ok(0);
        };
        let sid = id as SeqId;
        let tokens = self.kv.seq_tokens(sid).ok_or(SchedError::UnknownSeq(id))?;
        // this step samples generated token `generated`; 1 + accepted follow
        let generated = tokens.len() - seq.prompt_len;
        let room = seq
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(generated + 1));
        let k = seq.spec_k.min(room).min(budget);
        if k == 0 {
            return Ok(0);
        }
        spec.draft.clear();
        spec.drafter.propose(id, tokens, k, &mut spec.draft);
        spec.draft.truncate(k);
        let n = spec.draft.len();
        if n == 0 {
            missed(seq);
            return Ok(0);
        }
        if !self.kv.can_append(sid, n) {
            return Ok(0);
        }
        self.kv.append(sid, &spec.draft)?;
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

/// A draft attempt of `seq` proposed nothing or had nothing accepted: it
/// waits 1, 3, 7, then 15 steps before the next attempt. Drafting needs
/// its last token on the host, so an attempt costs the pipelining of a
/// step: a sequence with nothing to copy (no proposals, or wrong ones)
/// keeps its steps pipelined, one attempt in 16 steps at worst.
fn missed(seq: &mut Seq) {
    seq.spec_miss = seq.spec_miss.saturating_add(1);
    seq.spec_wait = ((1u16 << seq.spec_miss.min(4)) - 1).min(MAX_SPEC_WAIT as u16) as u8;
}

/// One step of `seq` landed without drafts: a step less to wait.
pub(super) fn waited(seq: &mut Seq) {
    seq.spec_wait = seq.spec_wait.saturating_sub(1);
}
