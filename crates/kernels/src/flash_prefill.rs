//! Launcher for `cu/flash_prefill.cu`: tensor-core (mma.sync bf16)
//! FlashAttention-2 prefill over packed variable-length sequences, reading
//! every key and value from the paged cache; same contract and semantics as
//! [`Kernels::prefill_attention`] (causal, GQA, the layer's scale and
//! sliding window), for the head sizes in [`FLASH_HEAD_DIMS`] and at most
//! [`FLASH_MAX_GROUP`] query heads per KV head
//! ([`Kernels::flash_prefill_supports`]). At head size 256 the wide
//! mma.sync tiling is not built (a 128-row CTA would hold
//! `(128 + 4 * 64) * 256 * 2` = 192 KiB of tiles and 256 f32 accumulators a
//! thread: spills), so prefill there runs the Hopper tiling or, on other
//! devices, the scalar prefill kernel; an entry whose shared memory exceeds
//! the device's per-block limit is left out the same way.
//! Two tilings of the same kernel ([`FlashTiles`]): `Wide` (prefill: 128
//! query rows = tokens x heads per CTA of 4 warps, two m16 tiles a warp) and
//! `Narrow` (decode steps at large batch: 16 rows, one warp per CTA, so a
//! one-token query does not drag 112 rows of padding through the MMAs).
//! Costs: one launch of `ceil(max_seqlen / (rows / G)) x S x kv_heads` CTAs
//! and `(rows + 4 * 64) * D * 2` bytes of shared memory each; O(Σ seqlen ·
//! context · D) tensor-core FLOPs, K/V read once per query tile; no T x T
//! buffer, no atomics (deterministic).

use gpu::{DevSlice, Function, LaunchConfig, Module};
use half::bf16;

use crate::abi::FlashPrefillArgs;
use crate::kv::KvCaches;
use crate::prefill_attention::PrefillParams;
use crate::{KernelError, Kernels, need, rule_args, u32_of};

/// Head sizes the flash kernel is instantiated for (the wide tiling: the
/// first two only; see [`FlashTiles::serves`]).
pub const FLASH_HEAD_DIMS: [usize; 3] = [64, 128, 256];
use crate::consts::{
    FLASH_HOPPER_ALIGN, FLASH_HOPPER_KEYS, FLASH_HOPPER_ROWS, FLASH_HOPPER_THREADS, FLASH_KEYS,
    FLASH_NARROW_KEYS, FLASH_NARROW_ROWS, FLASH_NARROW_SMALL_KEYS, FLASH_NARROW_THREADS,
    FLASH_NARROW_TINY_KEYS, FLASH_ROWS, FLASH_THREADS,
};

/// Which tiling of the flash kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashTiles {
    /// 128 query rows (tokens x heads of one KV head) per CTA of 4 warps: prefill.
    Wide,
    /// 16 query rows per CTA of one warp: decode steps (one token per
    /// sequence) with enough sequences to fill the GPU without splitting keys.
    /// [`Kernels::flash`] runs it with 64-, 32- or 16-key tiles: the largest
    /// whose grid fits on the device in one wave.
    Narrow,
    /// `Narrow` with 32-key tiles: half the shared memory, twice the CTAs an
    /// SM holds, more loop overhead a key.
    NarrowSmall,
    /// `Narrow` with 16-key tiles.
    NarrowTiny,
    /// 128 query rows per CTA of two warpgroups, both products on Hopper's
    /// warpgroup MMAs (`wgmma`): prefill on compute capability 9.0 only
    /// ([`Kernels::has_flash_hopper`]).
    Hopper,
}

impl FlashTiles {
    /// Every tiling, in the order of their entries in `Kernels::flash_prefill`.
    const ALL: [FlashTiles; 5] = [
        FlashTiles::Wide,
        FlashTiles::Narrow,
        FlashTiles::Hopper,
        FlashTiles::NarrowSmall,
        FlashTiles::NarrowTiny,
    ];

    /// Whether `cu/flash_prefill.cu` builds this tiling for head size `d`
    /// (of [`FLASH_HEAD_DIMS`]): the wide one up to 128 only.
    pub const fn serves(self, d: usize) -> bool {
        !matches!(self, FlashTiles::Wide) || d <= 128
    }

