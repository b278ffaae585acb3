// The argument structs of the kernels: the single description of every
// kernel's by-value parameter (and of `SampleParams`, the per-row record the
// sampling kernels read through a pointer). Each `kernel_args!` entry
// defines the Rust `#[repr(C)]` struct, const-asserts its size and every
// field's offset against the numbers written here, and records the field
// list in [`ALL_ARGS`]. `build.rs` `include!`s this file (so these asserts
// run there too) and writes `OUT_DIR/lamina_args.cuh` from [`ALL_ARGS`]: the
// matching C++ structs, field names and all, with
// `static_assert(sizeof / offsetof == N)` for the same numbers. No `.cu`
// file declares an argument struct of its own, so a field renamed, moved,
// retyped or resized on either side fails a build. Pointers are device
// addresses (`u64` here, the C type after `as`), sizes `u32`, scalars `f32`,
// fixed arrays `[u32; N]` (C type `uint32_t[N]`). No `//!` docs: the module
// doc is in `lib.rs`.

/// One field of an argument struct, as the C++ generator reads it.
#[derive(Debug, Clone, Copy)]
pub struct FieldDesc {
    pub name: &'static str,
    /// `u64` (device pointer), `u32`, `f32` or `[u32; N]`.
    pub rust_type: &'static str,
    /// The C++ type of the field in the generated struct (`T[N]` for an array).
    pub c_type: &'static str,
    pub offset: usize,
    /// The field's doc lines (shape comments), copied into the header.
    pub doc: &'static [&'static str],
}

/// One argument struct, as the C++ generator reads it.
#[derive(Debug, Clone, Copy)]
pub struct ArgsDesc {
    pub name: &'static str,
    /// The kernel (or kernel family) that takes it.
    pub kernel: &'static str,
    pub size: usize,
    pub fields: &'static [FieldDesc],
}

/// An argument struct as the `u32` words the kernel reads (its fields at
/// their offsets, padding zero): what the persistent decode kernel's op
/// records carry.
pub trait ArgWords {
    /// The struct's size in words.
    const WORDS: usize;
    /// Writes the struct into `out[..WORDS]`, which the caller zeroed.
    fn write_words(&self, out: &mut [u32]);
}

/// A field type of an argument struct, as words (little-endian, as on the GPU).
trait Word {
    fn put(&self, out: &mut [u32]);
}
impl Word for u32 {
    fn put(&self, out: &mut [u32]) {
        out[0] = *self;
    }
}
impl Word for f32 {
    fn put(&self, out: &mut [u32]) {
        out[0] = self.to_bits();
    }
}
impl Word for u64 {
    fn put(&self, out: &mut [u32]) {
        out[0] = *self as u32;
        out[1] = (*self >> 32) as u32;
    }
}
impl<const N: usize> Word for [u32; N] {
    fn put(&self, out: &mut [u32]) {
        out[..N].copy_from_slice(self);
    }
}

macro_rules! kernel_args {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident for $kernel:literal, size $size:literal {
            $(
                $(#[doc = $fdoc:literal])*
                $field:ident : $ty:ty as $cty:literal @ $off:literal
            ),* $(,)?
        }
    )*) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, PartialEq)]
            pub struct $name {
                $( $(#[doc = $fdoc])* pub $field: $ty, )*
            }
            const _: () = {
                assert!(::std::mem::size_of::<$name>() == $size);
                $( assert!(::std::mem::offset_of!($name, $field) == $off); )*
            };
            impl ArgWords for $name {
                const WORDS: usize = $size / 4;
                fn write_words(&self, out: &mut [u32]) {
                    $( Word::put(&self.$field, &mut out[$off / 4..]); )*
                }
            }
        )*
        /// Every argument struct, in declaration order (read by `build.rs`).
        pub const ALL_ARGS: &[ArgsDesc] = &[$(
            ArgsDesc {
                name: stringify!($name),
                kernel: $kernel,
                size: $size,
                fields: &[$(FieldDesc {
                    name: stringify!($field),
                    rust_type: stringify!($ty),
                    c_type: $cty,
                    offset: $off,
                    doc: &[$($fdoc),*],
                }),*],
            }
        ),*];
    };
}

