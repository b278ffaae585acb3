//! GPU tests of the tensor-core flash prefill kernel against `ops::paged_attention`
//! (odd lengths, packed sequences, chunked prefill against the whole prompt,
//! GQA 32/8, 9/3 and 16/2, head sizes 64 and 128, scrambled block tables,
//! poisoned outputs, sliding windows and score scales against
//! `ops::attention::paged_attention_with`), over bf16 and FP8 e4m3 caches (every tiling, the
//! reference reading the values the bytes read back as). Part of the
//! `gpu_attention` test binary; `#[ignore]`d: they need a CUDA device.

use crate::common::*;
use gpu::{DeviceBuffer, Gpu};
use half::bf16;
use kernels::flash_prefill::FlashTiles;
use kernels::prefill_attention::PrefillParams;
use kernels::{HeadShape, Kernels};
use ops::attention::{ScoreRule, paged_attention_with, positions_of};
use ops::{KvView, PagedSeqs};
use rand::SeedableRng;
use rand::rngs::StdRng;

const BLOCK: usize = 16;

/// One batch on the device: random caches and qkv, a poisoned output.
struct Case {
    b: PagedBatch,
    seqs: Vec<(usize, usize)>,
    shape: HeadShape,
    kc: Vec<bf16>,  // [slots, kv_heads, D]
    vc: Vec<bf16>,  // [slots, kv_heads, D]
    qkv: Vec<bf16>, // [T, qkv_width]
    /// The caches go to the device as e4m3 bytes (`TestKv`).
    fp8: bool,
    /// The layer's scale and window, for the kernel and the reference.
    rule: ScoreRule,
}

impl Case {
    fn new(rng: &mut StdRng, shape: HeadShape, seqs: &[(usize, usize)]) -> Case {
        let b = paged_batch(rng, seqs, BLOCK);
        let slots = b.num_blocks * BLOCK;
        let tokens = *b.cu.last().unwrap() as usize;
        Case {
            kc: rand_bf16(rng, slots * shape.kv_width(), 1.0),
            vc: rand_bf16(rng, slots * shape.kv_width(), 1.0),
            qkv: rand_bf16(rng, tokens * shape.qkv_width(), 1.0),
            b,
            seqs: seqs.to_vec(),
            shape,
            fp8: false,
            rule: ScoreRule::causal(shape.head_dim),
        }
    }

    /// The K and V values the kernels read: bf16, or what the e4m3 bytes
    /// read back as.
    fn kv_values(&self) -> (Vec<f32>, Vec<f32>) {
        let f = |x: &[bf16], scale: f32| kv_rounded(&f32s(x), self.fp8, scale);
        (f(&self.kc, FP8_K_SCALE), f(&self.vc, FP8_V_SCALE))
    }

    fn params(&self) -> PrefillParams {
        PrefillParams {
            shape: self.shape,
            tokens: *self.b.cu.last().unwrap() as usize,
            num_seqs: self.seqs.len(),
            max_seqlen: self.seqs.iter().map(|s| s.0).max().unwrap(),
            max_blocks: self.b.max_blocks,
            block_size: BLOCK,
            rule: self.rule,
        }
    }

    /// Runs the flash kernel with `tiles` (the old one when `None`) and returns `[T, heads * D]`.
    fn run(&self, gpu: &Gpu, k: &Kernels, tiles: Option<FlashTiles>) -> Vec<f32> {
        let p = self.params();
        let dev = Dev::new(gpu, self);
        let out = gpu
            .alloc::<bf16>(p.tokens * self.shape.num_heads * self.shape.head_dim)
            .unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        dev.launch(k, &out, p, tiles);
        f32s(&gpu.to_host(out.view()).unwrap())
    }

    /// `[T, heads * D]` query rows of the tokens `rows` of the batch.
    fn q_rows(&self, rows: std::ops::Range<usize>) -> Vec<f32> {
        let (w, qw) = (
            self.shape.qkv_width(),
            self.shape.num_heads * self.shape.head_dim,
        );
        rows.flat_map(|t| f32s(&self.qkv[t * w..][..qw])).collect()
    }

