// The one place for the launch constants shared by the Rust launchers and
// the CUDA kernels. Every constant of the `launch_consts!` block is recorded
// in [`ALL_CONSTS`]; `build.rs` `include!`s this file and writes
// `OUT_DIR/lamina_consts.cuh` from it: one `constexpr int LAMINA_<NAME>` per
// constant, the `LAMINA_FOR_EACH_HEAD_DIM(X)` X-macro and the
// `lamina_gemv_chunks<MT, NORM>` table of [`gemv_chunks`]. The `.cu` files
// use those names and define none of these values themselves, so a constant
// renamed on either side is an undeclared identifier: the build fails.
// No `//!` docs here: the file is `include!`d by build.rs (the module doc
// is in `lib.rs`).

macro_rules! launch_consts {
    ($( $(#[doc = $doc:literal])* pub const $name:ident: usize = $value:expr; )*) => {
        $( $(#[doc = $doc])* pub const $name: usize = $value; )*
        /// Every launch constant by name, in declaration order (read by
        /// `build.rs`, which emits each as `LAMINA_<NAME>`).
        pub const ALL_CONSTS: &[(&str, usize)] = &[$((stringify!($name), $name)),*];
    };
}

/// Head sizes the attention kernels are instantiated for; entry `i` of
/// `Kernels::prefill` / `Kernels::decode` is the kernel for `HEAD_DIMS[i]`.
pub const HEAD_DIMS: [usize; 5] = [16, 32, 64, 128, 256];

/// Query heads per KV head the decode kernels are instantiated for
/// (`decode_attention_d{D}_g{G}`; a group uses the first cap that holds it).
pub const DECODE_GROUP_CAPS: [usize; 2] = [4, 8];

launch_consts! {
    /// Largest block the device accepts.
    pub const MAX_THREADS_PER_BLOCK: usize = 1024;

    /// Largest finite e4m3 value, `ops::fp8::E4M3_MAX` (a unit test holds
    /// them equal): the activation quantiser's `max|x| / FP8_E4M3_MAX`.
    pub const FP8_E4M3_MAX: usize = 448;

    /// Threads per block of the row kernels (embedding, row gather, add_rmsnorm,
    /// silu_mul): a multiple of 32 (the block reductions need whole warps).
    pub const ROW_THREADS: usize = 256;

    /// Grid-size cap of the grid-stride `silu_mul`.
    pub const SILU_MAX_BLOCKS: usize = 65_535;

    /// Warps per block of `lora_shrink` (one output column of `h` each).
    pub const LORA_SHRINK_WARPS: usize = 8;

    /// Threads per block of `lora_expand` (one output column each).
    pub const LORA_EXPAND_THREADS: usize = 128;

    /// Threads per block and grid-size cap of the grid-stride `lora_select`.
    pub const LORA_SELECT_THREADS: usize = 256;
    pub const LORA_SELECT_MAX_BLOCKS: usize = 4096;

    /// The LoRA kernels' rank granularity: a slot's rank is padded with
    /// zeros to a multiple of this (one 16-byte load of B per step).
    pub const LORA_RANK_STEP: usize = 8;

    /// Threads per block of `rope_kv_write` (one block per token).
    pub const ROPE_THREADS: usize = 128;
    /// Largest head a warp holds whole in registers (`cu/hadamard.cuh`:
    /// `D / 32` values per lane) to Hadamard-rotate it or norm it in the
    /// fused QKV GEMV's epilogue: every head of [`HEAD_DIMS`].
    pub const HADAMARD_MAX_DIM: usize = 256;

    /// Query rows (tokens x query heads of one KV head) one prefill block serves.
    pub const PREFILL_ROWS_PER_BLOCK: usize = 64;

    /// f32 elements of one prefill K (and one V) tile in shared memory: a tile
    /// holds `PREFILL_TILE_ELEMS / D` keys, so `2 * 4 * PREFILL_TILE_ELEMS`
    /// bytes of static shared memory per block, whatever the head size.
    pub const PREFILL_TILE_ELEMS: usize = 4096;

    /// Keys one prefill thread scores per online-softmax update.
    pub const PREFILL_SCORE_STEP: usize = 16;

    /// Static shared memory a block may use without opting in (48 KiB).
    pub const STATIC_SMEM_LIMIT: usize = 48 * 1024;

    /// Threads per decode attention block (`decode_attention_d*_g*`). 128:
    /// a block fits beside the QKV GEMV's blocks, so it is resident, its
    /// first keys loaded, before that kernel ends.
    pub const DECODE_THREADS: usize = 128;
    /// Keys per decode split are a multiple of it.
    pub const DECODE_CHUNK_GRAN: usize = 16;
    /// Keys each lane group of a decode attention block loads before using
    /// them (memory-level parallelism); a split's first batch is loaded
    /// before the PDL wait.
    pub const DECODE_UNROLL: usize = 4;
    /// Most keys the default fewest keys of a decode split
    /// (`decode_attention::default_min_chunk`) takes: one batch of a block's
    /// loads, up to this many (the host may pass another multiple of
    /// `DECODE_CHUNK_GRAN` in `DecodeArgs::min_chunk`).
    pub const DECODE_MIN_CHUNK_MAX: usize = 64;
    /// Threads of a `sample_rows` block (one block per row).
    pub const SAMPLE_THREADS: usize = 1024;
    /// Threads of a `sample_partials` block.
    pub const SAMPLE_PART_THREADS: usize = 256;
    /// Vocabulary ids one `sample_partials` block owns.
    pub const SAMPLE_SLICE: usize = 4096;
    /// Threads of a persistent decode block (`cu/persistent.cu`): those of
    /// the GEMV and decode attention blocks whose bodies it runs.
    pub const PERSIST_THREADS: usize = 128;
    /// Persistent blocks a multiprocessor must hold (the kernel's launch
    /// bound: its registers capped at 65,536 / (4 x 128) = 128 a thread,
    /// what the GEMV and attention bodies take on their own, instead of
    /// the 160 of their union, which held 3).
    pub const PERSIST_MIN_BLOCKS: usize = 4;
    /// `PersistentOp::kind` of a `gemv_*_resid` op (its index in
    /// `gemv::VARIANTS`, as the other GEMV kinds).
    pub const PERSIST_GEMV_RESID: usize = 1;
    /// `PersistentOp::kind` of a `gemv_*_norm_gated` op.
    pub const PERSIST_GEMV_NORM_GATED: usize = 3;
    /// `PersistentOp::kind` of a `gemv_*_norm_rope` op.
    pub const PERSIST_GEMV_NORM_ROPE: usize = 5;
    /// `PersistentOp::kind` of a decode attention op.
    pub const PERSIST_ATTENTION: usize = 6;
    /// `GemvArgs::act` of the gate/up GEMV: SiLU (SwiGLU).
    pub const ACT_SILU: usize = 0;
    /// `GemvArgs::act`: GELU with the tanh approximation (GeGLU).
    pub const ACT_GELU_TANH: usize = 1;
    /// Warps per GEMV block.
    pub const GEMV_WARPS: usize = 4;
    /// Weight rows one GEMV warp computes.
    pub const GEMV_ROWS_PER_WARP: usize = 2;
    /// Most token rows a GEMV launch takes.
    pub const GEMV_MAX_ROWS: usize = 16;
    /// Columns of FP8 (e4m3) weights in one 16-byte GEMV chunk (bf16: 8);
    /// FP8 GEMV inputs are a multiple of it.
    pub const GEMV_FP8_COLS: usize = 16;
    /// Columns of a GGUF block format's 16-byte GEMV chunk: Q8_0's int8
    /// codes, and every 4-bit format's nibbles (`cu/gemv_formats.cuh`).
    pub const GGUF_Q8_COLS: usize = 16;
    /// See `GGUF_Q8_COLS`.
    pub const GGUF_NIBBLE_COLS: usize = 32;
    /// Columns of a ggml block (Q8_0, Q4_0, Q4_1) and of a K super-block.
    pub const GGUF_BLOCK: usize = 32;
    /// See `GGUF_BLOCK`.
    pub const GGUF_SUPER_BLOCK: usize = 256;
    /// Bytes of one side record (per block or super-block) of each GGUF
    /// format on the device; the format types in `cu/gemv_formats.cuh`
    /// state what they hold.
    pub const GGUF_Q8_0_SIDE: usize = 2;
    /// See `GGUF_Q8_0_SIDE`.
    pub const GGUF_Q4_0_SIDE: usize = 2;
    /// See `GGUF_Q8_0_SIDE`.
    pub const GGUF_Q4_1_SIDE: usize = 4;
    /// See `GGUF_Q8_0_SIDE`: d, dmin, scales[12].
    pub const GGUF_Q4_K_SIDE: usize = 16;
    /// See `GGUF_Q8_0_SIDE`: Q4_K's 16 bytes, then 4 bytes of fifth bits
    /// per 32 columns.
    pub const GGUF_Q5_K_SIDE: usize = 48;
    /// See `GGUF_Q8_0_SIDE`: 8 bytes of high bits per 32 columns, the 16
    /// i8 scales at `GGUF_Q6_K_SCALES_AT`, d at `GGUF_Q6_K_D_AT`, padding
    /// to a multiple of 8.
    pub const GGUF_Q6_K_SIDE: usize = 88;
    /// See `GGUF_Q6_K_SIDE`.
    pub const GGUF_Q6_K_SCALES_AT: usize = 64;
    /// Bytes of the int4 format's side record per 32 columns (its group's
    /// f32 scale and zero, `FmtInt4` in `cu/gemv_formats.cuh`).
    pub const INT4_SIDE: usize = 8;
    /// See `GGUF_Q6_K_SIDE`.
    pub const GGUF_Q6_K_D_AT: usize = 80;
    /// 16-byte weight chunks per row and lane one GEMV pass holds in
    /// registers ([`gemv_chunks`]): SMALL for row tiles of at most 2 rows,
    /// LARGE for larger tiles, PLAIN_M1 for one row of a variant without the
    /// norm.
    pub const GEMV_CHUNKS_SMALL: usize = 8;
    /// See `GEMV_CHUNKS_SMALL`.
    pub const GEMV_CHUNKS_LARGE: usize = 4;
    /// See `GEMV_CHUNKS_SMALL`.
    pub const GEMV_CHUNKS_PLAIN_M1: usize = 4;
    /// Query rows (tokens x heads) of one wide flash block.
    pub const FLASH_ROWS: usize = 128;
    /// Keys of one wide flash K/V tile.
    pub const FLASH_KEYS: usize = 64;
    /// m16 row tiles per flash warp (each K/V fragment read from shared
    /// memory feeds this many MMAs).
    pub const FLASH_M_TILES: usize = 2;
    /// Threads of a wide flash block: 32 x (FLASH_ROWS / (16 FLASH_M_TILES)) warps.
    pub const FLASH_THREADS: usize = 32 * FLASH_ROWS / (16 * FLASH_M_TILES);
    /// Query rows of one narrow (decode) flash CTA.
    pub const FLASH_NARROW_ROWS: usize = 16;
    /// Keys of one narrow K/V tile.
    pub const FLASH_NARROW_KEYS: usize = 64;
    /// Keys of one small-tile narrow K/V tile.
    pub const FLASH_NARROW_SMALL_KEYS: usize = 32;
    /// Keys of one tiny-tile narrow K/V tile.
    pub const FLASH_NARROW_TINY_KEYS: usize = 16;
    /// Threads of a narrow flash CTA: one warp.
    pub const FLASH_NARROW_THREADS: usize = 32;
    /// Query rows of one Hopper (wgmma) CTA, 64 a warpgroup.
    pub const FLASH_HOPPER_ROWS: usize = 128;
    /// Keys of one Hopper K/V tile.
    pub const FLASH_HOPPER_KEYS: usize = 64;
    /// Threads of a Hopper CTA: 128 per warpgroup.
    pub const FLASH_HOPPER_THREADS: usize = 128 * FLASH_HOPPER_ROWS / 64;
    /// Slack for aligning the Hopper tiles to 1,024 bytes (the 128-byte swizzle atom).
    pub const FLASH_HOPPER_ALIGN: usize = 1024;

    /// Columns of `k` one warp of the batch-invariant GEMM takes per step
    /// (two `m16n8k16` products; a multiple of it is required).
    pub const INV_GEMM_K_CHUNK: usize = 32;
    /// Most slices of `k` (warps of a block) the batch-invariant GEMM
    /// splits a row's reduction into; the count follows `k` alone.
    pub const INV_GEMM_MAX_SLICES: usize = 8;
    /// Weight rows (output features) of one batch-invariant GEMM block.
    pub const INV_GEMM_FEATURES: usize = 16;
    /// Eight-row input tiles of one batch-invariant GEMM block.
    pub const INV_GEMM_ROW_TILES: usize = 8;
    /// Chunks of `k` a warp of the batch-invariant GEMM loads ahead.
    pub const INV_GEMM_UNROLL: usize = 4;
    /// Weight rows of one block of the batch-invariant GEMM's tiled form
    /// (operands staged in shared memory, for many rows).
    pub const INV_GEMM_TILE_FEATURES: usize = 64;
    /// Input rows of one block of the tiled form.
    pub const INV_GEMM_TILE_ROWS: usize = 128;
    /// Chunks of `k` the tiled form has in flight (cp.async stages).
    pub const INV_GEMM_STAGES: usize = 3;
    /// Row counts from which the batch-invariant GEMM runs its tiled form
    /// (the same bits as the direct form: only speed decides).
    pub const INV_GEMM_TILED_MIN_ROWS: usize = 128;

    /// Warps of one block-format GEMM block (`cu/qgemm.cu`), each over one
    /// m16 tile of weight rows.
    pub const QGEMM_WARPS: usize = 4;
    /// Input rows of one block-format GEMM block (eight n8 tiles).
    pub const QGEMM_ROWS: usize = 64;
    /// Columns of `k` one step of the block-format GEMM takes: 32 a lane
    /// (one nibble chunk, two Q8_0 chunks) for the four lanes of a row.
    pub const QGEMM_K_STEP: usize = 128;
    /// Steps of input rows the block-format GEMM has in flight (cp.async
    /// stages in shared memory).
    pub const QGEMM_STAGES: usize = 3;
    /// 16-byte units of one staged input row of the block-format GEMM: the
    /// step's 16, then 4 of padding (a row 80 words apart: the 8 lanes of a
    /// 16-byte shared-memory phase land on distinct banks).
    pub const QGEMM_ROW_UNITS: usize = 20;
}

/// 16-byte weight chunks per row and lane one pass of a GEMV kernel with a
/// row tile of `mt` rows holds in registers (`norm`: the norm variants).
/// Fewer chunks mean more warps (ksplit) with fewer registers each; the norm
/// variants prefer fewer, larger blocks (each block stages the normalised
/// inputs once), single-row plain ones more warps. `build.rs` emits it for
/// every `mt` in `1..=GEMV_MAX_ROWS` as `lamina_gemv_chunks<MT, NORM>::value`.
pub const fn gemv_chunks(mt: usize, norm: bool) -> usize {
    match mt {
        1 if !norm => GEMV_CHUNKS_PLAIN_M1,
        1 | 2 => GEMV_CHUNKS_SMALL,
        _ => GEMV_CHUNKS_LARGE,
    }
}
