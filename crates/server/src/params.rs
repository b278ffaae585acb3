//! Range checks of the sampling and stopping parameters shared by chat and
//! text completions, and the engine request built from them.
//!
//! Only what is OpenAI-specific is checked here: unsupported fields and
//! combinations (`n`, presence/frequency penalties, `stream_options`),
//! OpenAI's encodings (`top_k` -1, negative seeds) and limits named by the
//! client's field names (`max_tokens` / `max_completion_tokens`,
//! `logprobs` / `top_logprobs`, `stop`, the context length against the
//! prompt's field). Value ranges of the sampling parameters are validated
//! once, by `engine::Engine::submit`, whose `SubmitError` the handlers map
//! to the same 400 naming the parameter (`error::from_submit`).
//!
//! Every error is a 400 naming the parameter. Absent sampling fields take
//! the model's `generation_config.json` values (neutral values for those it
//! leaves out), or llama.cpp's defaults when it ships none
//! (`GenerationConfig::sampling_defaults`); an absent `max_tokens` means "up to
//! the context"; an absent `seed` is drawn per request.

use std::sync::atomic::{AtomicU64, Ordering};

use contract::{GenerationConfig, SamplingParams, sampling::MAX_LOGPROBS};
use engine::GenerateRequest;

use crate::error::ApiError;
use crate::protocol::CommonFields;

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;

/// The checked parameters of a request, before its prompt is known.
#[derive(Debug, Clone)]
pub struct Checked {
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    /// Which name the client used for `max_tokens`.
    pub max_tokens_param: &'static str,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
}

fn bad(param: &str, msg: String) -> ApiError {
    ApiError::invalid_param(param, msg)
}

/// A seed for a request that gave none: distinct per request and per run.
fn fresh_seed() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    contract::sampling::splitmix64(nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).rotate_left(32))
}

/// Checks the shared fields; `logprobs` is the number of top alternatives asked for.
pub fn check(
    c: &CommonFields,
    logprobs: usize,
    max_tokens_param: &'static str,
    defaults: &GenerationConfig,
) -> Result<Checked, ApiError> {
    if let Some(n) = c.n
        && n != 1
    {
        return Err(bad("n", format!("Only n=1 is supported, got {n}.")));
    }
    let max_tokens = match c.max_tokens {
        None => None,
        Some(m) if m < 1 => {
            return Err(bad(
                max_tokens_param,
                format!("`{max_tokens_param}` must be at least 1, got {m}."),
            ));
        }
        Some(m) => Some(usize::try_from(m).unwrap_or(usize::MAX)),
    };
    for (param, v) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        if let Some(x) = v
            && x != 0.0
        {
            return Err(bad(
                param,
                format!(
                    "`{param}` is not supported by this server (got {x}); use `repetition_penalty`."
                ),
            ));
        }
    }
    let fallback = defaults.sampling_defaults();
    let top_k = match c.top_k {
        None => fallback.top_k,
        Some(-1) | Some(0) => 0,
        Some(k) if k < -1 => {
            return Err(bad(
                "top_k",
                format!("`top_k` must be >= 1, or 0 / -1 to disable, got {k}."),
            ));
        }
        Some(k) => usize::try_from(k).unwrap_or(usize::MAX),
    };
    let stop = c.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(bad(
            "stop",
            format!(
                "At most {MAX_STOP} stop sequences are allowed, got {}.",
                stop.len()
            ),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(bad("stop", "Stop sequences must not be empty.".into()));
    }
    if c.stream_options.is_some() && !c.stream {
        return Err(bad(
            "stream_options",
            "`stream_options` is only allowed when `stream` is true.".into(),
        ));
    }
    if logprobs > MAX_LOGPROBS {
        return Err(bad(
            "logprobs",
            format!("At most {MAX_LOGPROBS} log-probabilities per token, got {logprobs}."),
        ));
    }
    let sampling = SamplingParams {
        temperature: c.temperature.unwrap_or(fallback.temperature),
        top_k,
        top_p: c.top_p.unwrap_or(fallback.top_p),
        min_p: c.min_p.unwrap_or(fallback.min_p),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        // negative seeds are accepted, as OpenAI does, by their two's complement
        seed: c.seed.map(|s| s as u64).unwrap_or_else(fresh_seed),
        logprobs,
    };
    // ranges (temperature, top_p, min_p, repetition_penalty, a
    // generation_config default out of range) are checked once, by
    // `Engine::submit`; `error::from_submit` names the parameter
    Ok(Checked {
        sampling,
        max_tokens,
        max_tokens_param,
        stop,
        ignore_eos: c.ignore_eos,
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
    })
}

