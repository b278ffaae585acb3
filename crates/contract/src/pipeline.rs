//! [`HostPipeline`]: pipelined stepping ([`Backend::launch`] /
//! [`Backend::collect`]) for a backend that computes a step on the calling
//! thread (the CPU backend, test fakes). Such a backend implements
//! [`HostCompute`] (its facts and one synchronous step) and gets the whole
//! [`Backend`] protocol from the blanket implementation here.
//!
//! Contract: `launch` runs the step at once, after [`HostPipeline::resolve`]
//! has written the previous launch's samples into the carried tokens; the
//! results wait in a queue of at most [`MAX_IN_FLIGHT`](crate::backend::MAX_IN_FLIGHT) steps until `collect`
//! takes them, oldest first. A held step ([`HostPipeline::hold`]) is kept,
//! resolved, and runs at [`HostPipeline::release`] with its final sample
//! requests (a host backend has no device to overlap it with); it counts as
//! in flight, and nothing can be launched while it is held. A carried token naming a row of the previous
//! step that sampled nothing (or with no step launched before) is an
//! [`BackendError::InvalidBatch`] naming it.
//!
//! Costs: a batch with carried tokens is copied once (O(T + S x max_blocks));
//! the previous step's token ids are kept (O(S)).
//!
//! [`Backend::launch`]: crate::Backend::launch
//! [`Backend::collect`]: crate::Backend::collect
//! [`Backend`]: crate::Backend

use std::borrow::Cow;
use std::collections::VecDeque;

use crate::backend::{Backend, BackendError, KvShape, SampleRequest, SampledToken, StepBatch};
use crate::config::ModelConfig;

/// A backend that computes each step synchronously on the calling thread.
/// It implements only its facts and [`HostCompute::compute`]; the
/// [`Backend`] protocol (launch, held steps, collect, carried tokens) is
/// the blanket implementation below, through the [`HostPipeline`] it keeps.
/// The methods mirror [`Backend`]'s of the same names; implement it with
/// the trait's path (`impl contract::HostCompute for ..`) rather than
/// importing it, so calls like `backend.config()` stay unambiguous.
pub trait HostCompute: Send {
    /// [`Backend::name`].
    fn name(&self) -> String;
    /// [`Backend::config`].
    fn config(&self) -> &ModelConfig;
    /// [`Backend::kv_shape`].
    fn kv_shape(&self) -> KvShape;
    /// The pipeline this backend keeps (a field).
    fn pipeline(&self) -> &HostPipeline;
    /// The same, to launch through.
    fn pipeline_mut(&mut self) -> &mut HostPipeline;
    /// One step's samples: `[S]`, `Some` exactly where `batch.samples` is.
    /// `batch` has no carried tokens (the pipeline resolved them).
    fn compute(&mut self, batch: &StepBatch) -> Results;
    /// [`Backend::logits`].
    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError>;
    /// [`Backend::hidden`]. Default: the error of no hidden states.
    fn hidden(&mut self, _batch: &StepBatch, _rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        Err(crate::backend::no_hidden(&self.name()))
    }
    /// [`Backend::reserve`]. Default: nothing to size.
    fn reserve(&mut self, _max_tokens: usize, _max_seqs: usize) -> Result<(), BackendError> {
        Ok(())
    }
    /// [`Backend::max_drafts`]. Default: 0.
    fn max_drafts(&self) -> usize {
        0
    }
    /// [`Backend::verifies_penalties`]. Default: false.
    fn verifies_penalties(&self) -> bool {
        false
    }
    /// [`Backend::verifies_masks`]. Default: false.
    fn verifies_masks(&self) -> bool {
        false
    }
    /// [`Backend::deterministic`]. Default: false.
    fn deterministic(&self) -> bool {
        false
    }
    /// [`Backend::max_loras`]. Default: 0.
    fn max_loras(&self) -> usize {
        0
    }
    /// [`Backend::set_lora`]. Default: the error of no LoRA support.
    fn set_lora(
        &mut self,
        _slot: u32,
        _adapter: Option<std::sync::Arc<crate::LoraAdapter>>,
    ) -> Result<(), BackendError> {
        Err(crate::backend::no_lora(&self.name()))
    }
    /// Called after a step is held ([`Backend::launch_held`]). Default: nothing.
    fn held(&mut self) {}
}

