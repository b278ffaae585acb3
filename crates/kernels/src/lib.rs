//! kernels: the CUDA kernels of the Llama forward pass, their typed Rust
//! launchers and a CPU reference for each.
//!
//! Contract: `build.rs` compiles every `src/cu/*.cu` (one kernel family per
//! file) into one fatbin embedded in the binary; [`Kernels::load`] loads it
//! once and resolves every entry point, or says exactly why CUDA kernels are
//! unavailable ([`unavailable_reason`]). Each launcher sits in the Rust file
//! named after its `.cu` file, checks every view's length against the shape
//! it is given before launching, and reports launch failures as
//! [`KernelError`]. Launchers whose kernels index memory through device-side
//! tables (token ids, slots, block tables) are `unsafe fn`: the caller
//! guarantees those indices are in range (the backend validates each batch
//! on the host). The `*_ref` functions are the CPU references the GPU tests
//! compare against.
//! Costs: loading the module takes milliseconds; launches are asynchronous.

pub mod activation;
pub mod decode_attention;
pub mod embedding;
pub mod flash_prefill;
pub mod prefill_attention;
pub mod rmsnorm;
pub mod rope_kv;
pub mod sampling;

use std::sync::Arc;

use gpu::{Function, Gpu, GpuError, Module};

pub use decode_attention::DecodePlan;
pub use sampling::SampleParams;

/// Errors loading or launching kernels.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The binary carries no kernels (no nvcc at build time).
    #[error("{0}")]
    Unavailable(String),
    /// A driver / cuBLAS / buffer error.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Operands inconsistent with the shape a launcher was given.
    #[error("kernel `{kernel}`: {reason}")]
    Shape {
        kernel: &'static str,
        reason: String,
    },
    /// A shape the kernels were not built for.
    #[error("kernel `{kernel}` does not support {reason}")]
    Unsupported {
        kernel: &'static str,
        reason: String,
    },
}

#[cfg(kernels_built)]
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kernels.fatbin"));

/// The embedded fatbin, or why there is none.
pub fn fatbin() -> Result<&'static [u8], KernelError> {
    #[cfg(kernels_built)]
    {
        Ok(FATBIN)
    }
    #[cfg(not(kernels_built))]
    {
        Err(KernelError::Unavailable(
            env!("KERNELS_UNAVAILABLE").to_string(),
        ))
    }
}

/// `None` when this binary carries CUDA kernels, else the reason and the fix.
pub fn unavailable_reason() -> Option<String> {
    fatbin().err().map(|e| e.to_string())
}

/// Query / KV head counts and head size of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl HeadShape {
    /// Width of one fused `[q | k | v]` row: `(heads + 2 kv_heads) * head_dim`.
    pub fn qkv_width(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads.max(1)
    }
    /// Elements of one cache slot: `kv_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    fn check(&self, kernel: &'static str) -> Result<(), KernelError> {
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(KernelError::Shape {
                kernel,
                reason: format!(
                    "{} heads not divisible by {} KV heads",
                    self.num_heads, self.num_kv_heads
                ),
            });
        }
        Ok(())
    }
}

/// Every entry point of the loaded kernel module.
pub struct Kernels {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) embedding_gather: Function,
    pub(crate) gather_rows_bf16: Function,
    pub(crate) add_rmsnorm: Function,
    pub(crate) rope_kv_write: Function,
    pub(crate) silu_mul: Function,
    pub(crate) prefill: [Function; 4],
    pub(crate) decode: [Function; 4],
    pub(crate) flash_prefill: [Function; 2],
    pub(crate) decode_combine: Function,
    pub(crate) sample_rows: Function,
    _module: Module,
}

impl Kernels {
    /// Loads the embedded fatbin on `gpu` and resolves every kernel.
    pub fn load(gpu: &Arc<Gpu>) -> Result<Kernels, KernelError> {
        let module = gpu.load_module(fatbin()?)?;
        let f = |name: &str| module.function(name);
        Ok(Kernels {
            gpu: gpu.clone(),
            embedding_gather: f("embedding_gather")?,
            gather_rows_bf16: f("gather_rows_bf16")?,
            add_rmsnorm: f("add_rmsnorm")?,
            rope_kv_write: f("rope_kv_write")?,
            silu_mul: f("silu_mul")?,
            prefill: [
                f("prefill_attention_d16")?,
                f("prefill_attention_d32")?,
                f("prefill_attention_d64")?,
                f("prefill_attention_d128")?,
            ],
            decode: [
                f("decode_attention_d16")?,
                f("decode_attention_d32")?,
                f("decode_attention_d64")?,
                f("decode_attention_d128")?,
            ],
            flash_prefill: flash_prefill::load_functions(&module)?,
            decode_combine: f("decode_combine")?,
            sample_rows: f("sample_rows")?,
            _module: module,
        })
    }

    /// The device the kernels run on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

/// Head sizes the attention kernels are instantiated for (index = entry in `Kernels::prefill` / `decode`).
pub const HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Index of `head_dim` in [`HEAD_DIMS`], or the error naming the kernel.
pub(crate) fn head_dim_index(kernel: &'static str, head_dim: usize) -> Result<usize, KernelError> {
    HEAD_DIMS
        .iter()
        .position(|&d| d == head_dim)
        .ok_or(KernelError::Unsupported {
            kernel,
            reason: format!("head_dim {head_dim} (built for {HEAD_DIMS:?})"),
        })
}

/// Checks `view` holds at least `need` elements; the error names kernel and operand.
pub(crate) fn need<T>(
    kernel: &'static str,
    what: &str,
    view: &gpu::DevSlice<'_, T>,
    need: usize,
) -> Result<(), KernelError> {
    if view.len() < need {
        return Err(KernelError::Shape {
            kernel,
            reason: format!(
                "operand `{what}` needs {need} elements, view holds {}",
                view.len()
            ),
        });
    }
    Ok(())
}

/// Converts a size to the kernels' 32-bit parameters; the error names it.
pub(crate) fn u32_of(kernel: &'static str, what: &str, v: usize) -> Result<u32, KernelError> {
    u32::try_from(v).map_err(|_| KernelError::Shape {
        kernel,
        reason: format!("`{what}` = {v} exceeds 32 bits"),
    })
}

/// Round-trips an f32 through bf16 (what the GPU stores).
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_is_consistent_with_the_build() {
        match fatbin() {
            Ok(bytes) => assert!(bytes.len() > 1000, "fatbin of {} bytes", bytes.len()),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("built without CUDA kernels"), "{msg}");
                assert!(unavailable_reason().is_some());
            }
        }
    }
}
