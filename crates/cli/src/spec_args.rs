//! The speculative decoding flags every engine-building command shares
//! (`serve`, `generate`, `bench`, ...), turned into the engine's
//! [`SpecConfig`]. A bad value is refused at start naming the flag.

use anyhow::{Result, bail};
use contract::backend::MAX_DRAFTS;
use engine::speculate::DraftModel;
use engine::speculate::{CPU_SPEC_MAX_BATCH, DEFAULT_SPEC_MAX_BATCH};
use engine::{SpecConfig, SpecMethod};

/// Speculative decoding flags.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpecArgs {
    /// Speculative decoding: draft tokens and verify them in the step, the
    /// same output in fewer steps. `ngram` (prompt lookup: continue an
    /// earlier occurrence of the last tokens), `suffix` (the most frequent
    /// continuation over this and recent requests' tokens), `draft:MODEL`
    /// (a smaller model with the target's tokenizer, a store name or a
    /// directory, decoding greedily ahead; on CUDA beside the target on its
    /// GPU). Off by default.
    #[arg(long, env = "LAMINA_SPECULATIVE")]
    pub speculative: Option<String>,
    /// Most tokens drafted per sequence and step with --speculative (each
    /// sequence adapts its own from its acceptance).
    #[arg(long, default_value_t = 4, env = "LAMINA_NUM_SPECULATIVE_TOKENS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_DRAFTS as u64))]
    pub num_speculative_tokens: usize,
    /// Steps with more running sequences than this draft nothing (a large
    /// batch keeps the device busy without drafts) [default: 32 on CUDA, 1
    /// on the CPU].
    #[arg(long, env = "LAMINA_SPECULATIVE_MAX_BATCH")]
    pub speculative_max_batch: Option<usize>,
}

impl SpecArgs {
    /// The draft model `draft:MODEL` names (`None`: another method, none,
    /// or an empty name).
    pub fn draft_model(&self) -> Option<&str> {
        let model = self.speculative.as_deref()?.strip_prefix("draft:")?;
        (!model.is_empty()).then_some(model)
    }

    /// The engine's setting for a CUDA (`cuda`) or CPU backend (`None`:
    /// off); an error naming the flag for an unknown method. A draft
    /// model's backend is not loaded here (`crate::draft_model` opens it
    /// beside each replica's backend).
    pub fn config(&self, cuda: bool) -> Result<Option<SpecConfig>> {
        let Some(name) = self.speculative.as_deref() else {
            return Ok(None);
        };
        let method = match name {
            "ngram" => SpecMethod::Ngram,
            "suffix" => SpecMethod::Suffix,
            d if d.starts_with("draft:") => match self.draft_model() {
                Some(model) => SpecMethod::Draft(DraftModel::named(model)),
                None => bail!("invalid `--speculative {d}`: name the draft model after `draft:`"),
            },
            other => {
                bail!(
                    "invalid `--speculative {other}`: expected `ngram`, `suffix` or `draft:MODEL`"
                )
            }
        };
        Ok(Some(SpecConfig {
            method,
            num_tokens: self.num_speculative_tokens,
            max_batch: self.speculative_max_batch.unwrap_or(match cuda {
                true => DEFAULT_SPEC_MAX_BATCH,
                false => CPU_SPEC_MAX_BATCH,
            }),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn parse(args: &[&str]) -> Result<Option<SpecConfig>, String> {
        let cli = Cli::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.spec.config(true).map_err(|e| e.to_string())
    }

    #[test]
    fn methods_and_draft_lengths() {
        assert_eq!(parse(&[]), Ok(None));
        let c = parse(&["--speculative", "suffix", "--num-speculative-tokens", "7"])
            .unwrap()
            .unwrap();
        assert_eq!((c.method, c.num_tokens), (SpecMethod::Suffix, 7));
        assert_eq!(
            parse(&["--speculative", "ngram"])
                .unwrap()
                .unwrap()
                .num_tokens,
            4
        );
    }

    #[test]
    fn the_draft_cut_off_defaults_by_device_and_a_flag_overrides_it() {
        let cli = Cli::try_parse_from(["t", "--speculative", "ngram"]).unwrap();
        let max = |cuda| cli.spec.config(cuda).unwrap().unwrap().max_batch;
        assert_eq!(
            (max(true), max(false)),
            (DEFAULT_SPEC_MAX_BATCH, CPU_SPEC_MAX_BATCH)
        );
        let cli = Cli::try_parse_from([
            "t",
            "--speculative",
            "ngram",
            "--speculative-max-batch",
            "7",
        ])
        .unwrap();
        assert_eq!(cli.spec.config(false).unwrap().unwrap().max_batch, 7);
        assert_eq!(cli.spec.config(true).unwrap().unwrap().max_batch, 7);
    }

    #[test]
    fn bad_values_name_the_flag() {
        for k in ["0", "17"] {
            let e = parse(&["--speculative", "ngram", "--num-speculative-tokens", k]).unwrap_err();
            assert!(e.contains("--num-speculative-tokens"), "{e}");
        }
        let e = parse(&["--speculative", "eagle"]).unwrap_err();
        assert!(e.contains("--speculative eagle"), "{e}");
        let e = parse(&["--speculative", "draft:"]).unwrap_err();
        assert!(e.contains("--speculative draft:"), "{e}");
        let c = parse(&["--speculative", "draft:smollm2-135m"])
            .unwrap()
            .unwrap();
        assert_eq!(c.method.name(), "draft");
    }
}