    /// Query rows (tokens x query heads of one KV head) of one CTA.
    pub const fn rows(self) -> usize {
        match self {
            FlashTiles::Wide => FLASH_ROWS,
            FlashTiles::Narrow | FlashTiles::NarrowSmall | FlashTiles::NarrowTiny => {
                FLASH_NARROW_ROWS
            }
            FlashTiles::Hopper => FLASH_HOPPER_ROWS,
        }
    }
    const fn threads(self) -> u32 {
        match self {
            FlashTiles::Wide => FLASH_THREADS as u32,
            FlashTiles::Narrow | FlashTiles::NarrowSmall | FlashTiles::NarrowTiny => {
                FLASH_NARROW_THREADS as u32
            }
            FlashTiles::Hopper => FLASH_HOPPER_THREADS as u32,
        }
    }
    const fn name(self) -> &'static str {
        match self {
            FlashTiles::Wide => "flash_prefill",
            FlashTiles::Narrow => "flash_narrow",
            FlashTiles::NarrowSmall => "flash_narrow_small",
            FlashTiles::NarrowTiny => "flash_narrow_tiny",
            FlashTiles::Hopper => "flash_hopper",
        }
    }
    const fn keys(self) -> usize {
        match self {
            FlashTiles::Wide => FLASH_KEYS,
            FlashTiles::Narrow => FLASH_NARROW_KEYS,
            FlashTiles::NarrowSmall => FLASH_NARROW_SMALL_KEYS,
            FlashTiles::NarrowTiny => FLASH_NARROW_TINY_KEYS,
            FlashTiles::Hopper => FLASH_HOPPER_KEYS,
        }
    }
    /// Dynamic shared memory of one CTA: Q tile plus double-buffered K and V
    /// tiles (plus the Hopper tiling's alignment slack). FP8 caches take the
    /// same: one bf16 K and V tile plus double-buffered e4m3 byte tiles.
    fn shared_bytes(self, head_dim: usize) -> usize {
        let slack = match self {
            FlashTiles::Hopper => FLASH_HOPPER_ALIGN,
            _ => 0,
        };
        (self.rows() + 4 * self.keys()) * head_dim * size_of::<bf16>() + slack
    }
    /// Index of this tiling's entry point for head size
    /// `FLASH_HEAD_DIMS[dim_idx]` in `Kernels::flash_prefill`.
    fn slot(self, dim_idx: usize) -> usize {
        let t = Self::ALL
            .iter()
            .position(|&t| t == self)
            .unwrap_or_default();
        t * FLASH_HEAD_DIMS.len() + dim_idx
    }
}

/// Most query heads per KV head one (wide) CTA can pack.
pub const FLASH_MAX_GROUP: usize = FLASH_ROWS;

/// The flash entry points, one per tiling and head size
/// ([`FlashTiles::slot`]), `None` where the tiling is not built for that
/// size or its shared memory exceeds the device's per-block limit
/// (`max_smem`), with each one's dynamic shared memory. With `fp8` their
/// `_fp8` twins over e4m3 caches, which take the same shared memory.
pub(crate) type FlashEntries = Vec<Option<(Function, u32)>>;

/// Resolves [`FlashEntries`] and allows their shared memory.
pub(crate) fn load_functions(
    module: &Module,
    fp8: bool,
    max_smem: usize,
) -> Result<FlashEntries, KernelError> {
    let suffix = if fp8 { "_fp8" } else { "" };
    let mut out = Vec::with_capacity(FlashTiles::ALL.len() * FLASH_HEAD_DIMS.len());
    for tiles in FlashTiles::ALL {
        for d in FLASH_HEAD_DIMS {
            let bytes = tiles.shared_bytes(d);
            if !tiles.serves(d) || bytes > max_smem {
                out.push(None);
                continue;
            }
            let func = module.function(&format!("{}{suffix}_d{d}", tiles.name()))?;
            func.set_max_dynamic_shared(bytes)?;
            out.push(Some((func, bytes as u32)));
        }
    }
    Ok(out)
}

impl Kernels {
    /// Whether [`Kernels::flash_prefill`] serves `p`'s head shape.
    pub fn flash_prefill_supports(&self, p: &PrefillParams) -> bool {
        self.flash_supports(self.prefill_tiles(), p)
    }

    /// Whether this device runs the Hopper (wgmma) tiling: compute
    /// capability 9.0 and [`crate::KernelOptions::wgmma`] set.
    pub fn has_flash_hopper(&self) -> bool {
        self.flash_hopper
    }

    /// The tiling prefill runs with: `Hopper` where the device has it, else `Wide`.
    pub fn prefill_tiles(&self) -> FlashTiles {
        if self.flash_hopper {
            FlashTiles::Hopper
        } else {
            FlashTiles::Wide
        }
    }

    /// Whether the `tiles` variant serves `p`'s head shape (a CTA must hold
    /// at least one token's G query heads) on this device.
    pub fn flash_supports(&self, tiles: FlashTiles, p: &PrefillParams) -> bool {
        let s = p.shape;
        (tiles != FlashTiles::Hopper || self.flash_hopper)
            && self.flash_entry(tiles, s.head_dim, false).is_some()
            && s.num_kv_heads > 0
            && s.num_heads.is_multiple_of(s.num_kv_heads)
            && s.group() <= tiles.rows()
    }

