//! The scheduler's per-step parts around the backend: building the planned
//! batch through the reused [`contract::StepBuilder`] (tokens and block
//! tables read from `paged-kv`, the owner; placeholders of a launched step's
//! samples marked carried), recording a launched step (KV marked computed,
//! placeholders for its samples) and landing its results (placeholders
//! replaced by the sampled tokens, penalty histories updated in place,
//! grammar states advanced and their next masks computed).
//! Costs are the scheduler's (module doc above).

use std::sync::Arc;

use contract::{SampleRequest, SampledToken};
use paged_kv::SeqId;

use super::{PENDING_TOKEN, SchedError, Scheduler};
use crate::grammar::{SeqGrammar, advance_all};

impl Scheduler {
    /// Fills the reused batch from the plan.
    pub(super) fn build_batch(&mut self) -> Result<(), SchedError> {
        self.builder.begin();
        self.held = false;
        for p in &self.plan {
            let sid = p.id as SeqId;
            let seq = self.seqs.get(&p.id).ok_or(SchedError::UnknownSeq(p.id))?;
            let tokens = self
                .kv
                .seq_tokens(sid)
                .ok_or(SchedError::UnknownSeq(p.id))?;
            let table = self
                .kv
                .block_table(sid)
                .ok_or(SchedError::UnknownSeq(p.id))?;
            // drafted tokens end the segment; the sample after the last
            // verified token is generated token `verified - prompt_len`
            let verified = tokens.len() - seq.drafted;
            let sample = (p.end == tokens.len()).then(|| SampleRequest {
                params: seq.params.clone(),
                step: (verified - seq.prompt_len) as u64,
                history: seq.history.clone(),
                allowed: seq.grammar.as_ref().map(|g| g.mask()),
            });
            self.builder
                .push(&tokens[p.start..p.end], p.start, table, sample)?;
            self.builder.set_prompt_len(seq.prompt_len);
            if seq.slot > 0 {
                self.builder.set_lora(seq.slot);
            }
            if seq.drafted > 0 {
                self.builder.set_drafts(seq.drafted);
                if !seq.draft_masks.is_empty() {
                    self.builder.set_draft_masks(seq.draft_masks.clone());
                }
            }
            if let (Some(row), true) = (seq.carried_from, p.end == tokens.len()) {
                // the placeholder is the last token, and this step runs it;
                // a grammar's mask for it waits for that token (held step)
                self.builder.carry_last(row);
                self.held |= seq.grammar.is_some();
            }
        }
        self.builder.finish();
        Ok(())
    }

    /// Records the planned step as launched (contract point 6): its KV is
    /// computed, and each sampled sequence's next token is a placeholder
    /// carried into the next step. Call after the previous launch landed.
    /// Releases the batch first, so no history is shared while updated.
    pub(crate) fn launched(&mut self) -> Result<(), SchedError> {
        self.landing.clear();
        self.landing_rows = self.plan.len();
        for (row, p) in self.plan.iter().enumerate() {
            if self.builder.batch().samples[row].is_some() {
                self.landing.push((p.id, row as u32));
            }
        }
        self.builder.begin();
        self.held = false;
        for (row, p) in self.plan.iter().enumerate() {
            let sid = p.id as SeqId;
            let Some(seq) = self.seqs.get_mut(&p.id) else {
                continue; // ended since it was planned: its sample is dropped
            };
            let len = self.kv.seq_len(sid).ok_or(SchedError::UnknownSeq(p.id))?;
            // drafts stay uncomputed until verified (their blocks unhashed)
            self.kv.mark_computed(sid, p.end - seq.drafted)?;
            if p.end == len {
                seq.next = Some(PENDING_TOKEN);
                seq.carried_from = Some(row as u32);
                let generated = len - seq.drafted + 1 - seq.prompt_len;
                seq.last_in_flight = seq.max_tokens.is_some_and(|m| generated >= m);
            }
        }
        Ok(())
    }

    /// True when a sequence of the launched step needs its sample on the
    /// host before its next step can be planned: its penalty history, which
    /// the next batch shares (a grammar's mask does not: that step is held,
    /// [`Scheduler::batch_held`]), or speculative decoding (its next step's
    /// tokens depend on the drafts accepted, and its drafts on its tokens).
    pub(crate) fn landing_needs_host(&self) -> bool {
        self.landing.iter().any(|(id, _)| {
            self.seqs.get(id).is_some_and(|q| {
                q.carried_from.is_some()
                    && (q.history.is_some() || q.drafted > 0 || self.speculating(q))
            })
        })
    }