impl<T: HostCompute> Backend for T {
    fn name(&self) -> String {
        HostCompute::name(self)
    }

    fn config(&self) -> &ModelConfig {
        HostCompute::config(self)
    }

    fn kv_shape(&self) -> KvShape {
        HostCompute::kv_shape(self)
    }

    fn launch(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        // the pipeline is taken out while the step borrows the backend
        let mut pipe = std::mem::take(self.pipeline_mut());
        let r = pipe.launch(batch, |b| self.compute(b));
        *self.pipeline_mut() = pipe;
        r
    }

    fn launch_held(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        self.pipeline_mut().hold(batch)?;
        self.held();
        Ok(())
    }

    fn release(&mut self, samples: &[Option<SampleRequest>]) -> Result<(), BackendError> {
        let mut pipe = std::mem::take(self.pipeline_mut());
        let r = pipe.release(samples, |b| self.compute(b));
        *self.pipeline_mut() = pipe;
        r
    }

    fn collect(&mut self) -> Results {
        self.pipeline_mut().collect()
    }

    fn in_flight(&self) -> usize {
        self.pipeline().in_flight()
    }

    fn max_drafts(&self) -> usize {
        HostCompute::max_drafts(self)
    }

    fn verifies_penalties(&self) -> bool {
        HostCompute::verifies_penalties(self)
    }

    fn verifies_masks(&self) -> bool {
        HostCompute::verifies_masks(self)
    }

    fn reserve(&mut self, max_tokens: usize, max_seqs: usize) -> Result<(), BackendError> {
        HostCompute::reserve(self, max_tokens, max_seqs)
    }

    fn deterministic(&self) -> bool {
        HostCompute::deterministic(self)
    }

    /// The step ran at launch: nothing overlaps it.
    fn steps_overlap(&self) -> bool {
        false
    }

    fn max_loras(&self) -> usize {
        HostCompute::max_loras(self)
    }

    fn set_lora(
        &mut self,
        slot: u32,
        adapter: Option<std::sync::Arc<crate::LoraAdapter>>,
    ) -> Result<(), BackendError> {
        HostCompute::set_lora(self, slot, adapter)
    }

    fn logits(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        HostCompute::logits(self, batch, rows)
    }

    fn hidden(&mut self, batch: &StepBatch, rows: &[usize]) -> Result<Vec<f32>, BackendError> {
        HostCompute::hidden(self, batch, rows)
    }
}

/// Results of launched steps and the token ids of the last one.
#[derive(Debug, Default)]
pub struct HostPipeline {
    queue: VecDeque<Result<Vec<Option<SampledToken>>, BackendError>>,
    /// `[S]` of the last launched step: its sampled token ids.
    last: Vec<Option<u32>>,
    /// The held step, its carried tokens resolved.
    held: Option<StepBatch>,
}