    /// CPU reference for tokens `i0..i1` of sequence `s` (a sub-batch of one
    /// segment ending at position `ctx - len + i1 - 1`).
    fn reference(&self, s: usize, i0: usize, i1: usize) -> Vec<f32> {
        let (len, ctx) = self.seqs[s];
        let t0 = self.b.cu[s] as usize;
        let cu = [0, (i1 - i0) as u32];
        let cl = [(ctx - len + i1) as u32];
        let positions = positions_of(&cu, &cl);
        let seq = PagedSeqs {
            cu_seqlens: &cu,
            positions: &positions,
            block_tables: &self.b.tables[s * self.b.max_blocks..][..self.b.max_blocks],
            max_blocks: self.b.max_blocks,
            block_size: BLOCK,
        };
        let q = self.q_rows(t0 + i0..t0 + i1);
        let (kv, vv) = self.kv_values();
        let (k, v) = (KvView::F32(&kv), KvView::F32(&vv));
        paged_attention_with(&q, k, v, seq, dims(self.shape), self.rule)
    }
}

/// Device copies of a case's inputs.
struct Dev {
    cache: TestKv,
    qkv: DeviceBuffer<bf16>,
    cu: DeviceBuffer<u32>,
    ctx: DeviceBuffer<u32>,
    tab: DeviceBuffer<u32>,
}

impl Dev {
    fn new(gpu: &Gpu, c: &Case) -> Dev {
        Dev {
            cache: TestKv::new(gpu, &c.kc, &c.vc, c.fp8),
            qkv: gpu.upload(&c.qkv).unwrap(),
            cu: gpu.upload(&c.b.cu).unwrap(),
            ctx: gpu.upload(&c.b.ctx).unwrap(),
            tab: gpu.upload(&c.b.tables).unwrap(),
        }
    }

    fn launch(
        &self,
        k: &Kernels,
        out: &DeviceBuffer<bf16>,
        p: PrefillParams,
        tiles: Option<FlashTiles>,
    ) {
        let (q, kv) = (self.qkv.view(), self.cache.caches());
        let (cu, ctx, tab) = (self.cu.view(), self.ctx.view(), self.tab.view());
        // SAFETY: paged_batch builds consistent metadata, every block id < num_blocks.
        let r = unsafe {
            match tiles {
                None => k.prefill_attention(q, kv, cu, ctx, tab, out.view(), p),
                Some(t) => k.flash(t, 1..=u32::MAX, q, kv, cu, ctx, tab, out.view(), p),
            }
        };
        r.unwrap();
    }
}

/// The prefill tilings this device runs: `Wide`, and `Hopper` on compute
/// capability 9.0 (each is checked on its own).
/// The prefill tilings this device runs at head size `d`.
fn prefill_tilings(k: &Kernels, d: usize) -> Vec<FlashTiles> {
    let mut t = vec![FlashTiles::Wide];
    if k.has_flash_hopper() {
        t.push(FlashTiles::Hopper);
    }
    t.retain(|t| t.serves(d));
    t
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Checks `got` (the whole batch) against the reference on every segment, or
/// on three 64-token windows of segments longer than 1,100 tokens.
fn check(c: &Case, got: &[f32], what: &str) {
    let qw = c.shape.num_heads * c.shape.head_dim;
    for (s, &(len, _)) in c.seqs.iter().enumerate() {
        let windows = if len > 1100 {
            vec![(0, 64), (len / 2 - 31, len / 2 + 33), (len - 64, len)]
        } else {
            vec![(0, len)]
        };
        for (i0, i1) in windows {
            let t0 = c.b.cu[s] as usize;
            let g = &got[(t0 + i0) * qw..(t0 + i1) * qw];
            let want = c.reference(s, i0, i1);
            let (e, a) = (rel_err(g, &want), max_abs(g, &want));
            assert!(
                e < 1e-2 && a < 2e-2,
                "{what} {:?} seq {s} {:?} rows {i0}..{i1}: rel err {e}, max abs err {a}",
                c.shape,
                c.seqs[s]
            );
        }
    }
}

const FLASH_SHAPES: [HeadShape; 5] = [
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
        num_heads: 32,
        num_kv_heads: 8,
        head_dim: 128,
    },
    HeadShape {
        num_heads: 16,
        num_kv_heads: 2,
        head_dim: 128,
    },
    // Gemma 3's heads (Hopper and narrow tilings only)
    HeadShape {
        num_heads: 4,
        num_kv_heads: 1,
        head_dim: 256,
    },
];

