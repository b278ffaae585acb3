//! LoRA adapters as the engine and the backends see them: low-rank deltas
//! `y += scale * B (A x)` after a layer's projections, the adapter's weights
//! already read and checked (the PEFT files are `checkpoint::lora`'s).
//!
//! Contract: a [`LoraAdapter`] holds, per layer and per [`LoraTarget`], an
//! optional [`LoraPair`] (`a`: `[rank, in]`, `b`: `[out, rank]`, f32,
//! row-major) and one `scale` (`alpha / rank`, or `alpha / sqrt(rank)`
//! with rsLoRA). [`LoraAdapter::check`] is the one check of an adapter
//! against a model: layer count, every pair's shapes, finite values, rank
//! at most the limit; a backend may index an adapter that passed it.
//! A step names each sequence's adapter slot in
//! [`crate::StepBatch::loras`] (0: the base model; slot `k` >= 1 as set by
//! [`crate::Backend::set_lora`]).
//!
//! Costs: memory `rank * (in + out) * 4` bytes per pair; applying one to
//! `T` rows is `T * rank * (in + out)` multiply-adds.

use crate::config::ModelConfig;

/// A projection an adapter can target, by its PEFT module name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    /// Every target, in layer order (the index of [`LoraLayer::pairs`]).
    pub const ALL: [LoraTarget; 7] = [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::O,
        LoraTarget::Gate,
        LoraTarget::Up,
        LoraTarget::Down,
    ];

    /// The PEFT module name (`q_proj`, ...).
    pub fn name(self) -> &'static str {
        match self {
            LoraTarget::Q => "q_proj",
            LoraTarget::K => "k_proj",
            LoraTarget::V => "v_proj",
            LoraTarget::O => "o_proj",
            LoraTarget::Gate => "gate_proj",
            LoraTarget::Up => "up_proj",
            LoraTarget::Down => "down_proj",
        }
    }

    /// The submodule holding it (`self_attn` or `mlp`).
    pub fn block(self) -> &'static str {
        match self {
            LoraTarget::Q | LoraTarget::K | LoraTarget::V | LoraTarget::O => "self_attn",
            _ => "mlp",
        }
    }

    /// The target named `name` (`q_proj`, ...).
    pub fn from_name(name: &str) -> Option<LoraTarget> {
        Self::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Index in [`LoraTarget::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// `(in, out)` features of the projection in model `c`.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, i) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        match self {
            LoraTarget::Q => (h, q),
            LoraTarget::K | LoraTarget::V => (h, kv),
            LoraTarget::O => (q, h),
            LoraTarget::Gate | LoraTarget::Up => (h, i),
            LoraTarget::Down => (i, h),
        }
    }
}

/// One projection's low-rank pair.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    /// `[rank, in]` row-major.
    pub a: Vec<f32>,
    /// `[out, rank]` row-major.
    pub b: Vec<f32>,
}

/// One layer's pairs, indexed by [`LoraTarget::index`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraLayer {
    pub pairs: [Option<LoraPair>; 7],
}

impl LoraLayer {
    /// The pair of `target`, if the adapter has one.
    pub fn pair(&self, target: LoraTarget) -> Option<&LoraPair> {
        self.pairs[target.index()].as_ref()
    }
}

/// A LoRA adapter, read and checked (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAdapter {
    pub rank: usize,
    /// `alpha / rank`, or `alpha / sqrt(rank)` with rsLoRA.
    pub scale: f32,
    /// `[num_layers]`.
    pub layers: Vec<LoraLayer>,
}

/// Why an adapter does not fit a model.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoraError {
    #[error("rank {rank} is above --max-lora-rank {max}")]
    RankTooHigh { rank: usize, max: usize },
    #[error("rank must be at least 1")]
    ZeroRank,
    #[error("the adapter has {found} layers, the model {want}")]
    Layers { found: usize, want: usize },
    #[error("layer {layer} {target}: `lora_{which}` has {found} values, expected {want} ({shape})")]
    Shape {
        layer: usize,
        target: &'static str,
        which: char,
        found: usize,
        want: usize,
        shape: String,
    },
    #[error(
        "layer {layer} {target}: `lora_{which}` holds a non-finite value ({value} at flat index {index})"
    )]
    NonFinite {
        layer: usize,
        target: &'static str,
        which: char,
        index: usize,
        value: f32,
    },
    #[error("scale {0} is not finite")]
    Scale(f32),
}

impl LoraAdapter {
    /// The one check of an adapter against model `c` with ranks up to
    /// `max_rank` (see the module doc). O(values).
    pub fn check(&self, c: &ModelConfig, max_rank: usize) -> Result<(), LoraError> {
        let r = self.rank;
        if r == 0 {
            return Err(LoraError::ZeroRank);
        }
        if r > max_rank {
            return Err(LoraError::RankTooHigh {
                rank: r,
                max: max_rank,
            });
        }
        if !self.scale.is_finite() {
            return Err(LoraError::Scale(self.scale));
        }
        if self.layers.len() != c.num_layers {
            return Err(LoraError::Layers {
                found: self.layers.len(),
                want: c.num_layers,
            });
        }
        for (l, layer) in self.layers.iter().enumerate() {
            for t in LoraTarget::ALL {
                let Some(p) = layer.pair(t) else { continue };
                let (i, o) = t.dims(c);
                for (which, v, want, shape) in [
                    ('A', &p.a, r * i, format!("[{r}, {i}]")),
                    ('B', &p.b, o * r, format!("[{o}, {r}]")),
                ] {
                    if v.len() != want {
                        return Err(LoraError::Shape {
                            layer: l,
                            target: t.name(),
                            which,
                            found: v.len(),
                            want,
                            shape,
                        });
                    }
                    if let Some((index, &value)) =
                        v.iter().enumerate().find(|(_, x)| !x.is_finite())
                    {
                        return Err(LoraError::NonFinite {
                            layer: l,
                            target: t.name(),
                            which,
                            index,
                            value,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The targets any layer has a pair for, in layer order.
    pub fn targets(&self) -> Vec<LoraTarget> {
        LoraTarget::ALL
            .into_iter()
            .filter(|t| self.layers.iter().any(|l| l.pair(*t).is_some()))
            .collect()
    }

    /// Bytes of the pairs.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.pairs.iter().flatten())
            .map(|p| (p.a.len() + p.b.len()) * 4)
            .sum()
    }

    /// Adds `scale * B (A x)` to `y` for one row: `x` `[in]`, `y` `[out]`,
    /// the pair's shapes as [`LoraAdapter::check`] demands; `tmp` is
    /// scratch of at least `rank` values. The one definition of the delta
    /// (the CPU backend applies it row by row).
    pub fn apply_row(&self, p: &LoraPair, x: &[f32], y: &mut [f32], tmp: &mut [f32]) {
        let r = self.rank;
        let tmp = &mut tmp[..r];
        for (k, t) in tmp.iter_mut().enumerate() {
            let a = &p.a[k * x.len()..(k + 1) * x.len()];
            *t = self.scale * a.iter().zip(x).map(|(a, x)| a * x).sum::<f32>();
        }
        for (o, yo) in y.iter_mut().enumerate() {
            let b = &p.b[o * r..(o + 1) * r];
            *yo += b.iter().zip(tmp.iter()).map(|(b, t)| b * t).sum::<f32>();
        }
    }
}

/// The scale of a PEFT adapter: `alpha / rank`, or with rsLoRA
/// `alpha / sqrt(rank)` (rank at least 1).
pub fn lora_scale(alpha: f32, rank: usize, rslora: bool) -> f32 {
    let r = rank.max(1) as f32;
    if rslora { alpha / r.sqrt() } else { alpha / r }
}

/// The default of `--max-lora-rank` (vLLM's).
pub const DEFAULT_MAX_LORA_RANK: usize = 16;
/// The default of `--max-loras`: adapters resident at once (vLLM's).
pub const DEFAULT_MAX_LORAS: usize = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets::Preset;

    fn tiny() -> ModelConfig {
        Preset::Tiny.config().unwrap()
    }

    fn adapter(c: &ModelConfig, r: usize) -> LoraAdapter {
        let (i, o) = LoraTarget::Q.dims(c);
        let mut layer = LoraLayer::default();
        layer.pairs[0] = Some(LoraPair {
            a: vec![0.5; r * i],
            b: vec![0.25; o * r],
        });
        LoraAdapter {
            rank: r,
            scale: 2.0,
            layers: vec![layer; c.num_layers],
        }
    }

    #[test]
    fn check_names_what_does_not_fit() {
        let c = tiny();
        let a = adapter(&c, 4);
        a.check(&c, 4).unwrap();
        assert_eq!(a.targets(), vec![LoraTarget::Q]);
        let e = a.check(&c, 2).unwrap_err().to_string();
        assert!(e.contains("--max-lora-rank 2"), "{e}");
        let mut bad = a.clone();
        bad.layers[1].pairs[0].as_mut().unwrap().b.pop();
        let e = bad.check(&c, 8).unwrap_err().to_string();
        assert!(e.contains("layer 1 q_proj: `lora_B`"), "{e}");
        let mut bad = a.clone();
        bad.layers[0].pairs[0].as_mut().unwrap().a[3] = f32::NAN;
        let e = bad.check(&c, 8).unwrap_err().to_string();
        assert!(e.contains("non-finite") && e.contains("index 3"), "{e}");
        let mut bad = a;
        bad.layers.pop();
        assert!(matches!(bad.check(&c, 8), Err(LoraError::Layers { .. })));
    }

    #[test]
    fn apply_row_is_scale_b_a_x() {
        let a = LoraAdapter {
            rank: 1,
            scale: 3.0,
            layers: vec![],
        };
        let p = LoraPair {
            a: vec![1.0, 2.0],
            b: vec![1.0, -1.0, 0.5],
        };
        let mut y = vec![1.0; 3];
        a.apply_row(&p, &[1.0, 1.0], &mut y, &mut [0.0]);
        // A x = 3, scaled 9; y += [9, -9, 4.5]
        assert_eq!(y, vec![10.0, -8.0, 5.5]);
        assert_eq!(lora_scale(16.0, 4, false), 4.0);
        assert_eq!(lora_scale(16.0, 4, true), 8.0);
    }
}
