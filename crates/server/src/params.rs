//! Range checks of the sampling and stopping parameters shared by chat and
//! text completions, and the engine request built from them.
//!
//! Only what is OpenAI-specific is checked here: combinations
//! (`n` / `best_of`, `stream_options`), OpenAI's encodings (`top_k` -1,
//! negative seeds, `logit_bias` keys as strings) and limits named by the
//! client's field names (`logprobs` / `top_logprobs`, `stop`). Value
//! ranges of the sampling parameters, `max_tokens` (at least 1, within the
//! context) and token ids against the vocabulary are validated once, by
//! `engine::Engine::submit`, whose `SubmitError` the handlers map to the
//! same 400 naming the client's field (`error::from_submit`:
//! `max_tokens` / `max_completion_tokens`, `prompt` / `messages`).
//!
//! Every error is a 400 naming the parameter. Absent sampling fields take
//! the model's `generation_config.json` values (neutral values for those it
//! leaves out), or llama.cpp's defaults when it ships none
//! (`GenerationConfig::sampling_defaults`); an absent `max_tokens` means "up to
//! the rest of the context, at most the server's default cap"
//! ([`DEFAULT_MAX_TOKENS`], `lamina serve --max-tokens-default`), so a
//! reply that never reaches an end-of-sequence token stays bounded; an
//! absent `seed` is drawn per request.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use contract::{GenerationConfig, SamplingParams, sampling::MAX_LOGPROBS};
use engine::GenerateRequest;

use crate::error::ApiError;
use crate::protocol::CommonFields;

/// Tokens a reply may have when the request gives no `max_tokens`, unless
/// the rest of the context is less (`ServerConfig::default_max_tokens`).
pub const DEFAULT_MAX_TOKENS: usize = 4096;

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Most choices (`n`, `best_of`) a request may ask for (OpenAI's limit).
pub const MAX_CHOICES: usize = 128;
/// Most `logit_bias` entries (OpenAI's limit).
pub const MAX_LOGIT_BIAS: usize = 300;

/// The checked parameters of a request, before its prompt is known.
#[derive(Debug, Clone)]
pub struct Checked {
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    /// Which name the client used for `max_tokens`.
    pub max_tokens_param: &'static str,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// May be decoded speculatively (the `speculative` extension, default on).
    pub speculative: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// Choices returned.
    pub n: usize,
    /// Choices generated (`best_of`, at least `n`); the best `n` by mean
    /// token log-probability are returned.
    pub best_of: usize,
    /// The LoRA adapter `model` names (`None`: the base model).
    pub lora: Option<String>,
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
    let choices = |param: &str, v: Option<i64>| -> Result<Option<usize>, ApiError> {
        match v {
            None => Ok(None),
            Some(k) if k < 1 || k > MAX_CHOICES as i64 => Err(bad(
                param,
                format!("`{param}` must be in [1, {MAX_CHOICES}], got {k}."),
            )),
            Some(k) => Ok(Some(k as usize)),
        }
    };
    let n = choices("n", c.n)?.unwrap_or(1);
    let best_of = choices("best_of", c.best_of)?.unwrap_or(n);
    if best_of < n {
        return Err(bad(
            "best_of",
            format!("`best_of` ({best_of}) must be at least `n` ({n})."),
        ));
    }
    if best_of > n && c.stream {
        return Err(bad(
            "best_of",
            "`best_of` greater than `n` cannot be streamed (the best choices are known only at the end)."
                .into(),
        ));
    }
    // its limits (at least 1, within the context) are the engine's check;
    // `error::from_submit` names the client's field
    let max_tokens = c
        .max_tokens
        .map(|m| usize::try_from(m).unwrap_or(usize::MAX));
    let logit_bias = logit_bias(c.logit_bias.as_ref())?;
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
    let mut sampling = SamplingParams {
        top_k,
        logit_bias,
        // negative seeds are accepted, as OpenAI does, by their two's complement
        seed: c.seed.map(|s| s as u64).unwrap_or_else(fresh_seed),
        logprobs,
        ..fallback.params()
    };
    c.sampling.apply(&mut sampling);
    // ranges (temperature, top_p, min_p, repetition_penalty, a
    // generation_config default out of range) are checked once, by
    // `Engine::submit`; `error::from_submit` names the parameter
    Ok(Checked {
        sampling,
        max_tokens,
        max_tokens_param,
        stop,
        stop_token_ids: c.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: c.ignore_eos,
        speculative: c.speculative.unwrap_or(true),
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        n,
        best_of,
        lora: None,
    })
}

/// `logit_bias` (`{"token id": bias}`) as ascending distinct `(id, bias)`
/// pairs; a key that is not a token id is a 400 naming it. Bias ranges and
/// ids past the vocabulary are the engine's checks (`SamplingParams::validate`).
fn logit_bias(map: Option<&HashMap<String, f32>>) -> Result<Arc<[(u32, f32)]>, ApiError> {
    let Some(map) = map else {
        return Ok(Arc::from(Vec::new()));
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(bad(
            "logit_bias",
            format!(
                "At most {MAX_LOGIT_BIAS} entries are allowed, got {}.",
                map.len()
            ),
        ));
    }
    let mut v = Vec::with_capacity(map.len());
    for (k, &b) in map {
        let Ok(id) = k.trim().parse::<u32>() else {
            return Err(bad(
                "logit_bias",
                format!("Keys of `logit_bias` must be token ids, got `{k}`."),
            ));
        };
        v.push((id, b));
    }
    v.sort_by_key(|&(id, _)| id);
    if let Some(w) = v.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(bad(
            "logit_bias",
            format!("Token id {} is given twice in `logit_bias`.", w[0].0),
        ));
    }
    Ok(Arc::from(v))
}