#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_prefill_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(11);
    let cases: [&[(usize, usize)]; 4] = [
        &[
            (1, 1),
            (7, 7),
            (63, 63),
            (64, 64),
            (65, 65),
            (300, 300),
            (1000, 1000),
        ],
        &[
            (5, 40),
            (33, 1200),
            (1, 17),
            (64, 129),
            (100, 1000),
            (17, 17),
        ],
        &[(5000, 5000)],
        &[(1, 1)],
    ];
    for shape in FLASH_SHAPES {
        for seqs in cases {
            let c = Case::new(&mut rng, shape, seqs);
            let tilings = prefill_tilings(&k, shape.head_dim);
            assert_eq!(k.flash_prefill_supports(&c.params()), !tilings.is_empty());
            for t in tilings {
                check(&c, &c.run(&gpu, &k, Some(t)), &format!("flash {t:?}"));
            }
        }
    }
}

/// The narrow tiling (one warp, 16 rows: decode steps at large batch) on
/// decode-shaped batches (one token per sequence, odd contexts) and on
/// multi-token segments, which it serves too.
#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_narrow_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(14);
    let decode: Vec<(usize, usize)> = [1usize, 2, 15, 16, 17, 63, 64, 65, 300, 1001, 2047]
        .iter()
        .map(|&c| (1, c))
        .collect();
    let cases: [&[(usize, usize)]; 2] = [&decode, &[(7, 7), (33, 1200), (1, 17), (5, 40)]];
    for shape in FLASH_SHAPES {
        for seqs in cases {
            let c = Case::new(&mut rng, shape, seqs);
            assert!(k.flash_supports(FlashTiles::Narrow, &c.params()));
            for t in [
                FlashTiles::Narrow,
                FlashTiles::NarrowSmall,
                FlashTiles::NarrowTiny,
            ] {
                check(&c, &c.run(&gpu, &k, Some(t)), &format!("flash {t:?}"));
            }
        }
    }
    // a mixed step: one-token segments on the narrow tiling, the rest on the
    // wide one, two launches into one output; each leaves the other's rows alone
    let mixed: &[(usize, usize)] = &[(1, 300), (40, 40), (1, 17), (129, 1000), (1, 1), (2, 65)];
    for (shape, wide) in FLASH_SHAPES.into_iter().flat_map(|s| {
        prefill_tilings(&k, s.head_dim)
            .into_iter()
            .map(move |t| (s, t))
    }) {
        let c = Case::new(&mut rng, shape, mixed);
        let p = c.params();
        let dev = Dev::new(&gpu, &c);
        let out = gpu
            .alloc::<bf16>(p.tokens * shape.num_heads * shape.head_dim)
            .unwrap();
        gpu.fill_bytes(out.view(), POISON).unwrap();
        let (q, kv) = (dev.qkv.view(), dev.cache.caches());
        let (cu, ctx, tab) = (dev.cu.view(), dev.ctx.view(), dev.tab.view());
        let o = out.view();
        // SAFETY: paged_batch builds consistent metadata, every block id < num_blocks.
        unsafe {
            k.flash(wide, 2..=u32::MAX, q, kv, cu, ctx, tab, o, p)
                .unwrap();
            k.flash(FlashTiles::Narrow, 1..=1, q, kv, cu, ctx, tab, o, p)
                .unwrap();
        }
        let got = f32s(&gpu.to_host(out.view()).unwrap());
        check(&c, &got, &format!("flash mixed {wide:?}"));
    }
}

