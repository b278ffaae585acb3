//! The weight formats the GEMVs (`cu/gemv.cu`) read and the block
//! formats' widening (`cu/gguf.cu`, the int4 format's too) takes: one kernel type each in
//! `cu/gemv_formats.cuh`, whose doc states every device layout.
//! Contract: [`WeightFormat`] indexes `Kernels::gemv`, names the entry
//! points and says which inputs `k` a format takes; a GGUF block format's
//! [`BlockLayout`] gives the bytes its chunks and side records take (the
//! sizes are [`crate::consts`]', shared with the kernels).

use crate::consts::GEMV_FP8_COLS as FP8_K_MULTIPLE;

/// The weight formats the GEMVs read, one kernel type each in
/// `cu/gemv_formats.cuh` (`FmtBf16`, `FmtFp8Row`, `FmtQ8_0`, ...); the index
/// of `Kernels::gemv`. The GGUF block formats hold ggml's blocks in the
/// device layout their format type states (chunks of codes, and side
/// records of scales beside them: [`WeightFormat::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// bf16 values.
    Bf16 = 0,
    /// e4m3 bytes with one f32 scale per row.
    Fp8Row = 1,
    /// ggml Q8_0 blocks (32 int8 codes, one f16 scale).
    Q8_0 = 2,
    /// ggml Q4_0 blocks (32 4-bit codes, one f16 scale).
    Q4_0 = 3,
    /// ggml Q4_1 blocks (32 4-bit codes, an f16 scale and min).
    Q4_1 = 4,
    /// ggml Q4_K super-blocks (256 4-bit codes, 6-bit scales and mins).
    Q4K = 5,
    /// ggml Q5_K super-blocks (Q4_K with a fifth bit per code).
    Q5K = 6,
    /// ggml Q6_K super-blocks (256 6-bit codes, i8 scales per 16).
    Q6K = 7,
    /// Group-wise 4-bit codes (AWQ / GPTQ / compressed-tensors): nibble
    /// chunks of 32 columns, each with its group's f32 scale and zero.
    Int4 = 8,
}

/// Where a GGUF block format's weights lie on the device: a row of `k`
/// columns is `k / cols` 16-byte chunks of codes, and `k / group` side
/// records of `side` bytes (`cu/gemv_formats.cuh` says what each holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    pub cols: usize,
    pub group: usize,
    pub side: usize,
}

impl BlockLayout {
    /// Bytes of chunks of one row of `k` columns.
    pub fn row_bytes(&self, k: usize) -> usize {
        k / self.cols * 16
    }
    /// Bytes of side records of one row of `k` columns.
    pub fn side_bytes(&self, k: usize) -> usize {
        k / self.group * self.side
    }
}

impl WeightFormat {
    /// Every format, in `Kernels::gemv` order.
    pub const ALL: [WeightFormat; 9] = [
        WeightFormat::Bf16,
        WeightFormat::Fp8Row,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
        WeightFormat::Q4_1,
        WeightFormat::Q4K,
        WeightFormat::Q5K,
        WeightFormat::Q6K,
        WeightFormat::Int4,
    ];

    /// The entry points' prefix (`GEMV_FORMAT(prefix, type)` in `cu/gemv.cu`).
    pub(crate) fn prefix(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "gemv",
            WeightFormat::Fp8Row => "gemv8",
            WeightFormat::Q8_0 => "gemv_q8_0",
            WeightFormat::Q4_0 => "gemv_q4_0",
            WeightFormat::Q4_1 => "gemv_q4_1",
            WeightFormat::Q4K => "gemv_q4_k",
            WeightFormat::Q5K => "gemv_q5_k",
            WeightFormat::Q6K => "gemv_q6_k",
            WeightFormat::Int4 => "gemv_int4",
        }
    }

    /// The entry point of kernel family `family` (`gguf_dequant`, `qgemm`)
    /// for a block format, named `FAMILY_<format>` with the GEMVs' format
    /// suffix (`None` for bf16 and FP8).
    pub(crate) fn block_entry(self, family: &str) -> Option<String> {
        self.layout()?;
        let suffix = self.prefix().strip_prefix("gemv_")?;
        Some(format!("{family}_{suffix}"))
    }

    /// The device layout of a GGUF block format (`None` for bf16 and FP8).
    pub fn layout(self) -> Option<BlockLayout> {
        use crate::consts::*;
        let (cols, group, side) = match self {
            WeightFormat::Bf16 | WeightFormat::Fp8Row => return None,
            WeightFormat::Q8_0 => (GGUF_Q8_COLS, GGUF_BLOCK, GGUF_Q8_0_SIDE),
            WeightFormat::Q4_0 => (GGUF_NIBBLE_COLS, GGUF_BLOCK, GGUF_Q4_0_SIDE),
            WeightFormat::Q4_1 => (GGUF_NIBBLE_COLS, GGUF_BLOCK, GGUF_Q4_1_SIDE),
            WeightFormat::Q4K => (GGUF_NIBBLE_COLS, GGUF_SUPER_BLOCK, GGUF_Q4_K_SIDE),
            WeightFormat::Q5K => (GGUF_NIBBLE_COLS, GGUF_SUPER_BLOCK, GGUF_Q5_K_SIDE),
            WeightFormat::Q6K => (GGUF_NIBBLE_COLS, GGUF_SUPER_BLOCK, GGUF_Q6_K_SIDE),
            WeightFormat::Int4 => (GGUF_NIBBLE_COLS, GGUF_BLOCK, INT4_SIDE),
        };
        Some(BlockLayout { cols, group, side })
    }

    /// What `k` must be a multiple of: whole 16-byte chunks of a row
    /// (block formats: whole blocks).
    pub fn k_multiple(self) -> usize {
        match (self, self.layout()) {
            (_, Some(l)) => l.group,
            (WeightFormat::Fp8Row, None) => FP8_K_MULTIPLE,
            _ => 8,
        }
    }
}
