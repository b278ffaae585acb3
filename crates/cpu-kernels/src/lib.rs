//! cpu-kernels: the CPU backend's fast kernels, chosen at run time by what
//! the processor has.
//!
//! Contract: every kernel computes what its reference in the `ops` crate
//! computes (same inputs, same layout, f32 arithmetic over BF16 weights
//! widened exactly), differing only in the order of the additions, so results
//! agree with the reference to f32 rounding (about `1e-6` relative per dot
//! product). The instruction set is picked once per process ([`Isa::best`]:
//! AVX-512F, else AVX2 + FMA, else the portable code, which LLVM vectorises
//! for the target's baseline, NEON on aarch64); every kernel also takes an
//! explicit [`Isa`] so that tests run each path the machine can run against
//! the portable one. Parallel work runs on rayon's global pool (the caller
//! sizes it); small inputs run on the calling thread.
//!
//! Modules: [`isa`] (detection), [`matmul`] (BF16 weights times f32
//! activations: register-tiled kernels for few tokens, the `gemm` crate over
//! weights widened to f32 in a reused buffer for many), [`vector`] (dot,
//! axpy, RMSNorm, SwiGLU, residual add: the elementwise operations), [`kv`]
//! (attention's scores and value sums over K/V rows stored as f32, BF16
//! or FP8, all query heads of a KV head at once), [`dense`] (f64 products
//! over strided views, for the GPTQ quantiser), [`int4`] (group-wise 4-bit
//! weights of AWQ / GPTQ / compressed-tensors checkpoints),
//! [`threads`] (the rayon pool on the physical cores).
//!
//! Costs: see each module. No allocation per call except the growth of a
//! caller-owned [`matmul::Scratch`].

pub mod dense;
pub mod gemm512;
pub mod gemm_split;
pub mod int4;
pub mod isa;
pub mod kv;
pub mod matmul;
pub mod pairs;
pub mod quant;
pub mod threads;
pub mod vector;

/// A raw pointer to an output buffer, shared by rayon tasks that each write
/// disjoint elements (distinct weight rows or panels) while the owning
/// `&mut [f32]` is not otherwise used.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Send` wrapper).
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: every user writes disjoint elements through the pointer while the
// owning slice is borrowed mutably by that user alone.
unsafe impl Send for OutPtr {}
// SAFETY: as for Send: no two tasks touch the same element.
unsafe impl Sync for OutPtr {}

pub use isa::{Isa, IsaCap};
pub use matmul::{Scratch, matmul_bf16};
