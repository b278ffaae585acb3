//! model: the Llama layer pipeline, once per backend.
//!
//! [`cpu`] is the reference backend (f32 arithmetic over BF16 weights) and the
//! fallback; [`cuda`] runs the same step on an NVIDIA GPU with our kernels and
//! cuBLAS. Both implement [`contract::Backend`] over the same
//! [`contract::StepBatch`] and sample with the procedure of [`sampler`].
//! Configuration, weights and tokenizers come from the crates below
//! (`contract`, `checkpoint`); nothing above this crate sees CUDA.

pub mod cpu;
pub mod cuda;
#[cfg(any(test, feature = "testing"))]
pub mod exact;
pub mod sampler;

pub use kernels::KernelOptions;

/// The [`KernelOptions`] of every CUDA backend this process creates: set by
/// the binary before the first backend starts, fixed at that start
/// ([`KernelOptions::default`] when never set).
static KERNEL_OPTIONS: std::sync::OnceLock<KernelOptions> = std::sync::OnceLock::new();

/// Sets the [`KernelOptions`] of the CUDA backends to come. Setting the
/// options in force again is a no-op; other options after a CUDA backend
/// started are refused (`Err` carries the options in force).
pub fn set_kernel_options(options: KernelOptions) -> Result<(), KernelOptions> {
    let current = *KERNEL_OPTIONS.get_or_init(|| options);
    if current == options {
        Ok(())
    } else {
        Err(current)
    }
}

/// The options a CUDA backend starts its kernels with.
pub(crate) fn kernel_options() -> KernelOptions {
    *KERNEL_OPTIONS.get_or_init(KernelOptions::default)
}
