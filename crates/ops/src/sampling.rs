//! The sampling procedure documented in [`contract::sampling`], the one CPU
//! implementation of it: one sequence's logits in, one [`SampledToken`]
//! out. The CPU backend samples with [`sample`]; the CUDA sampler's tests
//! compare its rows against [`sample_row`] (the same procedure over a row's
//! resolved inputs, [`RowSampling`], what the kernel reads per row).
//!
//! Contract: [`sample`] follows `sampling.rs` step by step (raw-logit
//! log-probabilities, repetition penalty over distinct history tokens, the
//! presence / frequency penalties and `logit_bias` as the additive terms of
//! [`additive_terms`], the grammar's allowed-token mask, greedy
//! argmax with lowest id on ties, otherwise softmax at the temperature, top-k,
//! top-p over the full distribution's mass, min-p, and the counter-based draw
//! [`uniform`]). It never panics: a temperature that is not `> 0` is greedy,
//! history ids outside the vocabulary are ignored, an empty logits slice
//! yields token 0 with logprob `-inf`, and a degenerate row (non-finite or
//! all-equal logits, [`is_degenerate`]) token 0 with a NaN log-probability.
//!
//! Costs, for a vocabulary `V` and `K = params.logprobs`: greedy is O(V) plus
//! O(V * K) for the top-K alternatives; sampling adds an O(V) softmax and a
//! sort of the candidates (O(k log k) after an O(V) selection when top-k is
//! set, O(V log V) otherwise). Probabilities are f32, running masses f64.

use contract::backend::{SampleRequest, SampledToken};
use contract::history::additive_terms;
use contract::mask::TokenMask;
use contract::sampling::{is_degenerate, is_greedy_temperature, uniform};
use std::cmp::Ordering;

/// One row's sampling inputs once its [`SampleRequest`] is resolved: the
/// presence / frequency penalties and `logit_bias` merged into additive
/// terms ([`additive_terms`]) and the draw computed ([`uniform`]).
#[derive(Debug, Clone, Copy)]
pub struct RowSampling<'a> {
    /// Greedy unless a positive finite number ([`is_greedy_temperature`]).
    pub temperature: f32,
    /// 0: off.
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    /// Distinct ids the repetition penalty applies to (ids outside the
    /// vocabulary are ignored).
    pub history: &'a [u32],
    /// Additive `(id, delta)` terms, distinct ids (outside: ignored).
    pub adds: &'a [(u32, f32)],
    /// The tokens a grammar allows; `None`: all.
    pub allowed: Option<&'a TokenMask>,
    /// The draw, in `[0, 1)`.
    pub u: f32,
    /// How many top log-probabilities to report.
    pub logprobs: usize,
}

/// Samples the next token from `logits` (`[vocab]`) as `req` asks.
pub fn sample(logits: &[f32], req: &SampleRequest) -> SampledToken {
    let mut adds = Vec::new();
    sample_row(logits, &resolve(req, &mut adds))
}

/// The resolved inputs of `req`; `adds` receives its additive terms.
fn resolve<'a>(req: &'a SampleRequest, adds: &'a mut Vec<(u32, f32)>) -> RowSampling<'a> {
    let params = &req.params;
    additive_terms(params, req.history.as_deref(), adds);
    RowSampling {
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
        min_p: params.min_p,
        repetition_penalty: params.repetition_penalty,
        history: req.history.as_deref().map_or(&[], |h| h.as_slice()),
        adds,
        allowed: req.allowed.as_deref(),
        u: uniform(params.seed, req.step),
        logprobs: params.logprobs,
    }
}

/// Samples the next token from `logits` (`[vocab]`) with a row's resolved
/// inputs (see the module doc).
pub fn sample_row(logits: &[f32], row: &RowSampling<'_>) -> SampledToken {
    if is_degenerate(logits) {
        return SampledToken {
            token: 0,
            logprob: f32::NAN,
            top_logprobs: Vec::new(),
            draft_rows: Vec::new(),
        };
    }
    let lse = log_sum_exp(logits);
    let top_logprobs = log_softmax_top(logits, row.logprobs, lse);
    let penalised;
    let z: &[f32] = match penalise(logits, row) {
        Some(p) => {
            penalised = p;
            &penalised
        }
        None => logits,
    };
    let token = if is_greedy_temperature(row.temperature) {
        argmax(z)
    } else {
        draw(z, row)
    };
    let logprob = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&v| v - lse);
    SampledToken {
        token,
        logprob,
        top_logprobs,
        draft_rows: Vec::new(),
    }
}

