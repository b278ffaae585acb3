//! `adapter_config.json`: the fields lamina reads, and the PEFT features it
//! refuses. Errors name the field and the kind of value expected, never
//! the value found (a file's contents are not echoed back to a caller).

use std::path::Path;

use contract::lora::LoraTarget;
use serde_json::Value;

use super::LoraLoadError;

/// Whether a config field's value is one lamina supports.
type FieldOk = fn(&Value) -> bool;

/// The fields of `adapter_config.json` that matter.
pub(super) struct PeftConfig {
    pub rank: usize,
    pub alpha: f32,
    pub targets: Vec<LoraTarget>,
    pub rslora: bool,
}

/// The PEFT features lamina does not run, each with its accepted values.
const UNSUPPORTED: [(&str, &str, FieldOk); 4] = [
    ("fan_in_fan_out", "false", |x| x.as_bool() != Some(true)),
    ("bias", "\"none\"", |x| {
        x.is_null() || x.as_str() == Some("none")
    }),
    ("modules_to_save", "null or []", |x| {
        x.is_null() || x.as_array().is_some_and(|a| a.is_empty())
    }),
    ("use_dora", "false", |x| x.as_bool() != Some(true)),
];

/// What kind of JSON value `v` is, for errors that must not echo it.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses the config text read from `path`.
pub(super) fn parse_config(path: &Path, text: &str) -> Result<PeftConfig, LoraLoadError> {
    let bad = |field: &str, reason: String| LoraLoadError::Config {
        path: path.to_path_buf(),
        field: field.into(),
        reason,
    };
    let v: Value = serde_json::from_str(text).map_err(|e| {
        bad(
            "(file)",
            format!("is not JSON (line {}, column {})", e.line(), e.column()),
        )
    })?;
    if !v.is_object() {
        return Err(bad("(file)", format!("is {}, not a JSON object", kind(&v))));
    }
    let rank = v
        .get("r")
        .and_then(|r| r.as_u64())
        .ok_or_else(|| bad("r", "is missing or not a positive integer".into()))?
        as usize;
    let alpha = match v.get("lora_alpha") {
        None | Some(Value::Null) => rank as f32,
        Some(a) => a
            .as_f64()
            .ok_or_else(|| bad("lora_alpha", format!("is {}, not a number", kind(a))))?
            as f32,
    };
    let rslora = v
        .get("use_rslora")
        .and_then(|x| x.as_bool())
        .unwrap_or(false);
    let targets = targets(&v, &bad)?;
    for (field, accepted, ok) in UNSUPPORTED {
        if let Some(x) = v.get(field).filter(|x| !ok(x)) {
            return Err(bad(
                field,
                format!(
                    "is {}, which lamina does not support (accepted: {accepted})",
                    kind(x)
                ),
            ));
        }
    }
    for field in ["rank_pattern", "alpha_pattern"] {
        if v.get(field)
            .is_some_and(|x| x.as_object().is_some_and(|o| !o.is_empty()))
        {
            return Err(bad(
                field,
                "is not empty; per-module ranks are not supported".into(),
            ));
        }
    }
    Ok(PeftConfig {
        rank,
        alpha,
        targets,
        rslora,
    })
}

/// `target_modules`: a list of projection names, or `"all-linear"`.
fn targets(
    v: &Value,
    bad: &dyn Fn(&str, String) -> LoraLoadError,
) -> Result<Vec<LoraTarget>, LoraLoadError> {
    let expected = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
    match v.get("target_modules") {
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, x)| {
                x.as_str().and_then(LoraTarget::from_name).ok_or_else(|| {
                    bad(
                        &format!("target_modules[{i}]"),
                        format!(
                            "is not a projection LoRA can target here (expected one of {expected})"
                        ),
                    )
                })
            })
            .collect(),
        Some(Value::String(s)) if s == "all-linear" => Ok(LoraTarget::ALL.to_vec()),
        Some(other) => Err(bad(
            "target_modules",
            format!(
                "is {}; expected a list of module names or \"all-linear\"",
                kind(other)
            ),
        )),
        None => Err(bad("target_modules", "is missing".into())),
    }
}