kernel_args! {
    /// Arguments of `embedding_gather` (cu/embedding.cu).
    #[derive(Default)]
    pub struct EmbeddingGatherArgs for "embedding_gather", size 56 {
        /// [T, hidden] f32 residual rows written
        out: u64 as "float*" @ 0,
        /// [vocab, hidden] bf16
        table: u64 as "const bf16*" @ 8,
        /// `[T]` token ids
        ids: u64 as "const uint32_t*" @ 16,
        hidden: u32 as "uint32_t" @ 24,
        vocab: u32 as "uint32_t" @ 28,
        /// `[T]` index into `prev` of a carried token's id, or >= num_prev;
        /// null when nothing is carried
        carry: u64 as "const uint32_t*" @ 32,
        /// `[num_prev]` the previous step's sampled ids
        prev: u64 as "const uint32_t*" @ 40,
        num_prev: u32 as "uint32_t" @ 48,
        /// every value written is multiplied by this (the spec's embedding scale)
        scale: f32 as "float" @ 52,
    }

    /// Arguments of `gather_rows_bf16` (cu/embedding.cu).
    #[derive(Default)]
    pub struct GatherRowsArgs for "gather_rows_bf16", size 32 {
        /// [R, width] bf16
        out: u64 as "bf16*" @ 0,
        /// [num_src_rows, width] bf16
        src: u64 as "const bf16*" @ 8,
        /// `[R]` source row of each output row
        rows: u64 as "const uint32_t*" @ 16,
        width: u32 as "uint32_t" @ 24,
        num_src_rows: u32 as "uint32_t" @ 28,
    }

    /// Arguments of `fp8_dequant_rows` (cu/fp8.cu).
    pub struct Fp8DequantArgs for "fp8_dequant_rows", size 32 {
        /// [n, k] e4m3 bytes
        q: u64 as "const uint8_t*" @ 0,
        /// `[n]` f32 row scales
        scale: u64 as "const float*" @ 8,
        /// [n, k] bf16
        out: u64 as "bf16*" @ 16,
        n: u32 as "uint32_t" @ 24,
        k: u32 as "uint32_t" @ 28,
    }

    /// Arguments of `gguf_dequant_*` (cu/gguf.cu): a block format's
    /// weights widened to bf16.
    pub struct GgufDequantArgs for "gguf_dequant_*", size 32 {
        /// the format's chunks, `[n, k / cols * 16]` bytes
        q: u64 as "const uint8_t*" @ 0,
        /// the format's side records, `[n, k / group * side]` bytes
        side: u64 as "const uint8_t*" @ 8,
        /// [n, k] bf16
        out: u64 as "bf16*" @ 16,
        n: u32 as "uint32_t" @ 24,
        k: u32 as "uint32_t" @ 28,
    }

    /// Arguments of `qgemm_*` (cu/qgemm.cu).
    pub struct QgemmArgs for "qgemm_*", size 48 {
        /// [m, n] bf16
        y: u64 as "bf16*" @ 0,
        /// [m, k] bf16
        x: u64 as "const bf16*" @ 8,
        /// the format's chunks, `[n, k / cols * 16]` bytes
        q: u64 as "const uint8_t*" @ 16,
        /// the format's side records, `[n, k / group * side]` bytes
        side: u64 as "const uint8_t*" @ 24,
        m: u32 as "uint32_t" @ 32,
        n: u32 as "uint32_t" @ 36,
        k: u32 as "uint32_t" @ 40,
        pad: u32 as "uint32_t" @ 44,
    }

    /// Arguments of `fp8_quant_rows` (cu/fp8.cu).
    pub struct Fp8QuantArgs for "fp8_quant_rows", size 32 {
        /// [m, k] bf16 activations
        x: u64 as "const bf16*" @ 0,
        /// [m, k] e4m3 bytes
        q: u64 as "uint8_t*" @ 8,
        /// `[m]` f32 row scales
        scale: u64 as "float*" @ 16,
        m: u32 as "uint32_t" @ 24,
        k: u32 as "uint32_t" @ 28,
    }

    /// Arguments of `add_rmsnorm` (cu/rmsnorm.cu).
    #[derive(Default)]
    pub struct AddRmsnormArgs for "add_rmsnorm", size 48 {
        /// [T, hidden] f32, updated in place when delta is set
        residual: u64 as "float*" @ 0,
        /// [T, hidden] bf16, or 0 (no residual add)
        delta: u64 as "const bf16*" @ 8,
        /// `[hidden]` bf16
        weight: u64 as "const bf16*" @ 16,
        /// [T, hidden] bf16
        out: u64 as "bf16*" @ 24,
        hidden: u32 as "uint32_t" @ 32,
        eps: f32 as "float" @ 36,
        /// the gain is `offset + weight` (the spec's norm weight offset)
        offset: f32 as "float" @ 40,
        pad: u32 as "uint32_t" @ 44,
    }

    /// Arguments of `silu_mul` and `gelu_tanh_mul` (cu/activation.cu).
    #[derive(Default)]
    pub struct GatedArgs for "silu_mul, gelu_tanh_mul", size 24 {
        /// [T, inter] bf16
        out: u64 as "bf16*" @ 0,
        /// [T, 2 inter] bf16, [gate | up]
        gu: u64 as "const bf16*" @ 8,
        tokens: u32 as "uint32_t" @ 16,
        inter: u32 as "uint32_t" @ 20,
    }

    /// Arguments of `bias_rows` (cu/layer_extras.cu).
    #[derive(Default)]
    pub struct BiasRowsArgs for "bias_rows", size 24 {
        /// [T, width] bf16, in place
        y: u64 as "bf16*" @ 0,
        /// [width] bf16
        bias: u64 as "const bf16*" @ 8,
        tokens: u32 as "uint32_t" @ 16,
        width: u32 as "uint32_t" @ 20,
    }

    /// Arguments of `head_rmsnorm` (cu/layer_extras.cu).
    #[derive(Default)]
    pub struct HeadRmsnormArgs for "head_rmsnorm", size 56 {
        /// [T, row] bf16, in place: Q heads then K heads from column 0
        x: u64 as "bf16*" @ 0,
        /// [head_dim] bf16
        q_gain: u64 as "const bf16*" @ 8,
        /// [head_dim] bf16
        k_gain: u64 as "const bf16*" @ 16,
        tokens: u32 as "uint32_t" @ 24,
        row: u32 as "uint32_t" @ 28,
        q_heads: u32 as "uint32_t" @ 32,
        k_heads: u32 as "uint32_t" @ 36,
        head_dim: u32 as "uint32_t" @ 40,
        eps: f32 as "float" @ 44,
        /// the gains are `offset + gain`
        offset: f32 as "float" @ 48,
        pad: u32 as "uint32_t" @ 52,
    }

    /// Arguments of `softcap_rows` (cu/layer_extras.cu).
    #[derive(Default)]
    pub struct SoftcapArgs for "softcap_rows", size 16 {
        /// [n] f32, in place
        y: u64 as "float*" @ 0,
        n: u32 as "uint32_t" @ 8,
        cap: f32 as "float" @ 12,
    }

    /// Arguments of `invariant_gemm_bf16` / `invariant_gemm_f32`
    /// (cu/invariant_gemm.cu).
    #[derive(Default)]
    pub struct InvariantGemmArgs for "invariant_gemm", size 40 {
        /// [m, n] bf16 or f32
        y: u64 as "void*" @ 0,
        /// [m, k] bf16
        x: u64 as "const bf16*" @ 8,
        /// [n, k] bf16
        w: u64 as "const bf16*" @ 16,
        m: u32 as "uint32_t" @ 24,
        n: u32 as "uint32_t" @ 28,
        k: u32 as "uint32_t" @ 32,
        /// slices of k, `invariant_gemm::slices(k)`
        slices: u32 as "uint32_t" @ 36,
    }

    /// Arguments of `lora_shrink` (cu/lora.cu).
    #[derive(Default)]
    pub struct LoraShrinkArgs for "lora_shrink", size 48 {
        /// [T, k] bf16, the projection's input
        x: u64 as "const bf16*" @ 0,
        /// [slots, n, k] bf16, one layer's stacked A of every slot
        a: u64 as "const bf16*" @ 8,
        /// [T, n] f32, written on adapter rows only
        h: u64 as "float*" @ 16,
        /// `[T]` each row's slot: 0 the base model, `s` slot `s - 1`
        slot_of: u64 as "const uint32_t*" @ 24,
        tokens: u32 as "uint32_t" @ 32,
        n: u32 as "uint32_t" @ 36,
        k: u32 as "uint32_t" @ 40,
        slots: u32 as "uint32_t" @ 44,
    }

    /// Arguments of `lora_expand` (cu/lora.cu).
    #[derive(Default)]
    pub struct LoraExpandArgs for "lora_expand", size 64 {
        /// [T, hw] f32, the shrink's output (`hw` = segments x rank)
        h: u64 as "const float*" @ 0,
        /// [n, slots, hw] bf16, one layer's B of every slot (row `c` set in
        /// its segment's `rank` values only)
        b: u64 as "const bf16*" @ 8,
        /// `[slots]` f32, each slot's scale
        scales: u64 as "const float*" @ 16,
        /// `[T]` each row's slot: 0 the base model, `s` slot `s - 1`
        slot_of: u64 as "const uint32_t*" @ 24,
        /// [T, n] bf16, added to in place on adapter rows
        y: u64 as "bf16*" @ 32,
        n: u32 as "uint32_t" @ 40,
        rank: u32 as "uint32_t" @ 44,
        hw: u32 as "uint32_t" @ 48,
        slots: u32 as "uint32_t" @ 52,
        /// first output column of segment 1 (`n`: none)
        seg1: u32 as "uint32_t" @ 56,
        /// first output column of segment 2 (`n`: none)
        seg2: u32 as "uint32_t" @ 60,
    }

    /// Arguments of `lora_select` (cu/lora.cu).
    #[derive(Default)]
    pub struct LoraSelectArgs for "lora_select", size 48 {
        /// [T, slots, hw] f32, every slot's shrink of every row
        h: u64 as "const float*" @ 0,
        /// `[slots]` f32, each slot's scale
        scales: u64 as "const float*" @ 8,
        /// `[T]` each row's slot: 0 the base model, `s` slot `s - 1`
        slot_of: u64 as "const uint32_t*" @ 16,
        /// [T, slots, hw] bf16: the row's own slot scaled, zeros elsewhere
        hb: u64 as "bf16*" @ 24,
        tokens: u32 as "uint32_t" @ 32,
        hw: u32 as "uint32_t" @ 36,
        slots: u32 as "uint32_t" @ 40,
        pad: u32 as "uint32_t" @ 44,
    }

    /// Arguments of `rope_kv_write` (cu/rope_kv.cu).
    #[derive(Default)]
    pub struct RopeKvArgs for "rope_kv_write", size 88 {
        /// [T, (n_heads + 2 n_kv) D] bf16, q heads rotated in place
        qkv: u64 as "bf16*" @ 0,
        /// `[T]`
        positions: u64 as "const uint32_t*" @ 8,
        /// `[T]` physical KV slot of each token
        slots: u64 as "const uint32_t*" @ 16,
        /// [max_pos, D/2] f32 (ModelConfig::rope_table)
        cos_t: u64 as "const float*" @ 24,
        /// [max_pos, D/2] f32
        sin_t: u64 as "const float*" @ 32,
        /// [slots, n_kv, D] bf16, or e4m3 bytes when kv_fp8
        k_cache: u64 as "void*" @ 40,
        /// [slots, n_kv, D] bf16, or e4m3 bytes when kv_fp8
        v_cache: u64 as "void*" @ 48,
        n_heads: u32 as "uint32_t" @ 56,
        n_kv: u32 as "uint32_t" @ 60,
        head_dim: u32 as "uint32_t" @ 64,
        max_pos: u32 as "uint32_t" @ 68,
        /// FP8 K scale: a k value is stored as e4m3(k / k_scale) (kv_fp8 only)
        k_scale: f32 as "float" @ 72,
        /// FP8 V scale (kv_fp8 only)
        v_scale: f32 as "float" @ 76,
        /// 1: the caches hold e4m3 bytes; 0: bf16
        kv_fp8: u32 as "uint32_t" @ 80,
        /// 1: q and k heads Hadamard-rotated after RoPE (cu/hadamard.cuh)
        kv_rotate: u32 as "uint32_t" @ 84,
    }

    /// Arguments of `prefill_attention_d{D}` (cu/prefill_attention.cu).
    #[derive(Default)]
    pub struct PrefillAttentionArgs for "prefill_attention_d*, prefill_attention_fp8_d*", size 96 {
        /// [T, (n_heads + 2 n_kv) D] bf16, q roped
        qkv: u64 as "const bf16*" @ 0,
        /// [slots, n_kv, D] bf16 (e4m3 bytes: the _fp8 kernels)
        k_cache: u64 as "const void*" @ 8,
        /// [slots, n_kv, D] bf16 (e4m3 bytes: the _fp8 kernels)
        v_cache: u64 as "const void*" @ 16,
        /// [S + 1]
        cu_seqlens: u64 as "const uint32_t*" @ 24,
        /// `[S]`
        context_lens: u64 as "const uint32_t*" @ 32,
        /// [S, max_blocks]
        block_tables: u64 as "const uint32_t*" @ 40,
        /// [T, n_heads D] bf16
        out: u64 as "bf16*" @ 48,
        max_blocks: u32 as "uint32_t" @ 56,
        n_heads: u32 as "uint32_t" @ 60,
        n_kv: u32 as "uint32_t" @ 64,
        block_size: u32 as "uint32_t" @ 68,
        tok_per_block: u32 as "uint32_t" @ 72,
        /// the layer's score scale (`ScoreRule::scale`)
        scale: f32 as "float" @ 76,
        /// FP8 K scale: a key reads decode(byte) * k_scale (_fp8 kernels only)
        k_scale: f32 as "float" @ 80,
        /// FP8 V scale (_fp8 kernels only)
        v_scale: f32 as "float" @ 84,
        /// sliding window: a query at `p` sees `window_first(p, window)..=p` (0: none)
        window: u32 as "uint32_t" @ 88,
        pad: u32 as "uint32_t" @ 92,
    }

    /// One op of the persistent decode kernel (cu/persistent.cu): a launch
    /// it runs in place of that launch, as `blocks` virtual blocks.
    pub struct PersistentOp for "persistent_* (an array of them)", size 296 {
        /// what the op runs: `consts::PERSISTENT_KINDS` indexes it
        kind: u32 as "uint32_t" @ 0,
        /// virtual blocks: the launch's grid_x * grid_y * grid_z
        blocks: u32 as "uint32_t" @ 4,
        /// the launch's grid: virtual block v is block
        /// (v % grid_x, v / grid_x % grid_y, v / (grid_x grid_y))
        grid_x: u32 as "uint32_t" @ 8,
        grid_y: u32 as "uint32_t" @ 12,
        /// the launch's argument struct (`ArgWords`), zero past its size
        args: [u32; 70] as "uint32_t[70]" @ 16,
    }

    /// Arguments of `persistent_*` (cu/persistent.cu).
    #[derive(Default)]
    pub struct PersistentArgs for "persistent_*", size 32 {
        /// [n_ops] the ops, in stream order
        ops: u64 as "const PersistentOp*" @ 0,
        /// [n_ops + 2] each op's arrival count (growing by its blocks every
        /// launch), the blocks that exited, the launch generation; zeroed
        /// once, when allocated
        counters: u64 as "uint32_t*" @ 8,
        n_ops: u32 as "uint32_t" @ 16,
        pad: u32 as "uint32_t" @ 20,
        /// [n_ops, grid, 3] or null: each block's start of each op, the end
        /// of its wait for the op before, its arrival (globaltimer ns)
        trace: u64 as "unsigned long long*" @ 24,
    }

    /// Arguments of `decode_attention_d{D}_g{G}` (cu/decode_attention.cu).
    #[derive(Default)]
    pub struct DecodeArgs for "decode_attention_d*_g*, decode_attention_fp8_d*_g*", size 144 {
        /// [S, (n_heads + 2 n_kv) D] bf16, q roped
        qkv: u64 as "const bf16*" @ 0,
        /// [slots, n_kv, D] bf16 (e4m3 bytes: the _fp8 kernels)
        k_cache: u64 as "const void*" @ 8,
        /// [slots, n_kv, D] bf16 (e4m3 bytes: the _fp8 kernels)
        v_cache: u64 as "const void*" @ 16,
        /// `[S]`
        context_lens: u64 as "const uint32_t*" @ 24,
        /// [S, max_blocks]
        block_tables: u64 as "const uint32_t*" @ 32,
        /// [S, n_heads, splits, D] f32 (splits > 1)
        part_o: u64 as "float*" @ 40,
        /// [S, n_heads, splits, 2] f32 (splits > 1)
        part_ml: u64 as "float*" @ 48,
        /// [S, n_heads D] bf16
        out: u64 as "bf16*" @ 56,
        /// [S, n_kv] arrival counters, zero between launches
        counters: u64 as "uint32_t*" @ 64,
        max_blocks: u32 as "uint32_t" @ 72,
        n_heads: u32 as "uint32_t" @ 76,
        n_kv: u32 as "uint32_t" @ 80,
        block_size: u32 as "uint32_t" @ 84,
        splits: u32 as "uint32_t" @ 88,
        /// log2(e) times the layer's score scale
        scale_log2: f32 as "float" @ 92,
        /// fewest keys a split takes, a multiple of DECODE_CHUNK_GRAN
        min_chunk: u32 as "uint32_t" @ 96,
        /// FP8 K scale: a key reads decode(byte) * k_scale (_fp8 kernels only)
        k_scale: f32 as "float" @ 100,
        /// FP8 V scale (_fp8 kernels only)
        v_scale: f32 as "float" @ 104,
        /// keys at the end of each row's context written by this step's
        /// previous kernels (read only after the PDL wait): 1 for one new
        /// token a sequence, 1 + K for verify rows after K drafts
        fresh: u32 as "uint32_t" @ 108,
        /// `[T]` token rows: each row attends to `positions[row] + 1` keys of
        /// its segment's sequence (`cu_seqlens`); null: one row per sequence
        positions: u64 as "const uint32_t*" @ 112,
        /// `[S + 1]` segment offsets (token rows only)
        cu_seqlens: u64 as "const uint32_t*" @ 120,
        /// sequences `S` (token rows only)
        num_seqs: u32 as "uint32_t" @ 128,
        /// rows with a shorter context exit (left to another launch; 0: none)
        min_ctx: u32 as "uint32_t" @ 132,
        /// sliding window: a row of context `ctx` reads keys
        /// `window_first(ctx - 1, window)..ctx` only (0: none)
        window: u32 as "uint32_t" @ 136,
        pad: u32 as "uint32_t" @ 140,
    }

    /// Arguments of the `flash_*` kernels (cu/flash_prefill.cu).
    #[derive(Default)]
    pub struct FlashPrefillArgs for "flash_*", size 104 {
        /// [T, (n_heads + 2 n_kv) D] bf16, q roped
        qkv: u64 as "const bf16*" @ 0,
        /// [slots, n_kv, D] bf16 (e4m3 bytes: the flash_*_fp8 kernels)
        k_cache: u64 as "const void*" @ 8,
        /// [slots, n_kv, D] bf16 (e4m3 bytes: the flash_*_fp8 kernels)
        v_cache: u64 as "const void*" @ 16,
        /// [S + 1]
        cu_seqlens: u64 as "const uint32_t*" @ 24,
        /// `[S]`
        context_lens: u64 as "const uint32_t*" @ 32,
        /// [S, max_blocks]
        block_tables: u64 as "const uint32_t*" @ 40,
        /// [T, n_heads D] bf16
        out: u64 as "bf16*" @ 48,
        max_blocks: u32 as "uint32_t" @ 56,
        num_heads: u32 as "uint32_t" @ 60,
        num_kv_heads: u32 as "uint32_t" @ 64,
        block_size: u32 as "uint32_t" @ 68,
        /// query tokens per CTA; tok_per_tile * G <= rows of a CTA
        tok_per_tile: u32 as "uint32_t" @ 72,
        /// log2(e) times the layer's score scale
        scale_log2: f32 as "float" @ 76,
        /// sequences with fewer query tokens are left to another launch
        min_len: u32 as "uint32_t" @ 80,
        /// ... and those with more
        max_len: u32 as "uint32_t" @ 84,
        /// FP8 K scale: a key reads decode(byte) * k_scale (flash_*_fp8 only)
        k_scale: f32 as "float" @ 88,
        /// FP8 V scale (flash_*_fp8 only)
        v_scale: f32 as "float" @ 92,
        /// rows whose context (position + 1) exceeds it are left to another
        /// launch (the mma.sync tilings; `u32::MAX`: none)
        max_ctx: u32 as "uint32_t" @ 96,
        /// sliding window: a query at `p` sees `window_first(p, window)..=p` (0: none)
        window: u32 as "uint32_t" @ 100,
    }

    /// Arguments of every `gemv_*` and `gemv8_*` kernel (cu/gemv.cu).
    #[derive(Default)]
    pub struct GemvArgs for "gemv_*, gemv8_*, gemv_q*", size 280 {
        /// [m, k] bf16, or the f32 residual for the norm variants
        x: u64 as "const void*" @ 0,
        /// `[k]` bf16 (norm variants), else unused
        norm_w: u64 as "const bf16*" @ 8,
        /// [n, k] bf16 ([2n, k] for norm_gated); e4m3 bytes for gemv8_*, a
        /// block format's chunks for gemv_q*
        w: u64 as "const void*" @ 16,
        /// [m, n] bf16 / f32 (resid: the f32 residual, read and written)
        y: u64 as "void*" @ 24,
        /// token rows, 1..=MT
        m: u32 as "uint32_t" @ 32,
        /// outputs per row
        n: u32 as "uint32_t" @ 36,
        /// inputs per row, a multiple of 8
        k: u32 as "uint32_t" @ 40,
        eps: f32 as "float" @ 44,
        /// `[m]` (norm_rope only, else zero: RoPE + KV write in the epilogue)
        positions: u64 as "const uint32_t*" @ 48,
        /// `[m]` (norm_rope only)
        slots: u64 as "const uint32_t*" @ 56,
        /// [max_pos, D/2] f32 (norm_rope only)
        cos_t: u64 as "const float*" @ 64,
        /// [max_pos, D/2] f32 (norm_rope only)
        sin_t: u64 as "const float*" @ 72,
        /// [slots, n_kv, D] bf16, or e4m3 bytes when kv_fp8 (norm_rope only)
        k_cache: u64 as "void*" @ 80,
        /// [slots, n_kv, D] bf16, or e4m3 bytes when kv_fp8 (norm_rope only)
        v_cache: u64 as "void*" @ 88,
        n_heads: u32 as "uint32_t" @ 96,
        n_kv: u32 as "uint32_t" @ 100,
        head_dim: u32 as "uint32_t" @ 104,
        max_pos: u32 as "uint32_t" @ 108,
        /// warps sharing a row pair: 1, 2 or 4 (divides GEMV_WARPS)
        ksplit: u32 as "uint32_t" @ 112,
        /// 1: the caches hold e4m3 bytes at k_scale / v_scale (norm_rope only)
        kv_fp8: u32 as "uint32_t" @ 116,
        /// the weights' side data (`cu/gemv_formats.cuh`): `[n]` f32 (`[2n]`
        /// for norm_gated) row scales for gemv8_*, a block format's records,
        /// else unused
        w_side: u64 as "const void*" @ 120,
        /// FP8 K scale: k is stored as e4m3(k / k_scale) (norm_rope, kv_fp8 only)
        k_scale: f32 as "float" @ 128,
        /// FP8 V scale (norm_rope, kv_fp8 only)
        v_scale: f32 as "float" @ 132,
        /// [m, lora_hw] f32, each row's LoRA `A x`, written by the launch's
        /// first `lora_shrink_blocks` blocks; 0 for no LoRA delta
        lora_h: u64 as "float*" @ 136,
        /// [weight rows, lora_slots, lora_hw] bf16, one layer's B
        lora_b: u64 as "const bf16*" @ 144,
        /// `[lora_slots]` f32, each slot's scale
        lora_scales: u64 as "const float*" @ 152,
        /// `[m]` each row's slot: 0 the base model, `s` slot `s - 1`
        lora_slot_of: u64 as "const uint32_t*" @ 160,
        lora_rank: u32 as "uint32_t" @ 168,
        lora_hw: u32 as "uint32_t" @ 172,
        /// first weight row of B's segment 1 (weight rows: none)
        lora_seg1: u32 as "uint32_t" @ 176,
        /// first weight row of B's segment 2 (weight rows: none)
        lora_seg2: u32 as "uint32_t" @ 180,
        lora_slots: u32 as "uint32_t" @ 184,
        /// blocks in front of the GEMV's that compute `lora_h`: `m x
        /// ceil(lora_hw / GEMV_WARPS)` (0 without LoRA)
        lora_shrink_blocks: u32 as "uint32_t" @ 188,
        /// [lora_slots, lora_hw, k] bf16, one layer's stacked A of every slot
        lora_a: u64 as "const bf16*" @ 192,
        /// a counter, zero at launch: the shrink blocks that have written
        /// their `lora_h` columns
        lora_ready: u64 as "uint32_t*" @ 200,
        /// `[n_heads + n_kv]` per-head arrival counters, zero at launch and
        /// left zero (norm_rope with kv_rotate only)
        rot_ready: u64 as "uint32_t*" @ 208,
        /// 1: q and k heads Hadamard-rotated after RoPE (norm_rope only)
        kv_rotate: u32 as "uint32_t" @ 216,
        /// added to each QK-norm gain (Gemma's `(1+w)`: 1; norm_rope only)
        qk_offset: f32 as "float" @ 220,
        /// `[head_dim]` bf16 per-head RMSNorm gain of the q heads before
        /// RoPE, or 0 for none (with k_norm_w; norm_rope only)
        q_norm_w: u64 as "const bf16*" @ 224,
        /// `[head_dim]` bf16 per-head RMSNorm gain of the k heads
        k_norm_w: u64 as "const bf16*" @ 232,
        /// added to each gain of the input RMSNorm (norm variants) or of
        /// the output norm (resid with out_norm_w): Gemma's `(1+w)`: 1
        norm_offset: f32 as "float" @ 240,
        /// the gate's activation (norm_gated only): `consts::ACT_SILU` or
        /// `ACT_GELU_TANH`
        act: u32 as "uint32_t" @ 244,
        /// `[n]` bf16 added to each output after its bf16 rounding, or 0
        /// (norm_rope only: Qwen2's QKV bias)
        bias: u64 as "const bf16*" @ 248,
        /// `[n]` bf16 gain of an RMSNorm over each whole output row before
        /// the residual add, or 0 (resid only: Gemma's post-attention and
        /// post-MLP norms)
        out_norm_w: u64 as "const bf16*" @ 256,
        /// `[m, n]` bf16, the rows before that norm (resid with out_norm_w)
        out_rows: u64 as "bf16*" @ 264,
        /// a counter, zero at launch and left zero: the warps that have
        /// written their `out_rows` (resid with out_norm_w)
        out_ready: u64 as "uint32_t*" @ 272,
    }

    /// Per-row sampling settings as the sampling kernels read them
    /// (cu/sampling.cu, through `SamplePartialArgs::params`).
    pub struct SampleParams for "sample_partials, sample_rows (one per row)", size 64 {
        temperature: f32 as "float" @ 0,
        top_k: u32 as "uint32_t" @ 4,
        top_p: f32 as "float" @ 8,
        min_p: f32 as "float" @ 12,
        repetition_penalty: f32 as "float" @ 16,
        /// The draw in `[0, 1)`.
        u: f32 as "float" @ 20,
        /// Offset of this row's distinct history ids in the flat history buffer.
        hist_off: u32 as "uint32_t" @ 24,
        hist_len: u32 as "uint32_t" @ 28,
        /// How many top log-probabilities to report.
        n_logprobs: u32 as "uint32_t" @ 32,
        /// Offset (in `u32` words) of this row's additive terms in the flat
        /// history buffer: `add_len` pairs of words `(id, f32 bits of delta)`,
        /// ids distinct (`contract::history::additive_terms`: presence and
        /// frequency penalties, `logit_bias`), added after the repetition penalty.
        add_off: u32 as "uint32_t" @ 36,
        add_len: u32 as "uint32_t" @ 40,
        /// Offset (in `u32` words) of this row's allowed-token mask in the flat
        /// history buffer: `mask_len` words, bit `i % 32` of word `i / 32` set
        /// when token `i` may be sampled (`contract::mask`); every other logit
        /// is `-inf` after the additive terms. `mask_len` 0: no mask.
        mask_off: u32 as "uint32_t" @ 44,
        mask_len: u32 as "uint32_t" @ 48,
        _pad: [u32; 3] as "uint32_t[3]" @ 52,
    }

    /// Arguments of `sample_partials` (cu/sampling.cu).
    #[derive(Default)]
    pub struct SamplePartialArgs for "sample_partials", size 64 {
        /// [R, V] raw logits
        logits: u64 as "const float*" @ 0,
        /// [R, V] penalised logits (sampled rows only)
        work: u64 as "float*" @ 8,
        /// `[R]`
        params: u64 as "const SampleParams*" @ 16,
        /// flat, distinct ids per row (then additive terms and masks)
        history: u64 as "const uint32_t*" @ 24,
        /// [R, NB, 2] f32 (max, sum exp(z - max))
        stats: u64 as "float*" @ 32,
        /// [R, NB, 1 + max_lp] greedy key, top raw keys
        keys: u64 as "unsigned long long*" @ 40,
        /// vocabulary size
        v: u32 as "uint32_t" @ 48,
        max_lp: u32 as "uint32_t" @ 52,
        nb: u32 as "uint32_t" @ 56,
        pad: u32 as "uint32_t" @ 60,
    }

    /// Arguments of `sample_rows` (cu/sampling.cu).
    #[derive(Default)]
    pub struct SampleRowsArgs for "sample_rows", size 88 {
        /// [R, V] raw logits
        logits: u64 as "const float*" @ 0,
        /// [R, V] penalised logits (sampled rows)
        work: u64 as "float*" @ 8,
        /// `[R]`
        params: u64 as "const SampleParams*" @ 16,
        /// [R, NB, 2] f32
        stats: u64 as "const float*" @ 24,
        /// [R, NB, 1 + max_lp]
        keys: u64 as "const unsigned long long*" @ 32,
        /// `[R]`
        out_tok: u64 as "uint32_t*" @ 40,
        /// `[R]`
        out_lp: u64 as "float*" @ 48,
        /// [R, max_lp]
        out_top_ids: u64 as "uint32_t*" @ 56,
        /// [R, max_lp]
        out_top_lp: u64 as "float*" @ 64,
        /// vocabulary size
        v: u32 as "uint32_t" @ 72,
        max_lp: u32 as "uint32_t" @ 76,
        nb: u32 as "uint32_t" @ 80,
        pad: u32 as "uint32_t" @ 84,
    }
}
