//! Sampling and stopping options shared by `generate`, `chat` and `bench`, and
//! their conversion to an engine request.
//!
//! A flag left out takes the model's `generation_config.json` value (neutral
//! values for the ones it leaves out); a model that ships no sampling values
//! gets llama.cpp's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p
//! 0.05): see `GenerationConfig::sampling_defaults`. An absent seed is drawn
//! from the clock.

use anyhow::{Result, bail};
use contract::{GenerationConfig, SamplingParams};
use engine::GenerateRequest;

#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Most tokens to generate (llama.cpp's `-n`).
    #[arg(long, short = 'n', visible_alias = "n-predict", default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass, in (0, 1].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Drop tokens below this fraction of the top probability (0 = off).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Penalise tokens already seen (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// Subtract this from every token already generated (OpenAI's
    /// presence penalty, in [-2, 2]; 0 = off).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub presence_penalty: f32,
    /// Subtract this per occurrence from every generated token (OpenAI's
    /// frequency penalty, in [-2, 2]; 0 = off).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub frequency_penalty: f32,
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
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed,
            logprobs: self.logprobs.unwrap_or(0),
            ..SamplingParams::default()
        };
        if let Err(e) = p.validate() {
            bail!("invalid `--{}`: {}", e.param.replace('_', "-"), e.reason);
        }
        Ok(p)
    }

    /// One line naming the sampling settings in effect and where the ones
    /// not given on the command line come from.
    pub fn describe(&self, defaults: &GenerationConfig) -> String {
        let d = defaults.sampling_defaults();
        let flags = [
            self.temperature.is_some(),
            self.top_k.is_some(),
            self.top_p.is_some(),
            self.min_p.is_some(),
        ];
        let from = if flags.iter().all(|&f| f) {
            "all from the command line".to_string()
        } else {
            d.to_string()
                .split_once('(')
                .map(|(_, src)| src.trim_end_matches(')').to_string())
                .unwrap_or_default()
        };
        format!(
            "sampling: temperature {}, top-k {}, top-p {}, min-p {}, repetition penalty {} ({from})",
            self.temperature.unwrap_or(d.temperature),
            self.top_k.unwrap_or(d.top_k),
            self.top_p.unwrap_or(d.top_p),
            self.min_p.unwrap_or(d.min_p),
            self.repetition_penalty,
        )
    }

    /// An engine request for `prompt`.
    pub fn request(
        &self,
        prompt: Vec<u32>,
        defaults: &GenerationConfig,
    ) -> Result<GenerateRequest> {
        if self.max_tokens == 0 {
            bail!("invalid `--max-tokens`: must be at least 1");
        }
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
        })
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
