//! Helpers shared by the GPU kernel tests: device setup, random inputs,
//! errors, the head shapes tested, and the RoPE tables. The references
//! themselves are the `ops` crate's operations (the CPU backend's code).
#![allow(dead_code)]

use std::sync::Arc;

use gpu::Gpu;
use half::bf16;
use kernels::{HeadShape, KernelOptions, Kernels};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

pub const POISON: u8 = 0xFF;

pub fn setup() -> (Arc<Gpu>, Kernels) {
    let gpu = Gpu::new(0).expect("a CUDA device");
    let k = Kernels::load(&gpu, KernelOptions::default()).expect("kernels load");
    (gpu, k)
}

pub fn rand_bf16(rng: &mut StdRng, n: usize, scale: f32) -> Vec<bf16> {
    (0..n)
        .map(|_| {
            let mut v: f32 = rng.random_range(-1.0..1.0) * scale;
            if v == 0.0 {
                v = 0.5 * scale;
            }
            bf16::from_f32(v)
        })
        .collect()
}

pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(
        a.iter().all(|x| x.is_finite()),
        "output holds non-finite values (unwritten?)"
    );
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

pub fn f32s(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// RoPE of Llama 3.2 1B's settings (theta 500000, llama3 scaling) at head
/// size `head_dim`, from `ModelConfig::rope_table` like both backends.
pub fn rope(max_pos: usize, head_dim: usize) -> ops::Rope {
    let mut c = contract::presets::Preset::Llama3_2_1b
        .config()
        .expect("preset parses");
    c.head_dim = head_dim;
    ops::Rope::new(&c, max_pos)
}

/// `[T, width]` rows `t` of `[T, stride]` rows starting at column `col`.
pub fn columns(x: &[f32], stride: usize, col: usize, width: usize) -> Vec<f32> {
    x.chunks_exact(stride)
        .flat_map(|r| r[col..col + width].iter().copied())
        .collect()
}

/// The `ops` attention dimensions of a kernel head shape.
pub fn dims(s: HeadShape) -> ops::AttnDims {
    ops::AttnDims {
        heads: s.num_heads,
        kv_heads: s.num_kv_heads,
        head_dim: s.head_dim,
    }
}

pub const SHAPES: [HeadShape; 5] = [
    HeadShape {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
    },
    HeadShape {
        num_heads: 6,
        num_kv_heads: 1,
        head_dim: 32,
    },
    HeadShape {
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 64,
    },
    HeadShape {
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
    },
    HeadShape {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 128,
    },
];

/// Gemma 3's attention head shape (270M / 1B: 4 query heads, 1 KV head,
/// head_dim 256): the scalar prefill and the decode kernels serve it, the
/// flash tilings do not.
pub const D256: HeadShape = HeadShape {
    num_heads: 4,
    num_kv_heads: 1,
    head_dim: 256,
};

/// Score rules the attention tests run beside plain causal attention:
/// windows of 1, 17 and 100 keys (shorter than most test contexts, 100 not
/// a multiple of any key tile or block), and Gemma 3's scale at head_dim 256
/// (`query_pre_attn_scalar` 256: 1/16) with its 512-key window.
pub fn rules(head_dim: usize) -> Vec<ops::attention::ScoreRule> {
    let causal = ops::attention::ScoreRule::causal(head_dim);
    let w = |window: usize, scale: f32| ops::attention::ScoreRule {
        window: Some(window),
        scale,
        ..causal
    };
    vec![
        w(1, causal.scale),
        w(17, causal.scale),
        w(100, 0.3 * causal.scale),
        w(512, 1.0 / 16.0),
    ]
}

/// A random paged batch: sequences with `(seqlen, context_len)`, blocks shuffled.
pub struct PagedBatch {
    pub cu: Vec<u32>,
    pub ctx: Vec<u32>,
    pub tables: Vec<u32>,
    pub max_blocks: usize,
    pub num_blocks: usize,
}

pub fn paged_batch(rng: &mut StdRng, seqs: &[(usize, usize)], block_size: usize) -> PagedBatch {
    let max_blocks = seqs
        .iter()
        .map(|s| s.1.div_ceil(block_size))
        .max()
        .unwrap_or(1);
    let total: usize = seqs.iter().map(|s| s.1.div_ceil(block_size)).sum();
    let num_blocks = total + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    ids.shuffle(rng);
    let mut tables = vec![0u32; seqs.len() * max_blocks];
    let mut next = 0;
    let mut cu = vec![0u32];
    for (s, &(len, ctx)) in seqs.iter().enumerate() {
        for b in 0..ctx.div_ceil(block_size) {
            tables[s * max_blocks + b] = ids[next];
            next += 1;
        }
        cu.push(cu[s] + len as u32);
    }
    PagedBatch {
        cu,
        ctx: seqs.iter().map(|s| s.1 as u32).collect(),
        tables,
        max_blocks,
        num_blocks,
    }
}

/// The FP8 K and V scales the FP8-cache tests store at: values of ±1 land
/// in e4m3's normal range, ±2 (the RoPE tests' inputs) past its ±448.
pub const FP8_K_SCALE: f32 = 0.01;
pub const FP8_V_SCALE: f32 = 0.004;

/// One K or V cache on the device in the kernels' element type.
pub enum DevCache {
    Bf16(gpu::DeviceBuffer<bf16>),
    Fp8(gpu::DeviceBuffer<u8>),
}

/// K and V caches on the device, bf16 or e4m3 bytes at [`FP8_K_SCALE`] /
/// [`FP8_V_SCALE`] (`ops::kv`'s codec, the one the kernels write), and the
/// f32 values the reference reads (what the stored elements read back as).
pub struct TestKv {
    pub k: DevCache,
    pub v: DevCache,
    pub k_ref: Vec<f32>,
    pub v_ref: Vec<f32>,
    /// FP8 caches holding Hadamard-rotated keys (`KvCaches::Fp8::rotate`).
    pub rotate: bool,
}

impl TestKv {
    /// Stores `k` / `v` (bf16 values) as bf16, or as e4m3 bytes when `fp8`.
    pub fn new(gpu: &Gpu, k: &[bf16], v: &[bf16], fp8: bool) -> TestKv {
        let one = |x: &[bf16], scale: f32| -> (DevCache, Vec<f32>) {
            if !fp8 {
                return (DevCache::Bf16(gpu.upload(x).unwrap()), f32s(x));
            }
            let f = f32s(x);
            let mut q = vec![0u8; f.len()];
            <u8 as ops::KvElem>::put(&mut q, &f, scale);
            let mut back = vec![0f32; f.len()];
            <u8 as ops::KvElem>::get(&q, &mut back, scale);
            (DevCache::Fp8(gpu.upload(&q).unwrap()), back)
        };
        let (k, k_ref) = one(k, FP8_K_SCALE);
        let (v, v_ref) = one(v, FP8_V_SCALE);
        TestKv {
            k,
            v,
            k_ref,
            v_ref,
            rotate: false,
        }
    }

    /// Poisoned caches of `len` elements each (for the writers).
    pub fn poisoned(gpu: &Gpu, len: usize, fp8: bool) -> TestKv {
        let (k, v) = if fp8 {
            let (k, v) = (gpu.alloc::<u8>(len).unwrap(), gpu.alloc::<u8>(len).unwrap());
            gpu.fill_bytes(k.view(), POISON).unwrap();
            gpu.fill_bytes(v.view(), POISON).unwrap();
            (DevCache::Fp8(k), DevCache::Fp8(v))
        } else {
            let (k, v) = (
                gpu.alloc::<bf16>(len).unwrap(),
                gpu.alloc::<bf16>(len).unwrap(),
            );
            gpu.fill_bytes(k.view(), POISON).unwrap();
            gpu.fill_bytes(v.view(), POISON).unwrap();
            (DevCache::Bf16(k), DevCache::Bf16(v))
        };
        TestKv {
            k,
            v,
            k_ref: Vec::new(),
            v_ref: Vec::new(),
            rotate: false,
        }
    }

    /// The same caches, their keys Hadamard-rotated when `rotate` (FP8 only).
    pub fn rotating(self, rotate: bool) -> TestKv {
        TestKv { rotate, ..self }
    }

    /// The caches as the kernels take them.
    pub fn caches(&self) -> kernels::KvCaches<'_> {
        match (&self.k, &self.v) {
            (DevCache::Bf16(k), DevCache::Bf16(v)) => kernels::KvCaches::bf16(k.view(), v.view()),
            (DevCache::Fp8(k), DevCache::Fp8(v)) => kernels::KvCaches::Fp8 {
                k: k.view(),
                v: v.view(),
                k_scale: FP8_K_SCALE,
                v_scale: FP8_V_SCALE,
                rotate: self.rotate,
            },
            _ => unreachable!("K and V are stored alike"),
        }
    }

    /// What the device caches read back as, f32 (K, V).
    pub fn read(&self, gpu: &Gpu) -> (Vec<f32>, Vec<f32>) {
        let one = |c: &DevCache, scale: f32| match c {
            DevCache::Bf16(b) => f32s(&gpu.to_host(b.view()).unwrap()),
            DevCache::Fp8(b) => {
                let q = gpu.to_host(b.view()).unwrap();
                let mut f = vec![0f32; q.len()];
                <u8 as ops::KvElem>::get(&q, &mut f, scale);
                f
            }
        };
        (one(&self.k, FP8_K_SCALE), one(&self.v, FP8_V_SCALE))
    }
}

/// `want` stored as the caches store it (bf16, or e4m3 at `scale` when
/// `fp8`) and read back.
pub fn kv_rounded(want: &[f32], fp8: bool, scale: f32) -> Vec<f32> {
    let dtype = if fp8 {
        contract::KvCacheDtype::Fp8
    } else {
        contract::KvCacheDtype::Bf16
    };
    want.iter()
        .map(|&x| ops::kv_round(dtype, x, scale))
        .collect()
}