    /// The entry point of `tiles` for head size `d` (over FP8 caches with
    /// `fp8`) and its dynamic shared memory, where this device has one.
    fn flash_entry(&self, tiles: FlashTiles, d: usize, fp8: bool) -> Option<&(Function, u32)> {
        let idx = FLASH_HEAD_DIMS.iter().position(|&x| x == d)?;
        let entries = if fp8 {
            &self.flash_prefill8
        } else {
            &self.flash_prefill
        };
        entries.get(tiles.slot(idx))?.as_ref()
    }

    /// `out[t, h*D..] = softmax(q_t·Kᵀ · scale) V` over the cached
    /// positions `rule.first(pos(t))..=pos(t)` of `t`'s sequence (causal,
    /// within the window), on tensor cores.
    ///
    /// # Safety
    /// As [`Kernels::prefill_attention`]: `cu_seqlens`, `context_lens` and
    /// `block_tables` describe a valid batch whose every block id indexes
    /// inside the caches, `max_seqlen` bounds every segment, and the K/V of
    /// every position up to each context length were written.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn flash_prefill(
        &self,
        qkv: DevSlice<'_, bf16>,         // [T, qkv_width], q roped
        kv: KvCaches<'_>,                // [slots, kv_heads, D] each
        cu_seqlens: DevSlice<'_, u32>,   // [S + 1]
        context_lens: DevSlice<'_, u32>, // [S]
        block_tables: DevSlice<'_, u32>, // [S, max_blocks]
        out: DevSlice<'_, bf16>,         // [T, heads * D]
        p: PrefillParams,
    ) -> Result<(), KernelError> {
        // SAFETY: the caller upholds this function's contract, which is flash's.
        unsafe {
            self.flash(
                self.prefill_tiles(),
                1..=u32::MAX,
                qkv,
                kv,
                cu_seqlens,
                context_lens,
                block_tables,
                out,
                p,
            )
        }
    }

    /// [`Kernels::flash_prefill`] with the tiling chosen by the caller
    /// (`Narrow` for decode steps at large batch), for the sequences whose
    /// segment length lies in `seg_lens` (the others' rows are left alone, for
    /// another launch: a mixed step sends its one-token segments to `Narrow`
    /// and the rest to `Wide`).
    ///
    /// # Safety
    /// As [`Kernels::flash_prefill`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn flash(
        &self,
        tiles: FlashTiles,
        seg_lens: std::ops::RangeInclusive<u32>,
        qkv: DevSlice<'_, bf16>,         // [T, qkv_width], q roped
        kv: KvCaches<'_>,                // [slots, kv_heads, D] each
        cu_seqlens: DevSlice<'_, u32>,   // [S + 1]
        context_lens: DevSlice<'_, u32>, // [S]
        block_tables: DevSlice<'_, u32>, // [S, max_blocks]
        out: DevSlice<'_, bf16>,         // [T, heads * D]
        p: PrefillParams,
    ) -> Result<(), KernelError> {
        let (cu, ctx, tab) = (cu_seqlens, context_lens, block_tables);
        // SAFETY: forwarded from this function's contract.
        unsafe { self.flash_upto(tiles, seg_lens, u32::MAX, qkv, kv, cu, ctx, tab, out, p) }
    }

    /// [`Kernels::flash`] on the rows whose context (position + 1) is at
    /// most `max_ctx` only (the others' rows are left alone, for the decode
    /// kernel's launch with [`crate::decode_attention::DecodeParams::min_ctx`]);
    /// the mma.sync tilings only (not `Hopper`).
    ///
    /// # Safety
    /// As [`Kernels::flash_prefill`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn flash_upto(
        &self,
        tiles: FlashTiles,
        seg_lens: std::ops::RangeInclusive<u32>,
        max_ctx: u32,
        qkv: DevSlice<'_, bf16>,         // [T, qkv_width], q roped
        kv: KvCaches<'_>,                // [slots, kv_heads, D] each
        cu_seqlens: DevSlice<'_, u32>,   // [S + 1]
        context_lens: DevSlice<'_, u32>, // [S]
        block_tables: DevSlice<'_, u32>, // [S, max_blocks]
        out: DevSlice<'_, bf16>,         // [T, heads * D]
        p: PrefillParams,
    ) -> Result<(), KernelError> {
        if tiles == FlashTiles::Hopper && max_ctx != u32::MAX {
            return Err(KernelError::Unsupported {
                kernel: "flash_hopper",
                reason: format!("a context limit ({max_ctx} keys): the mma.sync tilings only"),
            });
        }
        let s = p.shape;
        // Narrow: the largest key tile whose grid fits on the device in one
        // wave (CTAs an SM holds by shared memory, 1 KiB a CTA reserved by
        // the driver, at most 32), else the smallest.
        let tiles = if tiles == FlashTiles::Narrow {
            let tok_per_cta = (tiles.rows() / s.group().max(1)).max(1);
            let ctas = s.num_kv_heads * p.num_seqs * p.max_seqlen.div_ceil(tok_per_cta);
            let fits = |t: FlashTiles| {
                self.flash_entry(t, s.head_dim, false)
                    .is_some_and(|(_, smem)| {
                        let per_sm = self.smem_per_sm / (*smem as usize + 1024);
                        ctas <= self.sms * per_sm.clamp(1, 32)
                    })
            };
            [FlashTiles::Narrow, FlashTiles::NarrowSmall]
                .into_iter()
                .find(|&t| fits(t))
                .unwrap_or(FlashTiles::NarrowTiny)
        } else {
            tiles
        };
        let kname = tiles.name();
        let (scale, window) = rule_args(kname, &p.rule)?;
        if !self.flash_supports(tiles, &p) {
            return Err(KernelError::Unsupported {
                kernel: kname,
                reason: format!(
                    "{s:?} (head dims {FLASH_HEAD_DIMS:?} where built for this tiling and device, \
                     at most {} query heads per KV head)",
                    tiles.rows()
                ),
            });
        }
        let Some((func, smem)) = self.flash_entry(tiles, s.head_dim, kv.is_fp8()) else {
            return Err(KernelError::Unsupported {
                kernel: kname,
                reason: format!("head dim {} over this K/V cache dtype", s.head_dim),
            });
        };
        let smem = *smem;
        need(kname, "qkv", &qkv, p.tokens * s.qkv_width())?;
        need(kname, "cu_seqlens", &cu_seqlens, p.num_seqs + 1)?;
        need(kname, "context_lens", &context_lens, p.num_seqs)?;
        need(
            kname,
            "block_tables",
            &block_tables,
            p.num_seqs * p.max_blocks,
        )?;
        need(kname, "out", &out, p.tokens * s.num_heads * s.head_dim)?;
        kv.need(kname, p.block_size * s.kv_width())?;
        if p.tokens == 0 || p.num_seqs == 0 || p.max_seqlen == 0 {
            return Ok(());
        }
        let tok_per_tile = tiles.rows() / s.group();
        let q_tiles = p.max_seqlen.div_ceil(tok_per_tile);
        if q_tiles > 65_535 {
            return Err(KernelError::Unsupported {
                kernel: kname,
                reason: format!(
                    "a {}-token segment needs {q_tiles} query tiles of {tok_per_tile} tokens; \
                     the grid holds 65,535 (use shorter prefill chunks)",
                    p.max_seqlen
                ),
            });
        }
        let cfg = LaunchConfig {
            // query tiles slowest (gridDim.z <= 65,535: 2M+ tokens), heaviest first
            grid: (
                u32_of(kname, "num_kv_heads", s.num_kv_heads)?,
                u32_of(kname, "num_seqs", p.num_seqs)?,
                q_tiles as u32,
            ),
            block: (tiles.threads(), 1, 1),
            shared_bytes: smem,
        };
        let (k_cache, v_cache) = kv.ptrs();
        let (k_scale, v_scale) = kv.scales();
        let args = FlashPrefillArgs {
            qkv: qkv.ptr(),
            k_cache,
            v_cache,
            cu_seqlens: cu_seqlens.ptr(),
            context_lens: context_lens.ptr(),
            block_tables: block_tables.ptr(),
            out: out.ptr(),
            max_blocks: u32_of(kname, "max_blocks", p.max_blocks)?,
            num_heads: u32_of(kname, "num_heads", s.num_heads)?,
            num_kv_heads: u32_of(kname, "num_kv_heads", s.num_kv_heads)?,
            block_size: u32_of(kname, "block_size", p.block_size)?,
            tok_per_tile: tok_per_tile as u32,
            scale_log2: std::f32::consts::LOG2_E * scale,
            min_len: *seg_lens.start(),
            max_len: *seg_lens.end(),
            k_scale,
            v_scale,
            max_ctx,
            window,
        };
        // SAFETY: dense views checked above; the batch metadata indexes inside
        // the caches by this function's contract; `args` mirrors the kernel's
        // `FlashPrefillArgs` (layout asserted on both sides).
        unsafe { self.launch(func, cfg, &args)? };
        Ok(())
    }
}
