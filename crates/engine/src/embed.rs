//! Embeddings: each input's final hidden state (after the final norm)
//! pooled into one L2-normalised vector of the model's hidden size.
//!
//! Contract: [`crate::Engine::embed`] checks every input first ([`check`]:
//! at least one, at most [`MAX_EMBED_INPUTS`], none empty, every id inside
//! the vocabulary, none longer than `Engine::max_sequence`: the context and
//! the KV pool) and queues one job on the loop; its [`EmbedHandle`] yields
//! one vector per input, in order, or the error that ended the job. On the
//! loop ([`EmbedQueue`]) an iteration with embedding work first lands the
//! step in flight (`Backend::hidden` needs the backend idle), then runs one
//! pass: the inputs in arrival order, each admitted into fresh KV blocks
//! when they fit (`KvManager::admit_fresh`: nothing reused from the prefix
//! cache or offered to it), cut to the step's token budget and run
//! together as prompt tokens. An input whose last chunk ran is pooled
//! ([`Pooling`]), normalised, and its blocks are freed at once; the next
//! iteration's generation step runs between two passes, so embeddings hold
//! KV blocks only while their passes run and never stall the streams for
//! more than one pass. An input that does not fit the free blocks waits
//! (those before it finish and free theirs; generation frees the rest). A
//! job whose handle was dropped is dropped, blocks freed, at the next pass;
//! a backend error or a non-finite state ends the jobs of its pass.
//!
//! A token's hidden state depends only on its own sequence (the backends'
//! contract), so an input's embedding is the same alone or in a batch, up
//! to the arithmetic the step's shape selects (within 1e-3 cosine).
//!
//! Costs: per pass one `Backend::hidden` call over at most the step budget
//! of tokens, `O(rows x hidden)` host work to pool; memory `hidden` floats
//! per input in progress (mean pooling sums as it goes).

use std::collections::{HashMap, HashSet, VecDeque};

use contract::{Backend, StepBuilder};
use paged_kv::{KvManager, SeqId};
use tokio::sync::oneshot;

/// Most inputs one embedding request may hold (OpenAI's limit).
pub const MAX_EMBED_INPUTS: usize = 2048;

/// How a sequence's hidden states become one vector (`--pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The last token's state (what a causal decoder has seen all of).
    #[default]
    Last,
    /// The mean of every token's state.
    Mean,
}

impl Pooling {
    /// Every pooling, by name.
    pub const ALL: [Pooling; 2] = [Pooling::Last, Pooling::Mean];

    /// The name the flag takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Last => "last",
            Pooling::Mean => "mean",
        }
    }
}

impl std::str::FromStr for Pooling {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pooling::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown pooling `{s}`; expected `last` or `mean`"))
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One embedding request: token ids per input and the pooling.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedRequest {
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
}

/// The result of an embedding request.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// One L2-normalised vector of the model's hidden size per input, in order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens embedded, every input counted.
    pub prompt_tokens: usize,
}

/// Why an embedding request was refused or failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EmbedError {
    #[error("there is nothing to embed: give at least one input")]
    NoInput,
    #[error("{count} inputs; at most {limit} are embedded in one request")]
    TooManyInputs { count: usize, limit: usize },
    #[error("input {index} is empty")]
    Empty { index: usize },
    #[error(
        "input {index} has {tokens} tokens; at most {limit} can be embedded (the model's context, or what the KV pool holds when less)"
    )]
    TooLong {
        index: usize,
        tokens: usize,
        limit: usize,
    },
    #[error(
        "input {index}: token id {token} at position {position} is outside the vocabulary (size {vocab})"
    )]
    OutOfVocab {
        index: usize,
        token: u32,
        position: usize,
        vocab: usize,
    },
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("the engine failed: {0}")]
    EngineFailed(String),
    #[error("the embedding pass failed: {0}")]
    Backend(String),
}

impl EmbedError {
    /// The input the error is about, if one.
    pub fn input(&self) -> Option<usize> {
        match self {
            EmbedError::Empty { index }
            | EmbedError::TooLong { index, .. }
            | EmbedError::OutOfVocab { index, .. } => Some(*index),
            _ => None,
        }
    }
}

/// The one check of an embedding request's inputs (module doc); `limit`:
/// the most tokens one input may have.
pub(crate) fn check(inputs: &[Vec<u32>], vocab: usize, limit: usize) -> Result<(), EmbedError> {
    check_count(inputs.len())?;
    for (index, ids) in inputs.iter().enumerate() {
        if ids.is_empty() {
            return Err(EmbedError::Empty { index });
        }
        if ids.len() > limit {
            let tokens = ids.len();
            return Err(EmbedError::TooLong {
                index,
                tokens,
                limit,
            });
        }
        if let Some((position, &token)) =
            ids.iter().enumerate().find(|(_, t)| **t as usize >= vocab)
        {
            return Err(EmbedError::OutOfVocab {
                index,
                token,
                position,
                vocab,
            });
        }
    }
    Ok(())
}

