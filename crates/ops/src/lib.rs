//! ops: the one reference implementation of each operation of the Llama
//! forward pass, in plain Rust (no CUDA, no device).
//!
//! Contract: these functions ARE the CPU backend's forward pass
//! (`model::cpu` calls them and nothing else for these operations), and the
//! CUDA kernels' GPU tests compare against the same functions, so the CPU
//! backend, the golden tests and the kernel tests share one definition of
//! RoPE, RMSNorm, SwiGLU, embedding / row gather, the paged KV write and
//! paged causal attention; likewise one sampling procedure ([`sampling`]:
//! the CPU backend's sampler, the CUDA sampler's reference). Arithmetic is
//! f32 (RMSNorm's mean of squares in f64); BF16 inputs are widened to f32
//! exactly. The RoPE tables come from
//! [`contract::config::ModelConfig::rope_table`].
//!
//! The KV cache: [`kv`] is the one codec of its stored types (f32, BF16,
//! FP8 e4m3 at a per-layer scale). The exact reference path keeps K/V in
//! f32 ([`kv_write`], [`paged_attention`]: what the CPU backend's
//! constructors use, the golden tests' 1e-4 and the kernels' tests);
//! [`kv_write_in`] / [`paged_attention_in`] are the same operations over
//! any stored type (BF16 is the CLI's default, `--kv-cache-dtype`).
//!
//! Layouts are row-major and stated on every function (`[T, hidden]` = `T`
//! rows of `hidden`). Costs are stated per module; the heavy operations
//! (matmul, attention, RMSNorm) run in parallel on rayon's global pool.

pub mod activation;
pub mod attention;
pub mod embedding;
pub mod fp8;
pub mod hadamard;
pub mod kv;
pub mod linear;
pub mod norm;
pub mod rope;
pub mod sampling;

pub use attention::{
    AttnDims, PagedSeqs, ScoreRule, kv_write, kv_write_in, paged_attention, paged_attention_in,
    paged_attention_with,
};
pub use kv::{KvCache, KvElem, KvView, kv_round};
pub use rope::Rope;
