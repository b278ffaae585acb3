//! [`HostPipeline`]: pipelined stepping ([`Backend::launch`] /
//! [`Backend::collect`]) for a backend that computes a step on the calling
//! thread (the CPU backend, test fakes).
//!
//! Contract: `launch` runs the step at once, after [`HostPipeline::resolve`]
//! has written the previous launch's samples into the carried tokens; the
//! results wait in a queue of at most [`MAX_IN_FLIGHT`] steps until `collect`
//! takes them, oldest first. A carried token naming a row of the previous
//! step that sampled nothing (or with no step launched before) is an
//! [`BackendError::InvalidBatch`] naming it. [`HostPipeline::step`] is the
//! plain [`Backend::step`]: only with nothing in flight and nothing carried.
//!
//! Costs: a batch with carried tokens is copied once (O(T + S x max_blocks));
//! the previous step's token ids are kept (O(S)).
//!
//! [`Backend::launch`]: crate::Backend::launch
//! [`Backend::collect`]: crate::Backend::collect
//! [`Backend::step`]: crate::Backend::step

use std::borrow::Cow;
use std::collections::VecDeque;

use crate::backend::{BackendError, MAX_IN_FLIGHT, SampledToken, StepBatch};

/// Results of launched steps and the token ids of the last one.
#[derive(Debug, Default)]
pub struct HostPipeline {
    queue: VecDeque<Result<Vec<Option<SampledToken>>, BackendError>>,
    /// `[S]` of the last launched step: its sampled token ids.
    last: Vec<Option<u32>>,
}

type Results = Result<Vec<Option<SampledToken>>, BackendError>;

impl HostPipeline {
    /// `batch` with its carried tokens replaced by the last launch's samples.
    pub fn resolve<'a>(&self, batch: &'a StepBatch) -> Result<Cow<'a, StepBatch>, BackendError> {
        if batch.carried.is_empty() {
            return Ok(Cow::Borrowed(batch));
        }
        let mut b = batch.clone();
        b.carried.clear();
        for (i, c) in batch.carried.iter().enumerate() {
            let Some(&Some(tok)) = self.last.get(c.from as usize) else {
                return Err(c.unsampled(i, self.last.len()));
            };
            match b.tokens.get_mut(c.token as usize) {
                Some(t) => *t = tok,
                None => {
                    return Err(BackendError::InvalidBatch(format!(
                        "carried[{i}] names token {} of a step of {} tokens",
                        c.token,
                        batch.tokens.len()
                    )));
                }
            }
        }
        Ok(Cow::Owned(b))
    }

    /// [`crate::Backend::launch`] through `run`, which computes a resolved
    /// batch's samples.
    pub fn launch(
        &mut self,
        batch: &StepBatch,
        run: impl FnOnce(&StepBatch) -> Results,
    ) -> Result<(), BackendError> {
        if self.queue.len() >= MAX_IN_FLIGHT {
            return Err(BackendError::InvalidBatch(format!(
                "{MAX_IN_FLIGHT} steps are in flight already; collect one first"
            )));
        }
        let resolved = self.resolve(batch)?;
        let results = run(&resolved)?;
        self.last.clear();
        self.last
            .extend(results.iter().map(|r| r.as_ref().map(|t| t.token)));
        self.queue.push_back(Ok(results));
        Ok(())
    }

    /// [`crate::Backend::collect`]: the oldest launched step's samples.
    pub fn collect(&mut self) -> Results {
        self.queue.pop_front().unwrap_or_else(|| {
            Err(BackendError::InvalidBatch(
                "no launched step to collect".into(),
            ))
        })
    }

    /// [`crate::Backend::step`]: `run` on `batch` with nothing in flight.
    pub fn step(&mut self, batch: &StepBatch, run: impl FnOnce(&StepBatch) -> Results) -> Results {
        if !self.queue.is_empty() {
            return Err(BackendError::InvalidBatch(format!(
                "{} launched steps are not collected; a plain step cannot run before them",
                self.queue.len()
            )));
        }
        self.launch(batch, run)?;
        self.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Carried;
    use crate::testing::well_formed;
    use crate::{KvShape, SampleRequest, SamplingParams};

    fn tok(token: u32) -> Option<SampledToken> {
        Some(SampledToken {
            token,
            logprob: -1.0,
            top_logprobs: Vec::new(),
        })
    }

    /// A fake step: samples token `10 * (row + 1) + first token id` for each
    /// requested row.
    fn run(b: &StepBatch) -> Results {
        Ok((0..b.num_seqs())
            .map(|s| {
                let first = b.tokens[b.cu_seqlens[s] as usize];
                b.samples[s].as_ref().and(tok(10 * (s as u32 + 1) + first))
            })
            .collect())
    }

    fn batch(seqs: &[(usize, usize)], sampled: &[bool]) -> StepBatch {
        let kv = KvShape {
            num_blocks: 16,
            block_size: 4,
        };
        let mut b = well_formed(kv, seqs, |s, j| (s * 4 + j) as u32);
        for (s, &on) in sampled.iter().enumerate() {
            b.samples[s] = on.then(|| SampleRequest {
                params: SamplingParams::greedy(),
                step: 0,
                history: None,
                allowed: None,
            });
        }
        b
    }

    #[test]
    fn carried_tokens_take_the_previous_launch_samples_in_order() {
        let mut p = HostPipeline::default();
        let first = batch(&[(3, 3), (2, 2)], &[true, false]);
        p.launch(&first, run).unwrap();
        // the second step carries row 0's sample into its token 1
        let mut second = batch(&[(4, 1), (5, 1)], &[true, true]);
        second.tokens = vec![6, 0];
        second.carried = vec![Carried { token: 1, from: 0 }];
        let mut seen = None;
        p.launch(&second, |b| {
            seen = Some(b.tokens.clone());
            run(b)
        })
        .unwrap();
        let want_first = 10 + first.tokens[0];
        assert_eq!(seen, Some(vec![6, want_first]));
        assert_eq!(p.collect().unwrap(), vec![tok(want_first), None]);
        assert_eq!(p.collect().unwrap(), vec![tok(16), tok(20 + want_first)]);
        assert!(p.collect().is_err());
    }

    #[test]
    fn bad_carries_and_overfull_pipelines_are_errors() {
        let mut p = HostPipeline::default();
        let mut b = batch(&[(1, 1), (1, 1)], &[true, false]);
        b.carried = vec![Carried { token: 0, from: 0 }];
        let e = p.launch(&b, run).unwrap_err().to_string();
        assert!(e.contains("carried[0]") && e.contains("0 rows"), "{e}");
        let plain = batch(&[(1, 1), (1, 1)], &[true, false]);
        p.launch(&plain, run).unwrap();
        b.carried = vec![Carried { token: 1, from: 1 }]; // row 1 sampled nothing
        let e = p.launch(&b, run).unwrap_err().to_string();
        assert!(e.contains("row 1"), "{e}");
        p.launch(&plain, run).unwrap();
        assert!(p.launch(&plain, run).is_err(), "a third step in flight");
        assert!(p.step(&plain, run).is_err(), "a plain step behind launches");
        p.collect().unwrap();
        p.collect().unwrap();
        assert_eq!(p.step(&plain, run).unwrap(), vec![tok(10), None]);
    }
}
