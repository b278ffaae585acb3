// The argument structs of the kernels: the single description of every
// kernel's one by-value parameter. Each `kernel_args!` entry defines the Rust
// `#[repr(C)]` struct, const-asserts its size and every field's offset
// against the numbers written here, and records the field list in
// [`ALL_ARGS`]. `build.rs` `include!`s this file (so these asserts run there
// too) and writes `OUT_DIR/lamina_args.cuh` from [`ALL_ARGS`]: the matching
// C++ structs with `static_assert(sizeof / offsetof == N)` for the same
// numbers. A field moved, retyped or resized on either side fails a build.
// Pointers are device addresses (`u64` here, the C type after `as`), sizes
// `u32`, scalars `f32`. No `//!` docs: the module doc is in `lib.rs`.

/// One field of an argument struct, as the C++ generator reads it.
#[derive(Debug, Clone, Copy)]
pub struct FieldDesc {
    pub name: &'static str,
    /// `u64` (device pointer), `u32` or `f32`.
    pub rust_type: &'static str,
    /// The C++ type of the field in the generated struct.
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

macro_rules! kernel_args {
    ($(
        $(#[doc = $doc:literal])*
        pub struct $name:ident for $kernel:literal, size $size:literal {
            $(
                $(#[doc = $fdoc:literal])*
                $field:ident : $ty:ident as $cty:literal @ $off:literal
            ),* $(,)?
        }
    )*) => {
        $(
            $(#[doc = $doc])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, Default, PartialEq)]
            pub struct $name {
                $( $(#[doc = $fdoc])* pub $field: $ty, )*
            }
            const _: () = {
                assert!(::std::mem::size_of::<$name>() == $size);
                $( assert!(::std::mem::offset_of!($name, $field) == $off); )*
            };
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
        pad: u32 as "uint32_t" @ 52,
    }

    /// Arguments of `gather_rows_bf16` (cu/embedding.cu).
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

    /// Arguments of `add_rmsnorm` (cu/rmsnorm.cu).
    pub struct AddRmsnormArgs for "add_rmsnorm", size 40 {
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
    }

    /// Arguments of `silu_mul` (cu/activation.cu).
    pub struct SiluMulArgs for "silu_mul", size 24 {
        /// [T, inter] bf16
        out: u64 as "bf16*" @ 0,
        /// [T, 2 inter] bf16, [gate | up]
        gu: u64 as "const bf16*" @ 8,
        tokens: u32 as "uint32_t" @ 16,
        inter: u32 as "uint32_t" @ 20,
    }

    /// Arguments of `rope_kv_write` (cu/rope_kv.cu).
    pub struct RopeKvArgs for "rope_kv_write", size 72 {
        /// [T, (n_heads + 2 n_kv) D] bf16, q heads rotated in place
        qkv: u64 as "bf16*" @ 0,
        /// `[T]`
        positions: u64 as "const uint32_t*" @ 8,
        /// `[T]` physical KV slot of each token
        slots: u64 as "const uint32_t*" @ 16,
        /// [max_pos, D/2] f32 (LlamaConfig::rope_table)
        cos_t: u64 as "const float*" @ 24,
        /// [max_pos, D/2] f32
        sin_t: u64 as "const float*" @ 32,
        /// [slots, n_kv, D] bf16
        k_cache: u64 as "bf16*" @ 40,
        /// [slots, n_kv, D] bf16
        v_cache: u64 as "bf16*" @ 48,
        n_heads: u32 as "uint32_t" @ 56,
        n_kv: u32 as "uint32_t" @ 60,
        head_dim: u32 as "uint32_t" @ 64,
        max_pos: u32 as "uint32_t" @ 68,
    }

    /// Arguments of `prefill_attention_d{D}` (cu/prefill_attention.cu).
    pub struct PrefillAttentionArgs for "prefill_attention_d*", size 80 {
        /// [T, (n_heads + 2 n_kv) D] bf16, q roped
        qkv: u64 as "const bf16*" @ 0,
        /// [slots, n_kv, D] bf16
        k_cache: u64 as "const bf16*" @ 8,
        /// [slots, n_kv, D] bf16
        v_cache: u64 as "const bf16*" @ 16,
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
        /// 1 / sqrt(D)
        scale: f32 as "float" @ 76,
    }
}
