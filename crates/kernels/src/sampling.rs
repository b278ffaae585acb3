//! Launcher for `cu/sampling.cu`: sampling on the GPU with the procedure of
//! `model::sampling` (the draw `u` is computed on the host with
//! `model::sampling::uniform(seed, step)` and passed in), and its CPU
//! reference, which sorts the candidates exactly as that procedure says.
//! Costs: one launch, one 1024-thread block per row; greedy rows make three
//! passes over the vocabulary, sampled rows up to ~260 (binary searches).

use bytemuck::{Pod, Zeroable};
use gpu::{DevSlice, LaunchArgs, LaunchConfig};

use crate::{KernelError, Kernels, need, u32_of};

/// Per-row sampling settings as the kernel reads them (48 bytes, `repr(C)`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Pod, Zeroable)]
pub struct SampleParams {
    pub temperature: f32,
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    /// The draw in `[0, 1)`.
    pub u: f32,
    /// Offset of this row's distinct history ids in the flat history buffer.
    pub hist_off: u32,
    pub hist_len: u32,
    /// How many top log-probabilities to report.
    pub n_logprobs: u32,
    pub _pad: [u32; 3],
}

impl SampleParams {
    /// Greedy, no penalty, no log-probabilities.
    pub fn greedy() -> Self {
        SampleParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            u: 0.0,
            hist_off: 0,
            hist_len: 0,
            n_logprobs: 0,
            _pad: [0; 3],
        }
    }
}

/// Output views of [`Kernels::sample_rows`].
#[derive(Debug, Clone, Copy)]
pub struct SampleOutputs<'a> {
    pub tokens: DevSlice<'a, u32>,   // [R]
    pub logprobs: DevSlice<'a, f32>, // [R]
    pub top_ids: DevSlice<'a, u32>,  // [R, max_logprobs]
    pub top_lps: DevSlice<'a, f32>,  // [R, max_logprobs]
}

impl Kernels {
    /// Samples one token for each of `rows` rows of `logits`.
    ///
    /// # Safety
    /// Each row's history range `hist_off..hist_off + hist_len` lies inside
    /// `history`, its ids are distinct (ids >= vocab are ignored).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sample_rows(
        &self,
        logits: DevSlice<'_, f32>,          // [R, vocab]
        work: DevSlice<'_, f32>,            // [R, vocab]
        params: DevSlice<'_, SampleParams>, // [R]
        history: DevSlice<'_, u32>,
        out: SampleOutputs<'_>,
        rows: usize,
        vocab: usize,
        max_logprobs: usize,
    ) -> Result<(), KernelError> {
        const K: &str = "sample_rows";
        need(K, "logits", &logits, rows * vocab)?;
        need(K, "work", &work, rows * vocab)?;
        need(K, "params", &params, rows)?;
        need(K, "tokens", &out.tokens, rows)?;
        need(K, "logprobs", &out.logprobs, rows)?;
        need(K, "top_ids", &out.top_ids, rows * max_logprobs)?;
        need(K, "top_lps", &out.top_lps, rows * max_logprobs)?;
        if rows == 0 {
            return Ok(());
        }
        let mut a = LaunchArgs::new();
        a.ptr(logits)
            .ptr(work)
            .ptr(params)
            .ptr(history)
            .u32(u32_of(K, "vocab", vocab)?)
            .u32(u32_of(K, "max_logprobs", max_logprobs)?)
            .ptr(out.tokens)
            .ptr(out.logprobs)
            .ptr(out.top_ids)
            .ptr(out.top_lps);
        // SAFETY: views checked above; history ranges by contract; args match.
        unsafe {
            self.gpu.launch(
                &self.sample_rows,
                LaunchConfig::linear(u32_of(K, "rows", rows)?, 1024),
                &mut a,
            )?
        };
        Ok(())
    }
}

/// CPU reference of one row: `(token, logprob, top logprobs)`, following the
/// documented procedure with an explicit sort. `history` holds distinct ids.
pub fn sample_ref(
    logits: &[f32],
    p: &SampleParams,
    history: &[u32],
) -> (u32, f32, Vec<(u32, f32)>) {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + logits
        .iter()
        .map(|&z| ((z - m) as f64).exp())
        .sum::<f64>()
        .ln() as f32;
    let mut z = logits.to_vec();
    if p.repetition_penalty != 1.0 {
        for &id in history {
            if let Some(v) = z.get_mut(id as usize) {
                *v = if *v > 0.0 {
                    *v / p.repetition_penalty
                } else {
                    *v * p.repetition_penalty
                };
            }
        }
    }
    let by_key = |a: &(usize, f32), b: &(usize, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let token = if p.temperature == 0.0 {
        let mut best = 0;
        for (i, &v) in z.iter().enumerate() {
            if v > z[best] {
                best = i;
            }
        }
        best
    } else {
        let scaled: Vec<f32> = z.iter().map(|&v| v / p.temperature).collect();
        let m2 = scaled.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let zsum: f64 = scaled.iter().map(|&v| ((v - m2) as f64).exp()).sum();
        let mut cand: Vec<(usize, f32)> = scaled
            .iter()
            .enumerate()
            .map(|(i, &v)| (i, ((v - m2) as f64).exp() as f32 / zsum as f32))
            .collect();
        cand.sort_by(by_key);
        let mut n = cand.len();
        if p.top_k > 0 {
            n = n.min(p.top_k as usize);
        }
        if p.top_p < 1.0 {
            let mut acc = 0f64;
            for (i, c) in cand.iter().enumerate() {
                acc += c.1 as f64;
                if acc >= p.top_p as f64 {
                    n = n.min(i + 1);
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let thr = p.min_p * cand[0].1;
            n = n.min(cand.iter().take_while(|c| c.1 >= thr).count().max(1));
        }
        let kept: f64 = cand[..n].iter().map(|c| c.1 as f64).sum();
        let target = p.u as f64 * kept;
        let mut acc = 0f64;
        let mut pick = cand[n - 1].0;
        for c in &cand[..n] {
            acc += c.1 as f64;
            if acc > target {
                pick = c.0;
                break;
            }
        }
        pick
    };
    let mut raw: Vec<(usize, f32)> = logits.iter().cloned().enumerate().collect();
    raw.sort_by(by_key);
    let top = raw
        .iter()
        .take(p.n_logprobs as usize)
        .map(|&(i, v)| (i as u32, v - lse))
        .collect();
    (token as u32, logits[token] - lse, top)
}