/// The input count's part of the check: at least one, at most
/// [`MAX_EMBED_INPUTS`] (for a caller to check before it tokenizes).
pub fn check_count(count: usize) -> Result<(), EmbedError> {
    match count {
        0 => Err(EmbedError::NoInput),
        n if n > MAX_EMBED_INPUTS => Err(EmbedError::TooManyInputs {
            count: n,
            limit: MAX_EMBED_INPUTS,
        }),
        _ => Ok(()),
    }
}

type Reply = Result<Embeddings, EmbedError>;

/// The embeddings of one request, once the loop has computed them.
pub struct EmbedHandle {
    pub(crate) rx: oneshot::Receiver<Reply>,
}

impl EmbedHandle {
    /// Waits for the vectors (async).
    pub async fn wait(self) -> Reply {
        self.rx.await.unwrap_or(Err(EmbedError::ShuttingDown))
    }

    /// Waits for the vectors, blocking this thread (not an async worker).
    pub fn blocking_wait(self) -> Reply {
        self.rx
            .blocking_recv()
            .unwrap_or(Err(EmbedError::ShuttingDown))
    }
}

/// A checked request on its way to the loop; `first`: the KV sequence id
/// of its first input (the next `inputs.len()` ids are its own).
pub(crate) struct EmbedJob {
    pub first: SeqId,
    pub req: EmbedRequest,
    pub tx: oneshot::Sender<Reply>,
}

/// A job on the loop: its vectors as they are done.
struct Job {
    req: EmbedRequest,
    tx: oneshot::Sender<Reply>,
    out: Vec<Vec<f32>>,
    left: usize,
}

/// One input in progress.
struct Item {
    job: SeqId,
    index: usize,
    seq: SeqId,
    /// Tokens run so far (their K/V written).
    done: usize,
    admitted: bool,
    /// `[hidden]` the sum of the rows so far (mean) or the last row.
    acc: Vec<f32>,
}

/// The loop's embedding work (module doc).
#[derive(Default)]
pub(crate) struct EmbedQueue {
    jobs: HashMap<SeqId, Job>,
    items: VecDeque<Item>,
}

impl EmbedQueue {
    /// Whether no input waits or runs.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Queues `job`'s inputs after those already queued.
    pub fn push(&mut self, job: EmbedJob, hidden: usize) {
        let n = job.req.inputs.len();
        for index in 0..n {
            self.items.push_back(Item {
                job: job.first,
                index,
                seq: job.first + index as SeqId,
                done: 0,
                admitted: false,
                acc: vec![0.0; hidden],
            });
        }
        let out = vec![Vec::new(); n];
        let entry = Job {
            req: job.req,
            tx: job.tx,
            out,
            left: n,
        };
        self.jobs.insert(job.first, entry);
    }

    /// Ends every job with `err`, freeing their blocks.
    pub fn fail_all(&mut self, kv: &mut KvManager, err: &EmbedError) {
        let ids: Vec<SeqId> = self.jobs.keys().copied().collect();
        for id in ids {
            self.fail(kv, id, err.clone());
        }
    }

    /// Ends job `id` with `err`: its inputs leave the queue, blocks freed.
    fn fail(&mut self, kv: &mut KvManager, id: SeqId, err: EmbedError) {
        self.drop_job(kv, id);
        if let Some(job) = self.jobs.remove(&id) {
            let _ = job.tx.send(Err(err));
        }
    }

    /// Removes job `id`'s inputs, freeing the blocks of those admitted.
    fn drop_job(&mut self, kv: &mut KvManager, id: SeqId) {
        for it in self.items.iter().filter(|it| it.job == id && it.admitted) {
            let _ = kv.free(it.seq);
        }
        self.items.retain(|it| it.job != id);
    }

