//! Sampling parameters and the one sampling procedure both backends follow.
//!
//! Procedure, for one sequence's logits `z` (`[vocab]`, f32):
//! 0. Logits that are not all finite, or all equal, hold no distribution
//!    (weights or activations that overflowed or collapsed): the row is
//!    degenerate ([`is_degenerate`]). Its sample carries a NaN
//!    log-probability, the one sign every backend gives, and the engine ends
//!    that request with an error instead of emitting a meaningless token.
//! 1. Log-probabilities reported to the user are `log_softmax(z)` of the raw
//!    logits (before penalties and temperature), like OpenAI and vLLM.
//! 2. Repetition penalty `r != 1`: for each distinct token in the history
//!    (prompt + generated), `z = z / r` if `z > 0` else `z * r`.
//! 3. Presence and frequency penalties (OpenAI's definition), over the
//!    tokens generated so far only (not the prompt): a token generated `c > 0`
//!    times gets `z -= c * frequency_penalty + presence_penalty`. Then
//!    `logit_bias`: `z += bias` for each listed token (OpenAI: -100 bans a
//!    token, +100 makes it the only choice in practice). Then, for a
//!    constrained sequence, every token the grammar's mask forbids gets
//!    `z = -inf` ([`crate::mask`]).
//! 4. `temperature == 0` (greedy): the argmax, lowest id on ties. Stop.
//! 5. Otherwise `p = softmax(z / temperature)`; candidates sorted by their
//!    (penalised) logit descending, lowest id first on ties (the order of `p`,
//!    without the ties `p` gets in f32 at huge temperatures: `top_k = 1` is
//!    greedy at any temperature); keep the first `top_k` (0 = all); keep the
//!    shortest prefix whose mass reaches `top_p` (at least one); drop
//!    candidates with `p < min_p * p_max`.
//! 6. Draw `u = uniform(seed, step)` in `[0, 1)` and return the first candidate
//!    whose running sum exceeds `u * (kept mass)`.
//!
//! The draw is counter-based ([`uniform`]): it depends only on the request's
//! seed and the index of the token being generated, never on batching, so a
//! seeded request is reproducible across runs, batch mixes and preemptions.
//!
//! Several choices of one request (`n > 1`, `best_of`): choice `i` is
//! sampled exactly like a request of its own seeded with
//! [`choice_seed`]`(seed, i)`; choice 0 keeps `seed` itself, so `n = 1` and
//! the first of `n` choices agree.

use std::sync::Arc;

/// Largest accepted temperature: far above any useful value (OpenAI allows 2)
/// and far below where `z / T` stops telling logits apart in f32.
pub const MAX_TEMPERATURE: f32 = 100.0;

/// Largest `|presence_penalty|` and `|frequency_penalty|` (OpenAI's range).
pub const MAX_PENALTY: f32 = 2.0;
/// Largest `|logit_bias|` value (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// True when sampling at `temperature` is the argmax: anything but a
/// positive finite number ([`SamplingParams::is_greedy`]'s rule, for a
/// row's temperature on its own).
pub fn is_greedy_temperature(temperature: f32) -> bool {
    !(temperature > 0.0 && temperature.is_finite())
}

/// Whether `z` (one row of logits) is degenerate (step 0 of the procedure):
/// a value that is not finite, or every value equal (more than one). O(V);
/// a row that varies is told apart within its first few values.
pub fn is_degenerate(z: &[f32]) -> bool {
    z.iter().any(|v| !v.is_finite()) || (z.len() > 1 && z.iter().all(|&v| v == z[0]))
}

/// The valid values of a scalar sampling parameter; its `Display` is the
/// range as the error messages and `--help` show it (`in [0, 1]`, `> 0`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ValidRange {
    /// `[lo, hi]`.
    Closed(f32, f32),
    /// `(lo, hi]`.
    OpenClosed(f32, f32),
    /// Any finite value above 0.
    Positive,
}

impl ValidRange {
    /// True when `v` is in the range (never for NaN).
    pub fn contains(self, v: f32) -> bool {
        match self {
            ValidRange::Closed(lo, hi) => v >= lo && v <= hi,
            ValidRange::OpenClosed(lo, hi) => v > lo && v <= hi,
            ValidRange::Positive => v > 0.0 && v.is_finite(),
        }
    }
}

impl std::fmt::Display for ValidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ValidRange::Closed(lo, hi) => write!(f, "in [{lo}, {hi}]"),
            ValidRange::OpenClosed(lo, hi) => write!(f, "in ({lo}, {hi}]"),
            ValidRange::Positive => write!(f, "> 0"),
        }
    }
}

