//! gpu: the only crate that touches the CUDA driver, cuBLAS and their FFI.
//!
//! Contract: one [`Gpu`] owns a CUDA context and one non-blocking stream;
//! every operation is ordered on that stream and every driver / cuBLAS status
//! is checked and turned into a [`GpuError`] naming the call. Device memory is
//! held by RAII [`DeviceBuffer`]s, addressed by cheap [`DevSlice`] views that
//! kernels take; host staging memory by page-locked [`PinnedBuffer`]s.
//! [`Blas`] is a row-major GEMM helper over cuBLAS (bf16 in, f32 accumulate)
//! that rejects layouts it cannot express, [`BlasLt`] its FP8 counterpart
//! over cuBLASLt (e4m3 operands with per-row scales), [`InvariantGemm`] both
//! products on pinned, batch-invariant cuBLASLt algorithms; [`Graph`] captures and replays a
//! stream's work as a CUDA graph.
//!
//! Costs: creating a [`Gpu`] initialises the driver (hundreds of ms the first
//! time); allocation is a synchronous `cuMemAlloc`, so the backend allocates
//! up front and never inside a step. Launches, copies and graph replays are
//! asynchronous; [`Gpu::synchronize`] and the `*_to_host` copies block.
//!
//! With the `dynamic-loading` cudarc feature the driver library is opened at
//! run time; [`driver_available`] checks for it first so a machine without a
//! GPU gets an error, never a panic.

mod blas;
mod blaslt;
mod buffer;
mod device;
mod error;
mod graph;
mod invariant;
mod launch;

pub use blas::{Blas, GemmDims, OutType};
pub use blaslt::BlasLt;
pub use buffer::{DevSlice, DeviceBuffer, PinnedBuffer};
pub use device::{Fence, Gpu, Timer, device_count, driver_available};
pub use error::GpuError;
pub use graph::Graph;
pub use invariant::{Algo, Inputs, InvariantGemm, MAX_M as INVARIANT_MAX_M, Operands, Output};
pub use launch::{Function, LaunchConfig, Module};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_reject_ranges_past_the_end() {
        let v = DevSlice::<f32>::null();
        assert!(v.sub(0, 0).is_ok());
        let err = v.sub(0, 1).unwrap_err().to_string();
        assert!(err.contains("runs past the end"), "{err}");
        assert!(v.require("x", 1).unwrap_err().to_string().contains("`x`"));
    }

    #[test]
    fn driver_probe_never_panics() {
        match driver_available() {
            Ok(()) => {}
            Err(why) => assert!(
                why.contains("libcuda") || why.contains("cuInit") || why.contains("no device"),
                "{why}"
            ),
        }
    }
}
