//! The element types a KV cache stores K and V in, and their one codec.
//!
//! Contract: a cache holds `[slots, kv_width]` elements of one
//! [`KvCacheDtype`]: f32 (the values as computed), BF16 (rounded to
//! nearest, ties to even) or FP8 e4m3 with one scale for the whole array
//! (`ops::fp8::encode(x / scale)`, saturating at ±448 · scale; read back
//! as `decode(byte) * scale`). [`KvElem::put`] is the one quantisation of
//! a KV write and [`KvElem::get`] the one widening of a read, so every
//! path that stores or reads K/V (the `ops` references, the CPU fast
//! kernels) agrees on what a stored value is; [`kv_round`] is the value a
//! stored `x` reads back as. Widening is exact (every BF16 and e4m3 value
//! is an f32; FP8's product with its scale rounds once).
//!
//! Costs: O(n) per `put` / `get` of `n` elements; [`KvCache::zeroed`]
//! allocates `len * dtype.bytes()` zeroed bytes (pages mapped on first
//! write).

use contract::KvCacheDtype;
use half::bf16;

/// One stored K/V element type.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Stores `src` into `dst` (equal lengths) at `scale` (FP8 only).
    fn put(dst: &mut [Self], src: &[f32], scale: f32);
    /// Widens `src` into `dst` (equal lengths) at `scale` (FP8 only).
    fn get(src: &[Self], dst: &mut [f32], scale: f32);
}

impl KvElem for f32 {
    fn put(dst: &mut [f32], src: &[f32], _: f32) {
        dst.copy_from_slice(src);
    }
    fn get(src: &[f32], dst: &mut [f32], _: f32) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for bf16 {
    fn put(dst: &mut [bf16], src: &[f32], _: f32) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = bf16::from_f32(s);
        }
    }
    fn get(src: &[bf16], dst: &mut [f32], _: f32) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }
}

/// A byte is an FP8 e4m3 value ([`crate::fp8`]): the only byte-wide K/V type.
impl KvElem for u8 {
    fn put(dst: &mut [u8], src: &[f32], scale: f32) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = crate::fp8::encode(s / scale);
        }
    }
    fn get(src: &[u8], dst: &mut [f32], scale: f32) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = crate::fp8::decode(s) * scale;
        }
    }
}

/// What `x` stored as `dtype` (at `scale`, FP8 only) reads back as.
pub fn kv_round(dtype: KvCacheDtype, x: f32, scale: f32) -> f32 {
    let mut out = [0f32];
    match dtype {
        KvCacheDtype::F32 => return x,
        KvCacheDtype::Bf16 => {
            let mut e = [bf16::ZERO];
            bf16::put(&mut e, &[x], scale);
            bf16::get(&e, &mut out, scale);
        }
        KvCacheDtype::Fp8 => {
            let mut e = [0u8];
            u8::put(&mut e, &[x], scale);
            u8::get(&e, &mut out, scale);
        }
    }
    out[0]
}

/// One K or V cache in its stored type.
#[derive(Debug, Clone, PartialEq)]
pub enum KvCache {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    /// e4m3 bytes and the array's scale.
    Fp8(Vec<u8>, f32),
}

/// A read-only view of a [`KvCache`].
#[derive(Debug, Clone, Copy)]
pub enum KvView<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    Fp8(&'a [u8], f32),
}

impl KvCache {
    /// `len` zeroed elements of `dtype`; `scale` is FP8's (ignored otherwise).
    pub fn zeroed(dtype: KvCacheDtype, len: usize, scale: f32) -> KvCache {
        match dtype {
            KvCacheDtype::F32 => KvCache::F32(vec![0.0; len]),
            KvCacheDtype::Bf16 => KvCache::Bf16(vec![bf16::ZERO; len]),
            KvCacheDtype::Fp8 => KvCache::Fp8(vec![0u8; len], scale),
        }
    }

    /// The stored type.
    pub fn dtype(&self) -> KvCacheDtype {
        match self {
            KvCache::F32(_) => KvCacheDtype::F32,
            KvCache::Bf16(_) => KvCacheDtype::Bf16,
            KvCache::Fp8(..) => KvCacheDtype::Fp8,
        }
    }

    /// The cache, read-only.
    pub fn view(&self) -> KvView<'_> {
        match self {
            KvCache::F32(v) => KvView::F32(v),
            KvCache::Bf16(v) => KvView::Bf16(v),
            KvCache::Fp8(v, s) => KvView::Fp8(v, *s),
        }
    }

    /// Stores `src` at elements `at..at + src.len()`.
    pub fn put(&mut self, at: usize, src: &[f32]) {
        let n = src.len();
        match self {
            KvCache::F32(v) => f32::put(&mut v[at..at + n], src, 1.0),
            KvCache::Bf16(v) => bf16::put(&mut v[at..at + n], src, 1.0),
            KvCache::Fp8(v, s) => u8::put(&mut v[at..at + n], src, *s),
        }
    }
}

impl KvView<'_> {
    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            KvView::F32(v) => v.len(),
            KvView::Bf16(v) => v.len(),
            KvView::Fp8(v, _) => v.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Widens elements `at..at + dst.len()` into `dst`.
    pub fn get(&self, at: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self {
            KvView::F32(v) => f32::get(&v[at..at + n], dst, 1.0),
            KvView::Bf16(v) => bf16::get(&v[at..at + n], dst, 1.0),
            KvView::Fp8(v, s) => u8::get(&v[at..at + n], dst, *s),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_within_its_precision() {
        let xs: Vec<f32> = (0..200).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        for (dtype, scale, rel) in [
            (KvCacheDtype::F32, 1.0, 0.0),
            (KvCacheDtype::Bf16, 1.0, 1.0 / 256.0),
            (KvCacheDtype::Fp8, 1.0, 1.0 / 16.0),
            (KvCacheDtype::Fp8, 0.01, 1.0 / 16.0),
        ] {
            let mut c = KvCache::zeroed(dtype, xs.len() + 3, scale);
            assert_eq!(c.dtype(), dtype);
            c.put(3, &xs);
            let mut back = vec![0f32; xs.len()];
            c.view().get(3, &mut back);
            for (&x, &y) in xs.iter().zip(&back) {
                assert_eq!(y, kv_round(dtype, x, scale), "{dtype} {x}");
                // below e4m3's normal range the error is absolute (2^-9 · scale)
                let tol = rel * x.abs()
                    + if dtype == KvCacheDtype::Fp8 {
                        scale / 512.0
                    } else {
                        0.0
                    };
                assert!(
                    (x - y).abs() <= tol,
                    "{dtype} scale {scale}: {x} read back as {y}"
                );
            }
        }
    }

    #[test]
    fn fp8_saturates_at_its_scaled_range_and_keeps_exact_values() {
        let mut c = KvCache::zeroed(KvCacheDtype::Fp8, 3, 0.5);
        c.put(0, &[1e6, -1e6, 1.25]);
        let mut back = [0f32; 3];
        c.view().get(0, &mut back);
        assert_eq!(back, [224.0, -224.0, 1.25]);
    }
}