    /// Lands the launched step's results (`[S]` of that step): each sample
    /// replaces its sequence's placeholder wherever it is now, updates its
    /// history, and is pushed to `out` with its id, in batch order. Results
    /// of sequences ended since are dropped.
    pub(crate) fn land(
        &mut self,
        mut results: Vec<Option<SampledToken>>,
        out: &mut Vec<(u64, SampledToken)>,
    ) -> Result<(), SchedError> {
        if results.len() != self.landing_rows {
            return Err(SchedError::ResultCount {
                got: results.len(),
                want: self.landing_rows,
            });
        }
        let mut want = self.landing.iter().peekable();
        for (row, r) in results.iter().enumerate() {
            let asked = want.peek().is_some_and(|(_, w)| *w as usize == row);
            let id = if asked {
                want.next().map_or(0, |(id, _)| *id)
            } else {
                0
            };
            match (asked, r.is_some()) {
                (true, false) => {
                    return Err(SchedError::ResultMismatch {
                        seq: id,
                        what: "no token where one was requested",
                    });
                }
                (false, true) => {
                    return Err(SchedError::ResultMismatch {
                        seq: id,
                        what: "a token where none was requested",
                    });
                }
                _ => {}
            }
        }
        let mut advanced: Vec<(u64, u32)> = Vec::new();
        // taken while landing (a verified draft needs the whole scheduler)
        let landing = std::mem::take(&mut self.landing);
        for &(id, row) in &landing {
            let Some(t) = results[row as usize].take() else {
                continue;
            };
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue; // ended meanwhile: the token is dropped unseen
            };
            if seq.carried_from != Some(row) {
                continue;
            }
            seq.carried_from = None;
            seq.last_in_flight = false;
            let drafted = std::mem::take(&mut seq.drafted);
            if drafted > 0 {
                self.land_verified(id, drafted, t, out)?;
                continue;
            }
            super::spec::waited(seq);
            let sid = id as SeqId;
            if let Some(next) = seq.next.as_mut() {
                *next = t.token;
            } else if let Some(len) = self.kv.seq_len(sid) {
                self.kv.set_token(sid, len - 1, t.token)?;
            } else if let Some(last) = seq.parked.last_mut() {
                *last = t.token;
            }
            if let Some(h) = seq.history.as_mut() {
                // unique now that the batch is released: updated in place
                Arc::make_mut(h).push_generated(t.token);
            }
            if seq.grammar.is_some() {
                advanced.push((id, t.token));
            }
            out.push((id, t));
        }
        self.landing = landing;
        self.landing.clear();
        self.landing_rows = 0;
        if !advanced.is_empty() {
            self.advance_grammars(&mut advanced);
        }
        Ok(())
    }

    /// Advances the grammars of the constrained sequences that sampled
    /// `(id, token)` in the landed step and computes their next masks,
    /// spread over threads when there are many ([`advance_all`]).
    fn advance_grammars(&mut self, advanced: &mut [(u64, u32)]) {
        advanced.sort_unstable();
        let mut work: Vec<(u64, u32, &mut SeqGrammar)> = self
            .seqs
            .iter_mut()
            .filter_map(|(id, seq)| {
                let at = advanced.binary_search_by_key(id, |&(i, _)| i).ok()?;
                Some((*id, advanced[at].1, seq.grammar.as_deref_mut()?))
            })
            .collect();
        advance_all(&mut work, &mut self.grammar_failures);
    }

    /// True when the planned step must be launched held
    /// (`Backend::launch_held`): a constrained sequence samples in it whose
    /// last token is the sample of the launched step, so its mask is known
    /// only once that step lands.
    pub(crate) fn batch_held(&self) -> bool {
        self.held
    }

    /// Makes the planned (held) step's sample requests final, once the step
    /// before it has landed: each constrained sequence's mask as its grammar
    /// now stands (for `Backend::release`, from [`Scheduler::batch`]). A
    /// sequence ended since keeps the mask it was planned with (its sample
    /// is dropped unseen).
    pub(crate) fn finalize_samples(&mut self) {
        let samples = self.builder.samples_mut();
        for (p, sample) in self.plan.iter().zip(samples.iter_mut()) {
            let (Some(req), Some(seq)) = (sample.as_mut(), self.seqs.get(&p.id)) else {
                continue;
            };
            if let Some(g) = &seq.grammar {
                req.allowed = Some(g.mask());
            }
        }
    }

    /// Takes the constrained sequences whose grammar failed at the last
    /// landing (the caller ends them).
    pub(crate) fn take_grammar_failures(&mut self) -> Vec<(u64, String)> {
        std::mem::take(&mut self.grammar_failures)
    }

    /// Forgets the planned step (it failed or will never run); its
    /// sequences are being ended.
    pub(crate) fn abandon_plan(&mut self) {
        self.builder.begin();
        self.held = false;
        self.plan.clear();
    }

    /// Forgets the launched step (its results are lost); its sequences are
    /// being ended.
    pub(crate) fn abandon_landing(&mut self) {
        self.landing.clear();
        self.landing_rows = 0;
    }
}