/// One step's samples, or why it failed.
pub type Results = Result<Vec<Option<SampledToken>>, BackendError>;

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

    /// Fails unless another step can be launched now.
    fn can_launch(&self) -> Result<(), BackendError> {
        crate::backend::check_can_launch(self.held.is_some(), self.queue.len())
    }

    /// Runs a resolved batch and queues its results.
    fn run(
        &mut self,
        batch: &StepBatch,
        run: impl FnOnce(&StepBatch) -> Results,
    ) -> Result<(), BackendError> {
        let results = run(batch)?;
        self.last.clear();
        self.last
            .extend(results.iter().map(|r| r.as_ref().map(|t| t.token)));
        self.queue.push_back(Ok(results));
        Ok(())
    }

    /// [`crate::Backend::launch`] through `run`, which computes a resolved
    /// batch's samples.
    pub fn launch(
        &mut self,
        batch: &StepBatch,
        run: impl FnOnce(&StepBatch) -> Results,
    ) -> Result<(), BackendError> {
        self.can_launch()?;
        let resolved = self.resolve(batch)?;
        self.run(&resolved, run)
    }

    /// [`crate::Backend::launch_held`]: keeps `batch`, resolved, until
    /// [`HostPipeline::release`].
    pub fn hold(&mut self, batch: &StepBatch) -> Result<(), BackendError> {
        self.can_launch()?;
        self.held = Some(self.resolve(batch)?.into_owned());
        Ok(())
    }

    /// [`crate::Backend::release`]: runs the held step through `run` with
    /// its final sample requests.
    pub fn release(
        &mut self,
        samples: &[Option<crate::SampleRequest>],
        run: impl FnOnce(&StepBatch) -> Results,
    ) -> Result<(), BackendError> {
        let Some(mut batch) = self.held.take() else {
            return Err(crate::backend::nothing_held());
        };
        crate::backend::check_release(&batch.samples, samples)?;
        batch.samples.clone_from_slice(samples);
        self.run(&batch, run)
    }

    /// [`crate::Backend::collect`]: the oldest launched step's samples.
    pub fn collect(&mut self) -> Results {
        self.queue.pop_front().unwrap_or_else(|| {
            Err(BackendError::InvalidBatch(match self.held {
                Some(_) => "the only step in flight is held; release it first".into(),
                None => "no launched step to collect".into(),
            }))
        })
    }

    /// [`crate::Backend::in_flight`]: launched steps not collected, the
    /// held one included.
    pub fn in_flight(&self) -> usize {
        self.queue.len() + usize::from(self.held.is_some())
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
            draft_rows: Vec::new(),
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
        assert_eq!(p.in_flight(), 2);
        p.collect().unwrap();
        p.collect().unwrap();
        assert_eq!(p.in_flight(), 0);
        p.launch(&plain, run).unwrap();
        assert_eq!(p.collect().unwrap(), vec![tok(10), None]);
    }
    #[test]
    fn a_held_step_runs_at_release_with_its_final_requests() {
        use crate::TokenMask;
        use std::sync::Arc;
        let mask = |ids: &[u32]| Some(Arc::new(TokenMask::from_ids(64, ids)));
        let mut p = HostPipeline::default();
        let first = batch(&[(2, 2), (1, 1)], &[true, true]);
        p.launch(&first, run).unwrap();
        let mut held = batch(&[(3, 1), (2, 1)], &[true, true]);
        held.carried = vec![Carried { token: 0, from: 0 }, Carried { token: 1, from: 1 }];
        if let Some(r) = held.samples[0].as_mut() {
            r.allowed = mask(&[1]);
        }
        p.hold(&held).unwrap();
        assert!(
            p.launch(&first, run).is_err(),
            "a launch behind a held step"
        );
        assert!(p.hold(&first).is_err(), "a second held step");
        assert_eq!(p.in_flight(), 2, "the launched step and the held one");
        // the step before it still collects; the held one does not
        let got = p.collect().unwrap();
        let e = p.collect().unwrap_err().to_string();
        assert!(e.contains("held"), "{e}");
        let mut fin = held.samples.clone();
        if let Some(r) = fin[0].as_mut() {
            r.allowed = mask(&[5, 6]);
        }
        let mut seen = None;
        p.release(&fin, |b| {
            seen = Some((b.tokens.clone(), b.samples.clone()));
            run(b)
        })
        .unwrap();
        let ids: Vec<u32> = got.iter().map(|t| t.as_ref().unwrap().token).collect();
        assert_eq!(seen, Some((ids, fin)));
        assert_eq!(p.collect().unwrap().len(), 2);
        // final requests that change which rows sample are refused, and the
        // held step is dropped
        p.hold(&first).unwrap();
        let mut bad = first.samples.clone();
        bad[1] = None;
        let e = p.release(&bad, run).unwrap_err().to_string();
        assert!(e.contains("sample request 1"), "{e}");
        let e = p.release(&first.samples, run).unwrap_err().to_string();
        assert!(e.contains("no step is held"), "{e}");
    }
}