/// A chunk whose earlier positions are cached gives the whole prompt's rows.
#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_prefill_chunk_matches_whole_prompt() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(12);
    for (shape, tiles) in FLASH_SHAPES.into_iter().flat_map(|s| {
        prefill_tilings(&k, s.head_dim)
            .into_iter()
            .map(move |t| (s, t))
    }) {
        let n = 777;
        let whole = Case::new(&mut rng, shape, &[(n, n)]);
        let full = whole.run(&gpu, &k, Some(tiles));
        let qw = shape.num_heads * shape.head_dim;
        for chunk in [1usize, 63, 200, n] {
            // Same caches and block table, q of the last `chunk` tokens only.
            let mut c = Case {
                b: PagedBatch {
                    cu: vec![0, chunk as u32],
                    ctx: vec![n as u32],
                    tables: whole.b.tables.clone(),
                    max_blocks: whole.b.max_blocks,
                    num_blocks: whole.b.num_blocks,
                },
                seqs: vec![(chunk, n)],
                shape,
                kc: whole.kc.clone(),
                vc: whole.vc.clone(),
                qkv: Vec::new(),
                fp8: false,
                rule: whole.rule,
            };
            let w = shape.qkv_width();
            c.qkv = whole.qkv[(n - chunk) * w..].to_vec();
            let got = c.run(&gpu, &k, Some(tiles));
            let want = &full[(n - chunk) * qw..];
            let a = max_abs(&got, want);
            assert!(
                a < 1e-2,
                "{tiles:?} {shape:?} chunk {chunk} of {n}: max abs diff {a}"
            );
            check(&c, &got, "flash chunk");
        }
    }
}

/// FP8 e4m3 caches on every tiling (prefill: `Wide` and `Hopper` where the
/// device has it; decode rows: the three narrow key tiles) and on the
/// scalar kernel, against attention over the values the bytes read back as.
#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_fp8_cache_matches_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(15);
    let prefill: &[(usize, usize)] = &[(1, 1), (65, 65), (300, 300), (33, 1200), (1, 17)];
    let decode: Vec<(usize, usize)> = [1usize, 16, 17, 65, 300, 1001]
        .iter()
        .map(|&c| (1, c))
        .collect();
    for shape in FLASH_SHAPES {
        let mut c = Case::new(&mut rng, shape, prefill);
        c.fp8 = true;
        for t in prefill_tilings(&k, shape.head_dim) {
            check(&c, &c.run(&gpu, &k, Some(t)), &format!("fp8 flash {t:?}"));
        }
        check(&c, &c.run(&gpu, &k, None), "fp8 scalar prefill");
        let mut c = Case::new(&mut rng, shape, &decode);
        c.fp8 = true;
        for t in [
            FlashTiles::Narrow,
            FlashTiles::NarrowSmall,
            FlashTiles::NarrowTiny,
        ] {
            check(&c, &c.run(&gpu, &k, Some(t)), &format!("fp8 flash {t:?}"));
        }
    }
}

/// Sliding windows and score scales on every tiling (prefill: `Wide` and
/// `Hopper` where the device has it, and the scalar kernel; decode rows:
/// the three narrow key tiles), bf16 and FP8 caches: prompts longer than
/// every window, a chunk whose cached prefix is longer than the window,
/// one-token rows at contexts around the windows.
#[test]
#[ignore = "needs a CUDA GPU"]
fn flash_windows_match_reference() {
    let (gpu, k) = setup();
    let mut rng = StdRng::seed_from_u64(17);
    let prefill: &[(usize, usize)] = &[(700, 700), (40, 900), (1, 513), (65, 65), (130, 1300)];
    let decode: Vec<(usize, usize)> = [1usize, 17, 18, 100, 101, 513, 1001, 2047]
        .iter()
        .map(|&c| (1, c))
        .collect();
    for (shape, fp8) in FLASH_SHAPES
        .into_iter()
        .flat_map(|s| [(s, false), (s, true)])
    {
        for rule in rules(shape.head_dim) {
            let mut c = Case::new(&mut rng, shape, prefill);
            (c.fp8, c.rule) = (fp8, rule);
            let what = |t: &str| format!("{t} {rule:?} fp8 {fp8}");
            for t in prefill_tilings(&k, shape.head_dim) {
                check(&c, &c.run(&gpu, &k, Some(t)), &what(&format!("{t:?}")));
            }
            check(&c, &c.run(&gpu, &k, None), &what("scalar prefill"));
            let mut c = Case::new(&mut rng, shape, &decode);
            (c.fp8, c.rule) = (fp8, rule);
            for t in [
                FlashTiles::Narrow,
                FlashTiles::NarrowSmall,
                FlashTiles::NarrowTiny,
            ] {
                check(&c, &c.run(&gpu, &k, Some(t)), &what(&format!("{t:?}")));
            }
        }
    }
}
