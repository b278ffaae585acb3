// The one place for the launch constants shared by the Rust launchers and
// the CUDA kernels. `build.rs` `include!`s this file and writes
// `OUT_DIR/lamina_consts.cuh` from these values (`LAMINA_<NAME>` constants
// and the `LAMINA_FOR_EACH_HEAD_DIM(X)` X-macro), which every `.cu` file
// includes; the launchers use the constants directly. No `//!` docs here:
// the file is `include!`d by build.rs (the module doc is in `lib.rs`).

/// Head sizes the attention kernels are instantiated for; entry `i` of
/// `Kernels::prefill` / `Kernels::decode` is the kernel for `HEAD_DIMS[i]`.
pub const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Largest block the device accepts.
pub const MAX_THREADS_PER_BLOCK: usize = 1024;

/// Threads per block of the row kernels (embedding, row gather, add_rmsnorm,
/// silu_mul): a multiple of 32 (the block reductions need whole warps).
pub const ROW_THREADS: usize = 256;

/// Grid-size cap of the grid-stride `silu_mul`.
pub const SILU_MAX_BLOCKS: usize = 65_535;

/// Threads per block of `rope_kv_write` (one block per token).
pub const ROPE_THREADS: usize = 128;

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

// Mirrors of the constants of `decode_attention.{cu,rs}` and
// `sampling.{cu,rs}` (owned by their engineer, not edited here): the
// generated `lamina_checks.cuh`, compiled after those files in the unity
// build, static_asserts their `#define`s and the `SampleParams` layout against
// these values, and `lib.rs` const-asserts the Rust `SampleParams`.

/// `DECODE_THREADS` of decode_attention.cu.
pub const DECODE_THREADS: usize = 128;
/// `DECODE_CHUNK_GRAN` of decode_attention.cu: keys per split are a multiple of it.
pub const DECODE_CHUNK_GRAN: usize = 16;
/// `DECODE_MIN_CHUNK` of decode_attention.cu: fewest keys one split takes.
pub const DECODE_MIN_CHUNK: usize = 64;
/// Query heads per KV head the decode kernels are instantiated for
/// (`decode_attention_d{D}_g{G}`; a group uses the first cap that holds it).
pub const DECODE_GROUP_CAPS: [usize; 2] = [4, 8];
/// `SAMPLE_THREADS` of sampling.cu (`sample_rows`: one block per row).
pub const SAMPLE_THREADS: usize = 1024;
/// `SAMPLE_PART_THREADS` of sampling.cu (`sample_partials` block size).
pub const SAMPLE_PART_THREADS: usize = 256;
/// `SAMPLE_SLICE` of sampling.cu: vocabulary ids one `sample_partials` block owns.
pub const SAMPLE_SLICE: usize = 4096;
/// `GEMV_WARPS` of gemv.cu: warps per GEMV block.
pub const GEMV_WARPS: usize = 4;
/// `GEMV_ROWS_PER_WARP` of gemv.cu: weight rows one warp computes.
pub const GEMV_ROWS_PER_WARP: usize = 2;
/// `GEMV_MAX_ROWS` of gemv.cu: most token rows a GEMV launch takes.
pub const GEMV_MAX_ROWS: usize = 16;
/// `GEMV_CHUNKS(MT, NORM)` of gemv.cu: 16-byte weight chunks per row and lane
/// in one pass: SMALL for row tiles of at most 2 rows, LARGE for larger
/// tiles, PLAIN_M1 for one row of a variant without the norm.
pub const GEMV_CHUNKS_SMALL: usize = 8;
pub const GEMV_CHUNKS_LARGE: usize = 4;
pub const GEMV_CHUNKS_PLAIN_M1: usize = 4;
/// `FP_BM` of flash_prefill.cu: query rows (tokens x heads) of one block.
pub const FLASH_ROWS: usize = 128;
/// `FP_BN` of flash_prefill.cu: keys of one K/V tile.
pub const FLASH_KEYS: usize = 64;
/// `FP_MT` of flash_prefill.cu: m16 row tiles per warp (each K/V fragment
/// read from shared memory feeds this many MMAs).
pub const FLASH_M_TILES: usize = 2;
/// `FP_THREADS` of flash_prefill.cu: 32 x (FLASH_ROWS / (16 FLASH_M_TILES)) warps.
pub const FLASH_THREADS: usize = 32 * FLASH_ROWS / (16 * FLASH_M_TILES);
/// `FN_BM` of flash_prefill.cu: query rows of one narrow (decode) CTA.
pub const FLASH_NARROW_ROWS: usize = 16;
/// `FN_BN` of flash_prefill.cu: keys of one narrow K/V tile.
pub const FLASH_NARROW_KEYS: usize = 64;
/// `FN_BN_SMALL` of flash_prefill.cu: keys of one small-tile narrow K/V tile.
pub const FLASH_NARROW_SMALL_KEYS: usize = 32;
/// `FN_BN_TINY` of flash_prefill.cu: keys of one tiny-tile narrow K/V tile.
pub const FLASH_NARROW_TINY_KEYS: usize = 16;
/// `FN_THREADS` of flash_prefill.cu: one warp.
pub const FLASH_NARROW_THREADS: usize = 32;
/// `FH_BM` of flash_prefill.cu: query rows of one Hopper (wgmma) CTA, 64 a warpgroup.
pub const FLASH_HOPPER_ROWS: usize = 128;
/// `FH_BN` of flash_prefill.cu: keys of one Hopper K/V tile.
pub const FLASH_HOPPER_KEYS: usize = 64;
/// `FH_THREADS` of flash_prefill.cu: 128 threads per warpgroup.
pub const FLASH_HOPPER_THREADS: usize = 128 * FLASH_HOPPER_ROWS / 64;
/// Slack for aligning the Hopper tiles to 1,024 bytes (the 128-byte swizzle atom).
pub const FLASH_HOPPER_ALIGN: usize = 1024;
/// Size of one `SampleParams` row (Rust and C++).
pub const SAMPLE_PARAMS_BYTES: usize = 64;
/// Offsets of the C++ `SampleParams` fields (sampling.cu names), in order.
pub const SAMPLE_PARAMS_C_FIELDS: [(&str, usize); 16] = [
    ("temperature", 0),
    ("top_k", 4),
    ("top_p", 8),
    ("min_p", 12),
    ("rep_penalty", 16),
    ("u", 20),
    ("hist_off", 24),
    ("hist_len", 28),
    ("n_logprobs", 32),
    ("add_off", 36),
    ("add_len", 40),
    ("mask_off", 44),
    ("mask_len", 48),
    ("pad0", 52),
    ("pad1", 56),
    ("pad2", 60),
];
