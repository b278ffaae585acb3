//! ollama's `keep_alive`: how long a model stays loaded after its last
//! request. A number of seconds (`300`, `0.5`) or a duration string of
//! numbers with units `ms`, `s`, `m`, `h` (`"5m"`, `"1h30m"`, `"10s"`, a
//! bare `"300"` is seconds); `0` unloads the model once its requests end;
//! a negative value keeps it loaded until it is unloaded by hand or
//! evicted.
//!
//! Contract: [`parse`] accepts exactly those spellings; anything else is an
//! error naming the value. A request's `keep_alive` deserializes through
//! [`KeepAlive`]'s serde impl, so a bad one is a 400 naming the field.

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The longest keep-alive written as a finite duration (a year); longer
/// reads as "until unloaded".
const MAX_SECONDS: f64 = 365.0 * 86_400.0;

/// How long a model stays loaded after its last request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Unloaded this long after its last request ends (zero: at once).
    For(Duration),
    /// Loaded until unloaded by hand or evicted.
    Forever,
}

/// `keep_alive` as a number of seconds or a duration string (module doc).
pub fn parse(text: &str) -> Result<KeepAlive, String> {
    let t = text.trim();
    let bad = || {
        format!(
            "`{text}` is not a keep-alive: give seconds (`300`, `-1` forever) or a duration like `5m`, `1h30m`, `10s`"
        )
    };
    if let Ok(secs) = t.parse::<f64>() {
        return seconds(secs).ok_or_else(bad);
    }
    let (negative, mut rest) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t),
    };
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let value: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    seconds(if negative { -total } else { total }).ok_or_else(bad)
}

/// A keep-alive of `secs` seconds: negative is forever; NaN is refused.
fn seconds(secs: f64) -> Option<KeepAlive> {
    if secs.is_nan() {
        None
    } else if !(0.0..=MAX_SECONDS).contains(&secs) {
        Some(KeepAlive::Forever)
    } else {
        Some(KeepAlive::For(Duration::from_secs_f64(secs)))
    }
}

impl<'de> Deserialize<'de> for KeepAlive {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Seconds(f64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Seconds(s) => {
                seconds(s).ok_or_else(|| serde::de::Error::custom("`keep_alive` must be a number"))
            }
            Raw::Text(t) => parse(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_of_ollama_are_read() {
        let secs = |s: f64| KeepAlive::For(Duration::from_secs_f64(s));
        assert_eq!(parse("5m"), Ok(secs(300.0)));
        assert_eq!(parse("1h30m"), Ok(secs(5400.0)));
        assert_eq!(parse("10s"), Ok(secs(10.0)));
        assert_eq!(parse("250ms"), Ok(secs(0.25)));
        assert_eq!(parse("300"), Ok(secs(300.0)));
        assert_eq!(parse("0"), Ok(secs(0.0)));
        assert_eq!(parse("-1"), Ok(KeepAlive::Forever));
        assert_eq!(parse("-1m"), Ok(KeepAlive::Forever));
        for bad in ["", "5x", "m", "five", "1h-3m", "-"] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(&format!("`{bad}`")), "{e}");
        }
    }

    #[test]
    fn numbers_and_strings_deserialize() {
        let v: KeepAlive = serde_json::from_str("0").unwrap();
        assert_eq!(v, KeepAlive::For(Duration::ZERO));
        let v: KeepAlive = serde_json::from_str("\"2m\"").unwrap();
        assert_eq!(v, KeepAlive::For(Duration::from_secs(120)));
        let v: KeepAlive = serde_json::from_str("-5").unwrap();
        assert_eq!(v, KeepAlive::Forever);
        assert!(serde_json::from_str::<KeepAlive>("\"soon\"").is_err());
    }
}
