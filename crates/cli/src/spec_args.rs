//! The speculative decoding flags every engine-building command shares
//! (`serve`, `generate`, `bench`, ...), turned into the runtime's
//! [`SpecOptions`]. A bad value is refused at start naming the flag.

use anyhow::{Result, bail};
use contract::backend::MAX_DRAFTS;
use engine::SpecConfig;
use runtime::{Drafting, SpecOptions};

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
    #[arg(long, default_value_t = runtime::DEFAULT_NUM_SPECULATIVE_TOKENS, env = "LAMINA_NUM_SPECULATIVE_TOKENS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_DRAFTS as u64))]
    pub num_speculative_tokens: usize,
    /// Steps with more running sequences than this draft nothing (a large
    /// batch keeps the device busy without drafts) [default: 32 on CUDA, 1
    /// on the CPU].
    #[arg(long, env = "LAMINA_SPECULATIVE_MAX_BATCH")]
    pub speculative_max_batch: Option<usize>,
}

impl SpecArgs {
    /// The runtime's setting; an error naming the flag for an unknown
    /// method or a draft model without a name.
    pub fn options(&self) -> Result<SpecOptions> {
        let method = match self.speculative.as_deref() {
            None => None,
            Some("ngram") => Some(Drafting::Ngram),
            Some("suffix") => Some(Drafting::Suffix),
            Some(d) if d.starts_with("draft:") => match &d["draft:".len()..] {
                "" => bail!("invalid `--speculative {d}`: name the draft model after `draft:`"),
                model => Some(Drafting::Draft(model.to_string())),
            },
            Some(other) => {
                bail!(
                    "invalid `--speculative {other}`: expected `ngram`, `suffix` or `draft:MODEL`"
                )
            }
        };
        Ok(SpecOptions {
            method,
            num_tokens: self.num_speculative_tokens,
            max_batch: self.speculative_max_batch,
        })
    }

    /// The engine's setting on a CUDA (`cuda`) or CPU backend (`None`:
    /// off), a draft model named, not loaded.
    pub fn config(&self, cuda: bool) -> Result<Option<SpecConfig>> {
        Ok(self.options()?.config(cuda))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use engine::SpecMethod;
    use engine::speculate::{CPU_SPEC_MAX_BATCH, DEFAULT_SPEC_MAX_BATCH};

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
