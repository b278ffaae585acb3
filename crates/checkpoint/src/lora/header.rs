//! The safetensors file of an adapter, checked before any tensor is read:
//! the header parses (safetensors' own checks: its length, every tensor's
//! byte range inside the file and the ranges covering the data exactly),
//! and no tensor is named twice (JSON lets a key repeat; the safetensors
//! crate keeps the last one silently). Errors never echo header text.

use std::path::Path;

use safetensors::{SafeTensorError, SafeTensors};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::{LoraLoadError, shown};

/// The keys of a JSON object, in order, duplicates kept.
struct Keys(Vec<String>);

impl<'de> Deserialize<'de> for Keys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Keys, A::Error> {
                let mut out = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    m.next_value::<IgnoredAny>()?;
                    out.push(k);
                }
                Ok(Keys(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// What is wrong with a safetensors file, without the header's text.
fn describe(e: &SafeTensorError) -> String {
    match e {
        SafeTensorError::InvalidHeaderDeserialization(j) | SafeTensorError::JsonError(j) => {
            format!(
                "its header is not a valid safetensors header (JSON line {}, column {})",
                j.line(),
                j.column()
            )
        }
        SafeTensorError::InvalidHeader(_) => "its header is not UTF-8".into(),
        SafeTensorError::TensorNotFound(n) => format!("tensor `{}` not found", shown(n)),
        SafeTensorError::InvalidOffset(n) => {
            format!("tensor `{}` has an invalid byte range", shown(n))
        }
        other => other.to_string(),
    }
}

/// The parsed file `buf` (read from `path`), its tensor names unique.
pub(super) fn parse<'a>(path: &Path, buf: &'a [u8]) -> Result<SafeTensors<'a>, LoraLoadError> {
    let bad = |tensor: &str, reason: String| LoraLoadError::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.into(),
        reason,
    };
    let st = SafeTensors::deserialize(buf).map_err(|e| {
        bad(
            "(header)",
            format!("is not a safetensors file: {}", describe(&e)),
        )
    })?;
    // deserialize checked the length prefix and that the header is JSON
    let n = buf
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad("(header)", "has no length prefix".into()))?;
    let header = buf
        .get(8..8usize.saturating_add(n))
        .ok_or_else(|| bad("(header)", "is cut short".into()))?;
    let Keys(mut keys) = serde_json::from_slice(header)
        .map_err(|_| bad("(header)", "is not a JSON object".into()))?;
    keys.sort_unstable();
    if let Some(w) = keys.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(
            &w[0],
            "appears twice in the header (each tensor must be named once)".into(),
        ));
    }
    Ok(st)
}