/// `log(sum(exp(z)))`, computed stably (max-shifted, f64 sum).
/// `-inf` for an empty slice or all `-inf` logits.
pub fn log_sum_exp(z: &[f32]) -> f32 {
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m;
    }
    let s: f64 = z.iter().map(|&v| ((v - m) as f64).exp()).sum();
    m + s.ln() as f32
}

/// The `k` highest `(token, log_softmax)` pairs of `z`, best first, lowest id
/// first on ties; `lse` is [`log_sum_exp`] of `z`. O(V * k).
pub fn log_softmax_top(z: &[f32], k: usize, lse: f32) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(k + 1);
    if k == 0 {
        return top;
    }
    for (i, &v) in z.iter().enumerate() {
        if top.len() == k && (v.is_nan() || v <= top[k - 1].1) {
            continue;
        }
        // first place whose value is below v: keeps equal values in id order
        let at = top.iter().position(|&(_, w)| v > w).unwrap_or(top.len());
        top.insert(at, (i as u32, v));
        top.truncate(k);
    }
    top.into_iter().map(|(i, v)| (i, v - lse)).collect()
}

/// Index of the largest value, lowest index on ties (NaN never wins).
pub fn argmax(z: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in z.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// Steps 2-3 of the procedure, then the grammar's mask (every token it
/// forbids set to `-inf`, `contract::mask`): the changed logits, or `None`
/// when no penalty, bias or mask changes them.
fn penalise(logits: &[f32], row: &RowSampling<'_>) -> Option<Vec<f32>> {
    let rep = row.repetition_penalty != 1.0 && !row.history.is_empty();
    if !rep && row.adds.is_empty() && row.allowed.is_none() {
        return None;
    }
    let mut z = if rep {
        apply_repetition_penalty(logits, row.history, row.repetition_penalty)
    } else {
        logits.to_vec()
    };
    for &(id, d) in row.adds {
        if let Some(v) = z.get_mut(id as usize) {
            *v += d;
        }
    }
    if let Some(mask) = row.allowed {
        mask.apply(&mut z);
    }
    Some(z)
}

/// `z / r` where positive, `z * r` otherwise, once per distinct history token
/// (the set is distinct by construction: no per-step sort or dedup).
fn apply_repetition_penalty(logits: &[f32], history: &[u32], r: f32) -> Vec<f32> {
    let mut z = logits.to_vec();
    for &id in history {
        if let Some(v) = z.get_mut(id as usize) {
            *v = if *v > 0.0 { *v / r } else { *v * r };
        }
    }
    z
}

/// Steps 4-5 of the procedure: softmax at the temperature, filters, draw.
fn draw(z: &[f32], row: &RowSampling<'_>) -> u32 {
    let t = row.temperature;
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return argmax(z);
    }
    // [V] unnormalised weights exp((z - max) / T) and their f64 sum
    let e: Vec<f32> = z.iter().map(|&v| ((v - m) / t).exp()).collect();
    let total: f64 = e.iter().map(|&x| x as f64).sum();
    // rank by the (penalised) logit: the order of `e`, without the ties `e`
    // gets in f32 at huge temperatures (top_k = 1 stays greedy)
    let by_prob =
        |a: &u32, b: &u32| -> Ordering { z[*b as usize].total_cmp(&z[*a as usize]).then(a.cmp(b)) };
    let mut cand: Vec<u32> = (0..z.len() as u32)
        .filter(|&i| e[i as usize] > 0.0)
        .collect();
    if row.top_k > 0 && row.top_k < cand.len() {
        cand.select_nth_unstable_by(row.top_k - 1, by_prob);
        cand.truncate(row.top_k);
    }
    cand.sort_unstable_by(by_prob);
    let p = |i: u32| e[i as usize] as f64 / total;
    if row.top_p < 1.0 {
        let mut mass = 0.0;
        let mut keep = cand.len();
        for (n, &i) in cand.iter().enumerate() {
            mass += p(i);
            if mass >= row.top_p as f64 {
                keep = n + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    if row.min_p > 0.0
        && let Some(&first) = cand.first()
    {
        let floor = row.min_p as f64 * p(first);
        let keep = cand.iter().take_while(|&&i| p(i) >= floor).count();
        cand.truncate(keep.max(1));
    }
    let kept: f64 = cand.iter().map(|&i| p(i)).sum();
    let target = row.u as f64 * kept;
    let mut run = 0.0;
    for &i in &cand {
        run += p(i);
        if run > target {
            return i;
        }
    }
    cand.last().copied().unwrap_or_else(|| argmax(z))
}

#[cfg(test)]
mod tests;
