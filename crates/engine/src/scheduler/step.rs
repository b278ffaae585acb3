//! The scheduler's two per-step halves around the backend: building the
//! planned batch through the reused [`contract::StepBuilder`] (tokens and
//! block tables read from `paged-kv`, the owner), and committing the
//! backend's results (KV marked computed, sampled tokens recorded, penalty
//! histories updated in place, grammar states advanced). Costs are the scheduler's (module doc above).

use std::sync::Arc;

use contract::{SampleRequest, SampledToken};
use paged_kv::SeqId;

use super::{SchedError, Scheduler};
use crate::grammar::{SeqGrammar, advance_all};

impl Scheduler {
    /// Fills the reused batch from the plan.
    pub(super) fn build_batch(&mut self) -> Result<(), SchedError> {
        self.builder.begin();
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
            let sample = (p.end == tokens.len()).then(|| SampleRequest {
                params: seq.params.clone(),
                step: (tokens.len() - seq.prompt_len) as u64,
                history: seq.history.clone(),
                allowed: seq.grammar.as_ref().map(|g| g.mask()),
            });
            self.builder
                .push(&tokens[p.start..p.end], p.start, table, sample)?;
        }
        self.builder.finish();
        Ok(())
    }

    /// Advances the grammars of the constrained sequences that sampled
    /// `(id, token)` this step and computes their next masks, spread over
    /// threads when there are many ([`crate::grammar::advance_all`]).
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

    /// Takes the constrained sequences whose grammar failed at the last
    /// commit (the caller ends them).
    pub(crate) fn take_grammar_failures(&mut self) -> Vec<(u64, String)> {
        std::mem::take(&mut self.grammar_failures)
    }

    /// Records a finished step: KV written, sampled tokens kept for the next
    /// schedule. The sampled `(id, token)` pairs are pushed to `out` in batch
    /// order. Releases the batch first, so no history is shared while updated.
    pub(crate) fn commit(
        &mut self,
        results: Vec<Option<SampledToken>>,
        out: &mut Vec<(u64, SampledToken)>,
    ) -> Result<(), SchedError> {
        self.builder.begin();
        let mut advanced: Vec<(u64, u32)> = Vec::new();
        if results.len() != self.plan.len() {
            return Err(SchedError::ResultCount {
                got: results.len(),
                want: self.plan.len(),
            });
        }
        for (p, r) in self.plan.iter().zip(results) {
            let sid = p.id as SeqId;
            let len = self.kv.seq_len(sid).ok_or(SchedError::UnknownSeq(p.id))?;
            let seq = self
                .seqs
                .get_mut(&p.id)
                .ok_or(SchedError::UnknownSeq(p.id))?;
            self.kv.mark_computed(sid, p.end)?;
            match (p.end == len, r) {
                (true, Some(t)) => {
                    seq.next = Some(t.token);
                    if let Some(h) = seq.history.as_mut() {
                        // unique now that the batch is released: updated in place
                        Arc::make_mut(h).push_generated(t.token);
                    }
                    if seq.grammar.is_some() {
                        advanced.push((p.id, t.token));
                    }
                    out.push((p.id, t));
                }
                (false, None) => {}
                (true, None) => {
                    return Err(SchedError::ResultMismatch {
                        seq: p.id,
                        what: "no token where one was requested",
                    });
                }
                (false, Some(_)) => {
                    return Err(SchedError::ResultMismatch {
                        seq: p.id,
                        what: "a token where none was requested",
                    });
                }
            }
        }
        if !advanced.is_empty() {
            self.advance_grammars(&mut advanced);
        }
        Ok(())
    }
}