impl Checked {
    /// The engine request for `prompt`; an absent `max_tokens` is the rest
    /// of the context, at most `default_cap` (0 when the prompt fills the
    /// context: the engine then refuses the prompt as too long). The limits
    /// are checked by `Engine::submit`.
    pub fn request(
        &self,
        prompt: Vec<u32>,
        max_context: usize,
        default_cap: usize,
    ) -> GenerateRequest {
        let max_tokens = self.max_tokens.unwrap_or_else(|| {
            max_context
                .saturating_sub(prompt.len())
                .min(default_cap.max(1))
        });
        GenerateRequest {
            prompt,
            sampling: self.sampling.clone(),
            max_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            stop_token_ids: self.stop_token_ids.clone(),
            constraint: None,
            speculative: self.speculative,
            lora: self.lora.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Stop;
    use contract::SamplingOverrides;

    fn run(c: CommonFields) -> Result<Checked, ApiError> {
        check(&c, 0, "max_tokens", &GenerationConfig::default())
    }

    #[test]
    fn speculative_decoding_is_on_unless_the_request_opts_out() {
        let on = run(CommonFields::default()).unwrap();
        assert!(on.request(vec![1], 16, 16).speculative);
        let off = run(CommonFields {
            speculative: Some(false),
            ..Default::default()
        })
        .unwrap();
        assert!(!off.request(vec![1], 16, 16).speculative);
        let body = r#"{"prompt": "x", "speculative": false}"#;
        let r: crate::protocol::CompletionRequest = serde_json::from_str(body).unwrap();
        assert_eq!(r.common().speculative, Some(false));
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
                    n: Some(129),
                    ..Default::default()
                },
                "n",
            ),
            (
                CommonFields {
                    n: Some(0),
                    ..Default::default()
                },
                "n",
            ),
            (
                CommonFields {
                    n: Some(3),
                    best_of: Some(2),
                    ..Default::default()
                },
                "best_of",
            ),
            (
                CommonFields {
                    best_of: Some(2),
                    stream: true,
                    ..Default::default()
                },
                "best_of",
            ),
            (
                CommonFields {
                    logit_bias: Some([("x".to_string(), 1.0)].into()),
                    ..Default::default()
                },
                "logit_bias",
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
    fn penalties_bias_and_choices_pass_through() {
        let c = run(CommonFields {
            sampling: SamplingOverrides {
                presence_penalty: Some(0.5),
                frequency_penalty: Some(-1.0),
                ..Default::default()
            },
            logit_bias: Some([("7".to_string(), -100.0), ("3".to_string(), 5.0)].into()),
            n: Some(3),
            stop_token_ids: Some(vec![9]),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.sampling.presence_penalty, 0.5);
        assert_eq!(c.sampling.frequency_penalty, -1.0);
        assert_eq!(&c.sampling.logit_bias[..], &[(3, 5.0), (7, -100.0)]);
        assert_eq!((c.n, c.best_of), (3, 3));
        assert_eq!(c.stop_token_ids, vec![9]);
    }

    #[test]
    fn defaults_come_from_generation_config() {
        let defaults = GenerationConfig {
            temperature: Some(0.3),
            top_p: Some(0.9),
            top_k: Some(40),
            repetition_penalty: Some(1.1),
            ..Default::default()
        };
        let c = check(&CommonFields::default(), 0, "max_tokens", &defaults).unwrap();
        assert_eq!(c.sampling.repetition_penalty, 1.1);
        assert_eq!(c.sampling.temperature, 0.3);
        assert_eq!(c.sampling.top_p, 0.9);
        assert_eq!(c.sampling.top_k, 40);
        let c = check(
            &CommonFields {
                sampling: SamplingOverrides {
                    temperature: Some(0.0),
                    ..Default::default()
                },
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
    fn an_absent_max_tokens_is_the_rest_of_the_context() {
        let c = run(CommonFields {
            max_tokens: Some(10),
            ..Default::default()
        })
        .unwrap();
        // the limit is the engine's: passed through as given
        assert_eq!(c.request(vec![1; 95], 100, 4096).max_tokens, 10);
        let open = run(CommonFields::default()).unwrap();
        assert_eq!(open.request(vec![1; 30], 100, 4096).max_tokens, 70);
        assert_eq!(open.request(vec![1; 100], 100, 4096).max_tokens, 0);
    }

    /// A request without `max_tokens` on a long context stops at the
    /// server's cap; one that asks for more than the cap gets it (the
    /// context limit stays the engine's check).
    #[test]
    fn an_absent_max_tokens_stops_at_the_default_cap() {
        let open = run(CommonFields::default()).unwrap();
        let r = open.request(vec![1; 10], 131_072, DEFAULT_MAX_TOKENS);
        assert_eq!(r.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(open.request(vec![1; 10], 131_072, 64).max_tokens, 64);
        let asks = run(CommonFields {
            max_tokens: Some(10_000),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(asks.request(vec![1; 10], 131_072, 64).max_tokens, 10_000);
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
