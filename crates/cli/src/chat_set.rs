//! `/set` in the chat REPL: change a sampling setting or the system
//! message between turns (`/set temperature 0.2`, `/set system Be brief`;
//! ollama's `/set parameter NAME VALUE` also works). A value is checked as
//! the flag of the same name is; a bad one leaves the settings unchanged.

use anyhow::{Context, Result, bail};
use contract::GenerationConfig;

use crate::sampling_args::SamplingArgs;

/// The names `/set` takes (with `-` or `_`), and the help line listing them.
pub const NAMES: &str = "temperature, top_p, top_k, min_p, max_tokens, seed, \
repetition_penalty, presence_penalty, frequency_penalty, stop, system";

/// What a `/set` changed.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// A sampling setting; the line describing the settings now in effect.
    Sampling(String),
    /// The system message (the conversation restarts with it).
    System(String),
}

/// Applies `/set NAME VALUE` to `sampling` (checked against the model's
/// `defaults`); the system message is handed back for the conversation.
pub fn apply(
    sampling: &mut SamplingArgs,
    defaults: &GenerationConfig,
    name: &str,
    value: &str,
) -> Result<Change> {
    let key = name.trim().to_ascii_lowercase().replace('-', "_");
    let value = value.trim();
    if key == "system" {
        if value.is_empty() {
            bail!("/set system needs the message: /set system TEXT");
        }
        return Ok(Change::System(value.to_string()));
    }
    if value.is_empty() && key != "stop" {
        bail!("/set {key} needs a value: /set {key} VALUE");
    }
    let mut s = sampling.clone();
    match key.as_str() {
        "temperature" | "temp" => s.scalars.temperature = Some(number(&key, value)?),
        "top_p" => s.scalars.top_p = Some(number(&key, value)?),
        "top_k" => s.top_k = Some(number(&key, value)?),
        "min_p" => s.scalars.min_p = Some(number(&key, value)?),
        "max_tokens" | "num_predict" | "n_predict" => {
            s.max_tokens = number(&key, value)?;
            if s.max_tokens == 0 {
                bail!("/set {key}: must be at least 1");
            }
        }
        "seed" => s.seed = Some(number(&key, value)?),
        "repetition_penalty" | "repeat_penalty" => {
            s.scalars.repetition_penalty = Some(number(&key, value)?)
        }
        "presence_penalty" => s.scalars.presence_penalty = Some(number(&key, value)?),
        "frequency_penalty" => s.scalars.frequency_penalty = Some(number(&key, value)?),
        // `/set stop` alone clears the stop strings
        "stop" if value.is_empty() => s.stop.clear(),
        "stop" => s.stop.push(value.to_string()),
        _ => bail!("/set has no setting `{name}`; it takes {NAMES}"),
    }
    s.params(defaults).map_err(|e| {
        anyhow::anyhow!(
            "/set {key} {value}: {}",
            e.to_string().replace("invalid ", "")
        )
    })?;
    *sampling = s;
    Ok(Change::Sampling(describe(sampling, defaults)))
}

/// The settings in effect, as `/set` with no argument prints them.
pub fn describe(sampling: &SamplingArgs, defaults: &GenerationConfig) -> String {
    let mut line = format!(
        "{}, max tokens {}",
        sampling.describe(defaults),
        sampling.max_tokens
    );
    if let Some(seed) = sampling.seed {
        line.push_str(&format!(", seed {seed}"));
    }
    let (presence, frequency) = (
        sampling.scalars.presence_penalty.unwrap_or(0.0),
        sampling.scalars.frequency_penalty.unwrap_or(0.0),
    );
    if presence != 0.0 || frequency != 0.0 {
        line.push_str(&format!(
            ", presence penalty {presence}, frequency penalty {frequency}"
        ));
    }
    if !sampling.stop.is_empty() {
        line.push_str(&format!(", stop {:?}", sampling.stop));
    }
    line
}

fn number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T> {
    value
        .parse()
        .ok()
        .with_context(|| format!("/set {key}: `{value}` is not a number of the right kind"))
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

    fn sampling() -> SamplingArgs {
        Cmd::try_parse_from(["t"]).unwrap().s
    }

    #[test]
    fn set_changes_one_setting_and_refuses_bad_values_whole() {
        let d = GenerationConfig::default();
        let mut s = sampling();
        let Change::Sampling(line) = apply(&mut s, &d, "temperature", "0.25").unwrap() else {
            panic!("a sampling change")
        };
        assert_eq!(s.scalars.temperature, Some(0.25));
        assert!(line.contains("temperature 0.25"), "{line}");
        apply(&mut s, &d, "top-k", "7").unwrap();
        apply(&mut s, &d, "num_predict", "12").unwrap();
        assert_eq!((s.top_k, s.max_tokens), (Some(7), 12));
        let e = apply(&mut s, &d, "temperature", "-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("must be in [0,"), "{e}");
        assert_eq!(
            s.scalars.temperature,
            Some(0.25),
            "unchanged after a bad value"
        );
        let e = apply(&mut s, &d, "top_p", "lots").unwrap_err().to_string();
        assert!(e.contains("not a number"), "{e}");
        let e = apply(&mut s, &d, "warmth", "1").unwrap_err().to_string();
        assert!(
            e.contains("no setting `warmth`") && e.contains("temperature"),
            "{e}"
        );
        assert_eq!(
            apply(&mut s, &d, "system", " Be brief ").unwrap(),
            Change::System("Be brief".into())
        );
        apply(&mut s, &d, "stop", "END").unwrap();
        assert_eq!(s.stop, ["END"]);
        apply(&mut s, &d, "stop", "").unwrap();
        assert!(s.stop.is_empty());
    }
}