impl Checked {
    /// The engine request for `prompt`, checked against the context length;
    /// `prompt_param` (`messages` / `prompt`) is named when the prompt alone is too long.
    pub fn request(
        &self,
        prompt: Vec<u32>,
        max_context: usize,
        prompt_param: &str,
    ) -> Result<GenerateRequest, ApiError> {
        let n = prompt.len();
        // an empty prompt is the engine's refusal (`SubmitError::EmptyPrompt`)
        if n >= max_context {
            return Err(ApiError::context_length(
                prompt_param,
                format!(
                    "This model's maximum context length is {max_context} tokens. However, your \
                     prompt has {n} tokens, leaving no room for a completion."
                ),
            ));
        }
        let max_tokens = match self.max_tokens {
            None => max_context - n,
            Some(m) if n.saturating_add(m) > max_context => {
                return Err(ApiError::context_length(
                    self.max_tokens_param,
                    format!(
                        "This model's maximum context length is {max_context} tokens. However, you \
                         requested {} tokens ({n} in the {prompt_param}, {m} in the completion). \
                         Please reduce the length of the {prompt_param} or completion.",
                        n.saturating_add(m)
                    ),
                ));
            }
            Some(m) => m,
        };
        Ok(GenerateRequest {
            prompt,
            sampling: self.sampling.clone(),
            max_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Stop;

    fn run(c: CommonFields) -> Result<Checked, ApiError> {
        check(&c, 0, "max_tokens", &GenerationConfig::default())
    }

    #[test]
    fn each_out_of_range_value_names_its_parameter() {
        // sampling ranges are the engine's (see crates/server/tests/http/errors.rs)
        let cases: Vec<(CommonFields, &str)> = vec![
            (
                CommonFields {
                    top_k: Some(-2),
                    ..Default::default()
                },
                "top_k",
            ),
            (
                CommonFields {
                    max_tokens: Some(0),
                    ..Default::default()
                },
                "max_tokens",
            ),
            (
                CommonFields {
                    n: Some(2),
                    ..Default::default()
                },
                "n",
            ),
            (
                CommonFields {
                    presence_penalty: Some(1.0),
                    ..Default::default()
                },
                "presence_penalty",
            ),
            (
                CommonFields {
                    stop: Some(Stop::Many(vec!["a".into(); 5])),
                    ..Default::default()
                },
                "stop",
            ),
            (
                CommonFields {
                    stream_options: Some(Default::default()),
                    ..Default::default()
                },
                "stream_options",
            ),
        ];
        for (c, param) in cases {
            let e = run(c).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        }
        let e = check(
            &CommonFields::default(),
            21,
            "max_tokens",
            &GenerationConfig::default(),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
    }

    #[test]
    fn defaults_come_from_generation_config() {
        let defaults = GenerationConfig {
            temperature: Some(0.3),
            top_p: Some(0.9),
            top_k: Some(40),
            ..Default::default()
        };
        let c = check(&CommonFields::default(), 0, "max_tokens", &defaults).unwrap();
        assert_eq!(c.sampling.temperature, 0.3);
        assert_eq!(c.sampling.top_p, 0.9);
        assert_eq!(c.sampling.top_k, 40);
        let c = check(
            &CommonFields {
                temperature: Some(0.0),
                top_k: Some(-1),
                ..Default::default()
            },
            0,
            "max_tokens",
            &defaults,
        )
        .unwrap();
        assert!(c.sampling.is_greedy());
        assert_eq!(c.sampling.top_k, 0);
        // a model that ships no sampling values: llama.cpp's defaults
        let c = run(CommonFields::default()).unwrap();
        let s = &c.sampling;
        assert_eq!(
            (s.temperature, s.top_k, s.top_p, s.min_p),
            (0.8, 40, 0.95, 0.05)
        );
    }

    #[test]
    fn context_limit_is_checked() {
        let c = run(CommonFields {
            max_tokens: Some(10),
            ..Default::default()
        })
        .unwrap();
        let e = c.request(vec![1; 95], 100, "prompt").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(e.code, Some("context_length_exceeded"));
        let e = c.request(vec![1; 100], 100, "prompt").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"));
        assert_eq!(
            c.request(vec![1; 90], 100, "prompt").unwrap().max_tokens,
            10
        );
        let open = run(CommonFields::default()).unwrap();
        assert_eq!(
            open.request(vec![1; 30], 100, "prompt").unwrap().max_tokens,
            70
        );
    }

    #[test]
    fn seeds_are_kept_or_drawn() {
        let a = run(CommonFields {
            seed: Some(-1),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(a.sampling.seed, u64::MAX);
        let b = run(CommonFields::default()).unwrap();
        let c = run(CommonFields::default()).unwrap();
        assert_ne!(b.sampling.seed, c.sampling.seed);
    }
}
