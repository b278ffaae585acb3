//! b1's floor: the single-stream decode rate of a step that did nothing
//! but read its bytes at the copy bandwidth measured in the same run, and
//! b1 as a fraction of it. The definitions, written here once:
//!
//! - **Weight bytes** ([`step_weight_bytes`]): every weight a decode step
//!   reads, as the backend holds it (BF16, FP8 with its row scales, ggml
//!   blocks, int4 with its groups' records: [`model::WeightBytes`]): all
//!   layers' projections, norms and biases, the final norm and the LM
//!   head. The embedding table counts only when it is the LM head too
//!   (tied; counted once): an untied embedding gives the step one row,
//!   nothing measurable.
//! - **K/V bytes** ([`step_kv_bytes`]): per token of context, layers x 2
//!   (K and V) x kv_heads x head_dim x the KV pool's element size (bf16 2,
//!   fp8 1), at b1's mean context (prompt + gen / 2); a layer with a
//!   sliding window reads at most its window.
//! - **Copy bandwidth**: the device-to-device copy rate measured in this
//!   run before the model loads, counted as read plus write
//!   ([`runtime::copy_bandwidth`]: GPU 0's copies of 1 GiB timed with
//!   events; on the CPU, host memory copied by the rayon pool's threads).
//! - **Floor**: copy bandwidth / (weight bytes + K/V bytes) tokens a
//!   second; b1's fraction is its decode tok/s over the floor.

use contract::{KvCacheDtype, ModelConfig};
use model::WeightBytes;
use serde_json::json;

/// A decode step's bytes at b1's mean context and the copy bandwidth.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Floor {
    pub weight_bytes: usize,
    pub kv_bytes: usize,
    /// Tokens of context the K/V bytes are counted at.
    pub context: usize,
    /// Copy bandwidth, bytes a second (read plus write).
    pub copy: f64,
}

/// Weight bytes a decode step reads (see the module doc): the layers, the
/// final norm and the head, the embedding only as the tied head.
pub(crate) fn step_weight_bytes(w: &WeightBytes) -> usize {
    w.layers + w.final_norm + w.lm_head.unwrap_or(w.embed)
}

/// K/V bytes a decode step reads at `context` tokens: each layer's K and
/// V rows (`kv_row` bytes each) of the context, or of its window when it
/// has one (`windows`: each layer's).
pub(crate) fn step_kv_bytes(
    windows: impl IntoIterator<Item = Option<usize>>,
    kv_row: usize,
    context: usize,
) -> usize {
    (windows.into_iter())
        .map(|w| 2 * kv_row * w.map_or(context, |w| w.min(context)))
        .sum()
}

/// The copy bandwidth of the memory `device` runs from, bytes a second,
/// measured now; `None`, with a note, when it cannot be (the bench goes
/// on without the floor).
pub(crate) fn measure_copy(device: runtime::Device) -> Option<f64> {
    eprintln!("bench: measuring the copy bandwidth for b1's floor ...");
    match runtime::copy_bandwidth(device) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("bench: no b1 floor: measuring the copy bandwidth failed: {e}");
            None
        }
    }
}

impl Floor {
    /// The floor of model `cfg` holding `w`, its K/V in `kv` elements, at
    /// b1's `prompt` + `generated` tokens, at `copy` bytes a second.
    pub fn new(
        w: &WeightBytes,
        cfg: &ModelConfig,
        kv: KvCacheDtype,
        (prompt, generated): (usize, usize),
        copy: f64,
    ) -> Floor {
        let context = prompt + generated / 2;
        let windows = cfg.spec.layers.iter().map(|l| l.attention.window);
        Floor {
            weight_bytes: step_weight_bytes(w),
            kv_bytes: step_kv_bytes(windows, cfg.kv_dim() * kv.bytes(), context),
            context,
            copy,
        }
    }

    /// Decode tokens a second if a step only read its bytes.
    pub fn tok_s(&self) -> f64 {
        self.copy / (self.weight_bytes + self.kv_bytes).max(1) as f64
    }

    /// The report's line for b1 at `b1` tok/s.
    pub fn line(&self, b1: f64) -> String {
        let mb = |b: usize| num(b as f64 / 1e6);
        format!(
            "b1 floor: a step reads {} MB (weights {} MB + K/V {} MB at {} tokens of context); copy bandwidth {} GB/s measured now -> floor {} tok/s; b1 at {:.1}% of it",
            mb(self.weight_bytes + self.kv_bytes),
            mb(self.weight_bytes),
            mb(self.kv_bytes),
            self.context,
            num(self.copy / 1e9),
            num(self.tok_s()),
            100.0 * b1 / self.tok_s(),
        )
    }

    /// The JSON report's `b1_floor` for b1 at `b1` tok/s.
    pub fn json(&self, b1: f64) -> serde_json::Value {
        json!({
            "weight_bytes": self.weight_bytes,
            "kv_bytes": self.kv_bytes,
            "context": self.context,
            "copy_gb_s": self.copy / 1e9,
            "floor_tok_s": self.tok_s(),
            "fraction": b1 / self.tok_s(),
        })
    }
}

/// `x` for a reader: whole and in groups of three digits from 100 on
/// (`2,466`), else one decimal (`5.2`), three below 1 (`0.052`).
fn num(x: f64) -> String {
    if x < 1.0 {
        return format!("{x:.3}");
    }
    if x < 100.0 {
        return format!("{x:.1}");
    }
    let digits = format!("{x:.0}");
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_counts_a_tied_head_once_caps_windows_and_scales_b1() {
        let untied = WeightBytes {
            layers: 1000,
            final_norm: 10,
            embed: 500,
            lm_head: Some(400),
        };
        // an untied embedding is one row a step: not counted
        assert_eq!(step_weight_bytes(&untied), 1410);
        // a tied head is the embedding, counted once
        let tied = WeightBytes {
            lm_head: None,
            ..untied
        };
        assert_eq!(step_weight_bytes(&tied), 1510);
        // rows of 8 bytes, 100 tokens: a global layer reads 100 rows of K
        // and of V, one with a window of 16 reads 16 each
        assert_eq!(
            step_kv_bytes([None, Some(16)], 8, 100),
            2 * 8 * 100 + 2 * 8 * 16
        );
        assert_eq!(step_kv_bytes([Some(500)], 8, 100), 2 * 8 * 100);
        let f = Floor {
            weight_bytes: 1510,
            kv_bytes: 490,
            context: 100,
            copy: 2e6,
        };
        assert_eq!(f.tok_s(), 1000.0);
        let j = f.json(250.0);
        assert_eq!(j["fraction"], json!(0.25));
        assert_eq!(j["floor_tok_s"], json!(1000.0));
        assert!(
            f.line(250.0)
                .ends_with("floor 1,000 tok/s; b1 at 25.0% of it")
        );
    }

    #[test]
    fn numbers_read_with_groups_and_decimals() {
        assert_eq!(num(2466.4), "2,466");
        assert_eq!(num(1234567.0), "1,234,567");
        assert_eq!(num(100.0), "100");
        assert_eq!(num(5.24), "5.2");
        assert_eq!(num(0.0521), "0.052");
    }
}