/// The scalar sampling parameters, declared once: name, default (the value
/// that turns the parameter off, or its neutral value), valid [`ValidRange`] and
/// doc. Every layer is generated from this list by handing it to a
/// callback macro, `sampling_params!(callback)` or
/// `sampling_params!(callback { extra tokens })`, which is invoked as
/// `callback! { { extra tokens } entries... }` with one entry per parameter:
///
/// ```text
/// /// doc lines
/// name: f32 = default, range_expression [, kernel];
/// ```
///
/// From it come [`SamplingParams`]' fields, their defaults and their checks
/// in [`SamplingParams::validate`], [`SamplingOverrides`] (a request's
/// optional values), the HTTP request fields of the completion endpoints
/// (`server::protocol`) and the CLI flags (`cli`'s `SamplingArgs`).
/// `kernel` marks a parameter the CUDA sampler reads from its per-row
/// record under the same name (`kernels::SampleParams`): the host copies it
/// there without a hand-written line (`model::cuda::staging`); the others are
/// folded on the host (the penalties become additive terms,
/// `contract::history::additive_terms`). What a parameter does is code of
/// its own in each sampler (`ops::sampling`, the CPU one and the
/// reference of `sampling.cu`). `top_k`, `logit_bias`, `seed` and `logprobs` have
/// encodings of their own on the wire and are written out by hand in each
/// layer.
#[macro_export]
macro_rules! sampling_params {
    ($cb:ident $({ $($extra:tt)* })?) => {
        $cb! {
            { $($($extra)*)? }
            /// Sampling temperature; 0 is greedy.
            temperature: f32 = 1.0,
                $crate::sampling::ValidRange::Closed(0.0, $crate::sampling::MAX_TEMPERATURE), kernel;
            /// Nucleus sampling: keep the most likely tokens up to this
            /// probability mass (1 = off).
            top_p: f32 = 1.0, $crate::sampling::ValidRange::OpenClosed(0.0, 1.0), kernel;
            /// Drop tokens below this fraction of the top probability (0 = off).
            min_p: f32 = 0.0, $crate::sampling::ValidRange::Closed(0.0, 1.0), kernel;
            /// Penalise tokens already seen, prompt included (1 = off).
            repetition_penalty: f32 = 1.0, $crate::sampling::ValidRange::Positive, kernel;
            /// Subtracted once from every token generated at least once
            /// (OpenAI's presence penalty; 0 = off).
            presence_penalty: f32 = 0.0,
                $crate::sampling::ValidRange::Closed(-$crate::sampling::MAX_PENALTY, $crate::sampling::MAX_PENALTY);
            /// Subtracted per occurrence from every generated token (OpenAI's
            /// frequency penalty; 0 = off).
            frequency_penalty: f32 = 0.0,
                $crate::sampling::ValidRange::Closed(-$crate::sampling::MAX_PENALTY, $crate::sampling::MAX_PENALTY);
        }
    };
}

