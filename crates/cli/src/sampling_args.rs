//! Sampling and stopping options shared by `generate`, `chat` and `bench`, and
//! their conversion to an engine request.
//!
//! A flag left out takes the model's `generation_config.json` value (neutral
//! values for the ones it leaves out); a model that ships no sampling values
//! gets llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p
//! 0.05): see `GenerationConfig::sampling_defaults`. An absent seed is drawn
//! from the clock.

use anyhow::{Result, bail};
use contract::sampling::ValidRange;
use contract::{GenerationConfig, ParamError, SamplingOverrides, SamplingParams};
use engine::{GenerateRequest, SubmitError};

macro_rules! sampling_flags {
    (
        {}
        $( $(#[doc = $doc:literal])* $name:ident : f32 = $default:literal, $range:expr $(, $kernel:ident)? ; )*
    ) => {
        /// The scalar sampling flags, one per `contract::sampling_params!`
        /// entry; left out, the model's default.
        #[derive(clap::Args, Clone, Debug, Default)]
        pub struct SamplingFlags {
            $(
                #[arg(long, allow_hyphen_values = true,
                      help = flag_help(concat!($($doc),*), $range, $default))]
                pub $name: Option<f32>,
            )*
        }

        impl SamplingFlags {
            /// The values given on the command line.
            pub fn overrides(&self) -> SamplingOverrides {
                SamplingOverrides { $( $name: self.$name, )* }
            }
        }
    };
}

contract::sampling_params!(sampling_flags);

/// A flag's help: its doc, its range and the value that turns it off.
fn flag_help(doc: &str, range: ValidRange, default: f32) -> String {
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{doc} Valid: {range}; neutral value {default}.")
}

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Most tokens to generate (llama.cpp's `-n`).
    #[arg(long, short = 'n', visible_alias = "n-predict", default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub scalars: SamplingFlags,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Report the top-K log-probabilities of each generated token.
    #[arg(long)]
    pub logprobs: Option<usize>,
    /// Stop when this text is generated (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The sampling parameters, validated; errors name the flag.
    pub fn params(&self, defaults: &GenerationConfig) -> Result<SamplingParams> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        });
        let d = defaults.sampling_defaults();
        let mut p = SamplingParams {
            top_k: self.top_k.unwrap_or(d.top_k),
            seed,
            logprobs: self.logprobs.unwrap_or(0),
            ..d.params()
        };
        self.scalars.overrides().apply(&mut p);
        if let Err(e) = p.validate() {
            return Err(param_error(e));
        }
        Ok(p)
    }

    /// One line naming the sampling settings in effect and where the ones
    /// not given on the command line come from.
    pub fn describe(&self, defaults: &GenerationConfig) -> String {
        let d = defaults.sampling_defaults();
        let f = &self.scalars;
        let flags = [
            f.temperature.is_some(),
            self.top_k.is_some(),
            f.top_p.is_some(),
            f.min_p.is_some(),
        ];
        let from = if flags.iter().all(|&f| f) {
            "all from the command line".to_string()
        } else {
            d.to_string()
                .split_once('(')
                .map(|(_, src)| src.trim_end_matches(')').to_string())
                .unwrap_or_default()
        };
        let mut p = d.params();
        f.overrides().apply(&mut p);
        format!(
            "sampling: temperature {}, top-k {}, top-p {}, min-p {}, repetition penalty {} ({from})",
            p.temperature,
            self.top_k.unwrap_or(d.top_k),
            p.top_p,
            p.min_p,
            p.repetition_penalty,
        )
    }

    /// An engine request for `prompt`; its limits (`--max-tokens` at least
    /// 1 and within the context, token ids) are the engine's check at
    /// submit ([`submit_error`] names the flag).
    pub fn request(
        &self,
        prompt: Vec<u32>,
        defaults: &GenerationConfig,
    ) -> Result<GenerateRequest> {
        if self.stop.iter().any(String::is_empty) {
            bail!("invalid `--stop`: a stop string must not be empty");
        }
        Ok(GenerateRequest {
            prompt,
            sampling: self.params(defaults)?,
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            stop_token_ids: Vec::new(),
            constraint: None,
            speculative: true,
            lora: None,
        })
    }
}

/// A parameter error under the flag's name (`max_tokens` -> `--max-tokens`).
fn param_error(e: ParamError) -> anyhow::Error {
    anyhow::anyhow!("invalid `--{}`: {}", e.param.replace('_', "-"), e.reason)
}

/// An engine refusal at submit, naming the flag a parameter error is about.
pub fn submit_error(e: SubmitError) -> anyhow::Error {
    match e {
        SubmitError::InvalidParams(p) => param_error(p),
        e => e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        s: SamplingArgs,
    }

    #[test]
    fn empty_stop_strings_are_refused_like_the_server_does() {
        let defaults = GenerationConfig::default();
        let cmd = Cmd::try_parse_from(["t", "--stop", "x", "--stop", ""]).unwrap();
        let e = cmd.s.request(vec![1], &defaults).unwrap_err().to_string();
        assert!(e.contains("--stop") && e.contains("empty"), "{e}");
        let cmd = Cmd::try_parse_from(["t", "--stop", "x"]).unwrap();
        assert!(cmd.s.request(vec![1], &defaults).is_ok());
    }

    #[test]
    fn flags_override_the_model_defaults_and_the_rest_are_named() {
        let none = GenerationConfig::default();
        let cmd = Cmd::try_parse_from(["t", "--temperature", "0.5"]).unwrap();
        let p = cmd.s.params(&none).unwrap();
        assert_eq!(
            (p.temperature, p.top_k, p.top_p, p.min_p),
            (0.5, 40, 0.95, 0.05)
        );
        let line = cmd.s.describe(&none);
        assert!(
            line.contains("temperature 0.5") && line.contains("min-p 0.05"),
            "{line}"
        );
        assert!(line.contains("llama.cpp"), "{line}");
        let cmd = Cmd::try_parse_from(["t", "--min-p", "1.5"]).unwrap();
        let e = cmd.s.params(&none).unwrap_err().to_string();
        assert!(e.contains("--min-p"), "{e}");
    }
}