    /// One pass (module doc) over at most `budget` tokens; does nothing
    /// when the first waiting input's blocks are not free.
    pub fn pass(&mut self, backend: &mut dyn Backend, kv: &mut KvManager, budget: usize) {
        let gone: Vec<SeqId> = (self.jobs.iter())
            .filter(|(_, j)| j.tx.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for id in gone {
            self.drop_job(kv, id);
            self.jobs.remove(&id);
        }
        let mut b = StepBuilder::new(kv.block_size());
        b.begin();
        let (runs, rows) = match self.plan(kv, &mut b, budget) {
            Ok(p) => p,
            Err(e) => return self.fail_all(kv, &EmbedError::Backend(e)),
        };
        if runs.is_empty() {
            return;
        }
        let hidden = backend.config().hidden_size;
        match backend.hidden(b.finish(), &rows) {
            Ok(h) if h.len() == rows.len() * hidden => self.land(kv, &runs, &h),
            Ok(h) => {
                let why = format!(
                    "the backend returned {} values for {} rows of {hidden}",
                    h.len(),
                    rows.len()
                );
                self.fail_planned(kv, runs.len(), EmbedError::Backend(why))
            }
            Err(e) => self.fail_planned(kv, runs.len(), EmbedError::Backend(e.to_string())),
        }
    }

    /// Admits and pushes the leading inputs into `b` within `budget`
    /// tokens; returns the tokens each runs (the leading inputs, in order)
    /// and the token rows to read.
    fn plan(
        &mut self,
        kv: &mut KvManager,
        b: &mut StepBuilder,
        budget: usize,
    ) -> Result<(Vec<usize>, Vec<usize>), String> {
        let (mut left, mut runs, mut rows) = (budget, Vec::new(), Vec::new());
        for it in self.items.iter_mut() {
            let Some(job) = self.jobs.get(&it.job) else {
                break;
            };
            let ids = &job.req.inputs[it.index];
            if left == 0 || (!it.admitted && !kv.can_admit_fresh(ids.len())) {
                break;
            }
            if !it.admitted {
                kv.admit_fresh(it.seq, ids).map_err(|e| e.to_string())?;
                it.admitted = true;
            }
            let n = (ids.len() - it.done).min(left);
            let table = kv.block_table(it.seq).unwrap_or_default();
            let first = b.batch().tokens.len();
            (b.push(&ids[it.done..it.done + n], it.done, table, None))
                .map_err(|e| e.to_string())?;
            b.set_prompt_len(ids.len());
            match job.req.pooling {
                Pooling::Mean => rows.extend(first..first + n),
                Pooling::Last if it.done + n == ids.len() => rows.push(first + n - 1),
                Pooling::Last => {}
            }
            left -= n;
            runs.push(n);
        }
        Ok((runs, rows))
    }

    /// Folds a pass's hidden states (`[rows, hidden]`, as `plan` listed
    /// them) into its leading inputs, which ran `runs` tokens each, and
    /// finishes those done.
    fn land(&mut self, kv: &mut KvManager, runs: &[usize], states: &[f32]) {
        let hidden = self.items.front().map_or(1, |it| it.acc.len().max(1));
        let mut rows = states.chunks_exact(hidden);
        let mut done = HashSet::new();
        for (it, &n) in self.items.iter_mut().zip(runs) {
            let Some(job) = self.jobs.get(&it.job) else {
                continue;
            };
            let len = job.req.inputs[it.index].len();
            it.done += n;
            match job.req.pooling {
                Pooling::Mean => (rows.by_ref().take(n)).for_each(|r| add(&mut it.acc, r)),
                Pooling::Last if it.done == len => {
                    if let Some(r) = rows.next() {
                        it.acc.copy_from_slice(r);
                    }
                }
                Pooling::Last => {}
            }
            if it.done == len {
                done.insert(it.seq);
            }
        }
        let (finished, running): (Vec<Item>, Vec<Item>) =
            (self.items.drain(..)).partition(|it| done.contains(&it.seq));
        self.items = running.into();
        for it in finished {
            let _ = kv.free(it.seq);
            self.finish_input(kv, it);
        }
    }

    /// Pools, checks and stores a finished input's vector, and answers its
    /// job once every input is done.
    fn finish_input(&mut self, kv: &mut KvManager, it: Item) {
        let Some(job) = self.jobs.get_mut(&it.job) else {
            return;
        };
        let len = job.req.inputs[it.index].len();
        let mut v = it.acc;
        if job.req.pooling == Pooling::Mean {
            let k = 1.0 / len as f32;
            v.iter_mut().for_each(|x| *x *= k);
        }
        if v.iter().any(|x| !x.is_finite()) {
            let why = format!("input {} has non-finite hidden states", it.index);
            return self.fail(kv, it.job, EmbedError::Backend(why));
        }
        normalise(&mut v);
        job.out[it.index] = v;
        job.left -= 1;
        if job.left == 0
            && let Some(job) = self.jobs.remove(&it.job)
        {
            let prompt_tokens = job.req.inputs.iter().map(Vec::len).sum();
            let vectors = job.out;
            let _ = job.tx.send(Ok(Embeddings {
                vectors,
                prompt_tokens,
            }));
        }
    }

    /// Ends the jobs of the first `planned` inputs with `err`.
    fn fail_planned(&mut self, kv: &mut KvManager, planned: usize, err: EmbedError) {
        let mut ids: Vec<SeqId> = (self.items.iter().take(planned)).map(|it| it.job).collect();
        ids.dedup();
        for id in ids {
            self.fail(kv, id, err.clone());
        }
    }
}

/// Scales `v` to unit L2 norm (a zero vector stays zero).
fn normalise(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let k = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= k);
    }
}

/// `acc += row`.
fn add(acc: &mut [f32], row: &[f32]) {
    for (a, &r) in acc.iter_mut().zip(row) {
        *a += r;
    }
}