macro_rules! define_sampling_params {
    ({} $(
        $(#[doc = $doc:literal])*
        $name:ident : f32 = $default:literal, $range:expr $(, $kernel:ident)? ;
    )*) => {
        /// Per-request sampling settings.
        #[derive(Debug, Clone, PartialEq)]
        pub struct SamplingParams {
            $(
                $(#[doc = $doc])*
                pub $name: f32,
            )*
            /// 0 disables top-k.
            pub top_k: usize,
            /// `(token, bias)` added to the logits, ids ascending and distinct,
            /// biases in [-100, 100]. Shared (`Arc`): cloning the parameters for a
            /// step never copies it.
            pub logit_bias: Arc<[(u32, f32)]>,
            /// Seed of the counter-based draw.
            pub seed: u64,
            /// How many top alternatives to report with each token (0 = none).
            pub logprobs: usize,
        }

        impl Default for SamplingParams {
            fn default() -> Self {
                SamplingParams {
                    $( $name: $default, )*
                    top_k: 0,
                    logit_bias: Arc::from(Vec::new()),
                    seed: 0,
                    logprobs: 0,
                }
            }
        }

        /// Values a request sets for the scalar parameters; `None` keeps the
        /// base value (the model's default). The server's and the CLI's
        /// fields of the same names are read into it.
        #[derive(Debug, Clone, Copy, Default, PartialEq)]
        pub struct SamplingOverrides {
            $( $(#[doc = $doc])* pub $name: Option<f32>, )*
        }

        impl SamplingOverrides {
            /// Writes the values that are set into `p`.
            pub fn apply(&self, p: &mut SamplingParams) {
                $( if let Some(v) = self.$name { p.$name = v; } )*
            }
        }

        impl SamplingParams {
            /// The first scalar parameter outside its range.
            fn check_ranges(&self) -> Result<(), ParamError> {
                $(
                    let range: ValidRange = $range;
                    if !range.contains(self.$name) {
                        return Err(ParamError {
                            param: stringify!($name),
                            reason: format!("must be {range}, got {}", self.$name),
                        });
                    }
                )*
                Ok(())
            }
        }
    };
}

sampling_params!(define_sampling_params);

/// Most top log-probabilities a request may ask for.
pub const MAX_LOGPROBS: usize = 20;

/// An out-of-range sampling parameter; names the parameter and the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid `{param}`: {reason}")]
pub struct ParamError {
    pub param: &'static str,
    pub reason: String,
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// True when a penalty needs the token history (repetition, presence
    /// or frequency); the engine keeps a [`crate::PenaltyHistory`] then.
    pub fn needs_history(&self) -> bool {
        self.repetition_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
    }

    /// True when the result is the argmax: temperature 0 (or, for
    /// parameters that skipped [`SamplingParams::validate`], not a positive
    /// finite number). The one definition every backend follows.
    pub fn is_greedy(&self) -> bool {
        is_greedy_temperature(self.temperature)
    }

    /// Checks every field's range; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ParamError> {
        self.check_ranges()?;
        let err = |param, reason: String| Err(ParamError { param, reason });
        if let Some(&(id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(b))
        {
            return err(
                "logit_bias",
                format!(
                    "the bias of token {id} must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {b}"
                ),
            );
        }
        if let Some(w) = self.logit_bias.windows(2).find(|w| w[1].0 <= w[0].0) {
            return err(
                "logit_bias",
                format!(
                    "token ids must be ascending and distinct, got {} then {}",
                    w[0].0, w[1].0
                ),
            );
        }
        if self.logprobs > MAX_LOGPROBS {
            return err(
                "logprobs",
                format!("at most {MAX_LOGPROBS} alternatives, got {}", self.logprobs),
            );
        }
        Ok(())
    }
}

/// The seed of choice `index` of a request seeded with `seed` (`n > 1`,
/// `best_of`): `seed` itself for choice 0, otherwise
/// `splitmix64(seed ^ splitmix64(CHOICE_STREAM ^ index))`, a counter-based
/// stream of its own, so choice `i` of `n` equals a single-choice request
/// with that seed.
pub const fn choice_seed(seed: u64, index: u64) -> u64 {
    if index == 0 {
        seed
    } else {
        splitmix64(seed ^ splitmix64(CHOICE_STREAM ^ index))
    }
}

/// Tag of the choice-seed stream (`"choices"` in ASCII), keeping it apart from
/// the per-token draws of [`uniform`].
pub const CHOICE_STREAM: u64 = 0x0063_686f_6963_6573;

/// SplitMix64 finaliser: a bijective 64-bit mix.
pub const fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The counter-based uniform draw in `[0, 1)` for token `step` of a request
/// seeded with `seed`: 24 random bits, exactly representable in f32, so the
/// CUDA sampler computes the identical value.
pub fn uniform(seed: u64, step: u64) -> f32 {
    let bits = splitmix64(seed ^ splitmix64(step)) >> 40;
    bits as f32 / (1u32 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_parameter() {
        let p = SamplingParams {
            top_p: 1.5,
            ..SamplingParams::default()
        };
        let e = p.validate().unwrap_err();
        assert_eq!(e.param, "top_p");
        assert!(e.to_string().contains("1.5"));
        assert!(
            SamplingParams {
                temperature: -0.1,
                ..Default::default()
            }
            .validate()
            .is_err()
        );
        assert!(SamplingParams::greedy().validate().is_ok());
        // absurd temperatures are refused
        for t in [1e8f32, f32::INFINITY, f32::NAN, MAX_TEMPERATURE * 1.01] {
            let e = SamplingParams {
                temperature: t,
                ..Default::default()
            }
            .validate()
            .unwrap_err();
            assert_eq!(e.param, "temperature", "{t}");
        }
        let hot = SamplingParams {
            temperature: MAX_TEMPERATURE,
            ..Default::default()
        };
        assert!(hot.validate().is_ok());
    }

    #[test]
    fn penalties_and_bias_are_range_checked() {
        for (p, name) in [
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: f32::NAN,
                    ..Default::default()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    logit_bias: Arc::from(vec![(3, 100.5)]),
                    ..Default::default()
                },
                "logit_bias",
            ),
            (
                SamplingParams {
                    logit_bias: Arc::from(vec![(3, 1.0), (3, 2.0)]),
                    ..Default::default()
                },
                "logit_bias",
            ),
        ] {
            assert_eq!(p.validate().unwrap_err().param, name);
        }
        let ok = SamplingParams {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logit_bias: Arc::from(vec![(1, -100.0), (7, 100.0)]),
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
        assert!(ok.needs_history());
        assert!(!SamplingParams::default().needs_history());
    }

    #[test]
    fn choice_seeds_keep_choice_zero_and_differ() {
        assert_eq!(choice_seed(42, 0), 42);
        let seeds: std::collections::HashSet<u64> = (0..100).map(|i| choice_seed(42, i)).collect();
        assert_eq!(seeds.len(), 100);
        assert_ne!(choice_seed(42, 1), choice_seed(43, 1));
        // the documented formula (the HTTP tests recompute it in Python)
        assert_eq!(
            choice_seed(7, 2),
            splitmix64(7 ^ splitmix64(CHOICE_STREAM ^ 2))
        );
    }

    #[test]
    fn uniform_is_deterministic_and_in_range() {
        let mut seen = std::collections::HashSet::new();
        for step in 0..1000 {
            let u = uniform(42, step);
            assert!((0.0..1.0).contains(&u));
            assert_eq!(u, uniform(42, step));
            seen.insert(u.to_bits());
        }
        assert!(seen.len() > 990);
        assert_ne!(uniform(1, 0), uniform(2, 0));
    }
}
