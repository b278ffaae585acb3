//! RoPE from the one precomputed table.
//!
//! Contract: [`Rope`] holds `cos`/`sin` tables `[positions, head_dim / 2]`
//! built once by [`ModelConfig::rope_table`] (the CUDA backend uploads the
//! same tables) and rotates in the rotate-half convention of the Hugging
//! Face layout (pairs `i` and `i + head_dim / 2` of each head).
//! [`LayerRopes`] holds one table per distinct RoPE of a model's layers
//! (Gemma 3's local and global layers differ in base) and hands each layer
//! its own.
//! Costs: tables `2 * positions * head_dim / 2 * 4` bytes (each distinct
//! RoPE once); `apply` is O(len) per token.

use contract::config::ModelConfig;
use contract::spec;

/// Precomputed rotary tables.
pub struct Rope {
    cos: Vec<f32>, // [positions, half]
    sin: Vec<f32>, // [positions, half]
    half: usize,
    positions: usize,
}

impl Rope {
    /// Tables for positions `0..positions` of `config`'s head size and scaling.
    pub fn new(config: &ModelConfig, positions: usize) -> Self {
        Self::of(config.rope(), config.head_dim, positions)
    }

    /// Tables for positions `0..positions` of one layer's `rope` over heads
    /// of `head_dim`.
    pub fn of(rope: &spec::Rope, head_dim: usize, positions: usize) -> Self {
        let (cos, sin) = rope.table(head_dim, positions);
        Rope {
            cos,
            sin,
            half: head_dim / 2,
            positions,
        }
    }

    /// Number of positions covered by the tables.
    pub fn positions(&self) -> usize {
        self.positions
    }

    /// The cosine table, `[positions, head_dim / 2]`.
    pub fn cos(&self) -> &[f32] {
        &self.cos
    }

    /// The sine table, `[positions, head_dim / 2]`.
    pub fn sin(&self) -> &[f32] {
        &self.sin
    }

    /// Rotates every head of one token's `x` (`[heads * head_dim]`) to `pos`.
    /// `pos` must be below [`Rope::positions`] (checked by the backend).
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let half = self.half;
        let cos = &self.cos[pos * half..(pos + 1) * half];
        let sin = &self.sin[pos * half..(pos + 1) * half];
        for head in x.chunks_exact_mut(2 * half) {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * cos[i] - x1 * sin[i];
                b[i] = x1 * cos[i] + x0 * sin[i];
            }
        }
    }

    /// Rotates each of the `T` rows of `x` (`[T, width]`, `width` a multiple
    /// of `head_dim`) to its position `positions[t]`.
    pub fn apply_rows(&self, x: &mut [f32], width: usize, positions: &[u32]) {
        for (row, &pos) in x.chunks_exact_mut(width).zip(positions) {
            self.apply(row, pos as usize);
        }
    }
}

/// Every layer's RoPE table, each distinct RoPE of the spec built once.
pub struct LayerRopes {
    tables: Vec<Rope>,
    /// `[layers]` index into `tables`
    of_layer: Vec<usize>,
}

impl LayerRopes {
    /// The tables of `config`'s layers for positions `0..positions`.
    pub fn new(config: &ModelConfig, positions: usize) -> Self {
        let mut distinct: Vec<&spec::Rope> = Vec::new();
        let of_layer = (config.spec.layers.iter())
            .map(|l| match distinct.iter().position(|r| **r == l.rope) {
                Some(i) => i,
                None => {
                    distinct.push(&l.rope);
                    distinct.len() - 1
                }
            })
            .collect();
        let tables = (distinct.into_iter())
            .map(|r| Rope::of(r, config.head_dim, positions))
            .collect();
        LayerRopes { tables, of_layer }
    }

    /// Layer `l`'s table.
    pub fn layer(&self, l: usize) -> &Rope {
        &self.tables[self.of_layer[l]]
    }

    /// The distinct tables (what [`LayerRopes::of_layers`] indexes).
    pub fn distinct(&self) -> &[Rope] {
        &self.tables
    }

    /// `[layers]` each layer's index into [`LayerRopes::distinct`].
    pub fn of_layers(&self) -> &[usize] {
        &self.of_layer
    }

    /// Number of positions every table covers.
    pub fn positions(&self) -> usize {
        self.tables.first().map_or(0, Rope::positions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use contract::presets::Preset;

    #[test]
    fn position_zero_is_identity_and_rotation_keeps_norm() {
        let c = Preset::Tiny.config().unwrap();
        let rope = Rope::new(&c, 8);
        assert_eq!(rope.cos().len(), 8 * c.head_dim / 2);
        let x: Vec<f32> = (0..2 * c.head_dim).map(|i| i as f32 / 7.0 - 1.0).collect();
        let mut y = x.clone();
        rope.apply(&mut y, 0);
        assert_eq!(x, y);
        rope.apply_rows(&mut y, c.head_dim, &[5, 3]);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x) - n(&y)).abs() < 1e-3);
        assert_ne!(x, y);
    }
}
