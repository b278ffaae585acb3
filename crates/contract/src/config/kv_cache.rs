//! The KV cache's element type, and FP8 K/V's per-layer scales.
//!
//! Contract: [`KvCacheDtype`] is the one setting of how a backend stores
//! K and V (the CLI's `--kv-cache-dtype`; `auto` parses to
//! [`KvCacheDtype::AUTO`], BF16) and [`KvCacheDtype::bytes`] is the one
//! element size the pool is sized with, so an FP8 pool holds twice the
//! tokens of a BF16 one in the same memory. FP8 is e4m3 with one scale per
//! layer for K and one for V ([`KvScales`]): the stored byte is
//! `encode(x / scale)`, the value read is `decode(byte) * scale`. The
//! scales are 1 unless the checkpoint carries them
//! (`model.layers.N.self_attn.k_scale` / `v_scale`, compressed-tensors'
//! `kv_cache_scheme`).
//!
//! Costs: O(1), except [`KvScales::ones`] (O(layers)).

use std::fmt;
use std::str::FromStr;

/// How a backend stores K and V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvCacheDtype {
    /// bfloat16: half the memory of f32, 8 bits of mantissa.
    Bf16,
    /// f32: K and V as computed (the reference's exactness).
    F32,
    /// FP8 e4m3 with a per-layer scale for K and for V: half the memory of
    /// BF16, 3 bits of mantissa.
    Fp8,
}

impl KvCacheDtype {
    /// What `auto` means.
    pub const AUTO: KvCacheDtype = KvCacheDtype::Bf16;
    /// Every spelling [`FromStr`] takes, `auto` first.
    pub const CHOICES: [&'static str; 4] = ["auto", "bf16", "f32", "fp8"];

    /// Bytes of one stored element.
    pub fn bytes(self) -> usize {
        match self {
            KvCacheDtype::Bf16 => 2,
            KvCacheDtype::F32 => 4,
            KvCacheDtype::Fp8 => 1,
        }
    }

    /// The name [`FromStr`] parses back (`bf16`, `f32`, `fp8`).
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Bf16 => "bf16",
            KvCacheDtype::F32 => "f32",
            KvCacheDtype::Fp8 => "fp8",
        }
    }
}

impl Default for KvCacheDtype {
    fn default() -> Self {
        KvCacheDtype::AUTO
    }
}

impl fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A KV cache dtype that is none of [`KvCacheDtype::CHOICES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown KV cache dtype `{0}`; expected one of auto, bf16, f32, fp8")]
pub struct UnknownKvCacheDtype(pub String);

impl FromStr for KvCacheDtype {
    type Err = UnknownKvCacheDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(KvCacheDtype::AUTO),
            "bf16" | "bfloat16" => Ok(KvCacheDtype::Bf16),
            "f32" | "float32" | "fp32" => Ok(KvCacheDtype::F32),
            "fp8" | "fp8_e4m3" | "e4m3" => Ok(KvCacheDtype::Fp8),
            _ => Err(UnknownKvCacheDtype(s.to_string())),
        }
    }
}

/// FP8 K/V scales, one per layer for K and one for V (`[layers]` each):
/// the value of a stored byte is `decode(byte) * scale`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvScales {
    pub k: Vec<f32>, // [layers]
    pub v: Vec<f32>, // [layers]
}

impl KvScales {
    /// Scale 1 for every layer's K and V (a checkpoint without scales).
    pub fn ones(layers: usize) -> KvScales {
        KvScales {
            k: vec![1.0; layers],
            v: vec![1.0; layers],
        }
    }

    /// `layer`'s `(k, v)` scales (1 past the end).
    pub fn layer(&self, layer: usize) -> (f32, f32) {
        (
            self.k.get(layer).copied().unwrap_or(1.0),
            self.v.get(layer).copied().unwrap_or(1.0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_choice_parses_and_names_round_trip() {
        for c in KvCacheDtype::CHOICES {
            let d: KvCacheDtype = c.parse().unwrap();
            assert_eq!(d.name().parse::<KvCacheDtype>().unwrap(), d);
        }
        assert_eq!("auto".parse::<KvCacheDtype>().unwrap(), KvCacheDtype::Bf16);
        assert_eq!("FP8".parse::<KvCacheDtype>().unwrap(), KvCacheDtype::Fp8);
        let e = "int4".parse::<KvCacheDtype>().unwrap_err().to_string();
        assert!(e.contains("int4") && e.contains("fp8"), "{e}");
    }

    #[test]
    fn fp8_holds_twice_the_tokens_of_bf16() {
        assert_eq!(KvCacheDtype::Bf16.bytes(), 2 * KvCacheDtype::Fp8.bytes());
        assert_eq!(KvCacheDtype::F32.bytes(), 2 * KvCacheDtype::Bf16.bytes());
        assert_eq!(KvCacheDtype::default(), KvCacheDtype::Bf16);
        assert_eq!(KvScales::ones(2).layer(1), (1.0, 1.0));
        assert_eq!(KvScales::ones(2).layer(5), (1.0, 1.0));
    }
}
