//! Row-major GEMM over cuBLAS: `Y[m, n] = X[m, k] · W[n, k]ᵀ` (or `Y +=`),
//! bf16 operands, f32 accumulation, bf16 or f32 output.
//!
//! Contract: this is the one product shape the model needs (activations times
//! a row-major `[out, in]` weight, as stored by Hugging Face). Operands are
//! dense row-major; a view too short for its shape, a zero or out-of-`i32`
//! dimension is rejected with [`GpuError::Layout`] naming the operand, never
//! passed to cuBLAS. cuBLAS gets a fixed workspace at creation so that GEMMs
//! can be captured into a CUDA graph (no allocation inside).
//! Costs: one cuBLAS launch per call; the handle and workspace are made once.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as bsys};
use half::bf16;

use crate::buffer::{DevSlice, DeviceBuffer};
use crate::device::Gpu;
use crate::error::GpuError;

/// Workspace handed to cuBLAS (its documented recommendation for Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// `m` rows of X and Y, `n` rows of W (columns of Y), `k` the shared inner dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemmDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// Output element types the GEMM can write.
pub trait OutType: bytemuck::Pod {
    #[doc(hidden)]
    const CUDA_TYPE: bsys::cudaDataType;
}
impl OutType for bf16 {
    const CUDA_TYPE: bsys::cudaDataType = bsys::cudaDataType::CUDA_R_16BF;
}
impl OutType for f32 {
    const CUDA_TYPE: bsys::cudaDataType = bsys::cudaDataType::CUDA_R_32F;
}

/// A cuBLAS handle bound to a [`Gpu`]'s stream.
pub struct Blas {
    handle: bsys::cublasHandle_t,
    gpu: Arc<Gpu>,
    _workspace: DeviceBuffer<u8>,
}

// SAFETY: the handle is used only through `&self` methods on one thread at a
// time (the backend's); cuBLAS handles may move between threads.
unsafe impl Send for Blas {}

impl Blas {
    /// Creates a handle on `gpu`'s stream with a fixed workspace.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Blas, GpuError> {
        // SAFETY: probing for the shared library only opens it.
        if !unsafe { bsys::is_culib_present() } {
            return Err(GpuError::NoDriver(
                "the cuBLAS library (libcublas.so) was not found; add the CUDA toolkit's or the \
                 nvidia-cublas wheel's lib folder to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let workspace = gpu.alloc::<u8>(WORKSPACE_BYTES)?;
        gpu.synchronize()?;
        let handle = blas::create_handle().map_err(|source| GpuError::Blas {
            call: "cublasCreate",
            source,
        })?;
        let made = Blas {
            handle,
            gpu: gpu.clone(),
            _workspace: workspace,
        };
        // SAFETY: valid handle and stream of the same context.
        unsafe { blas::set_stream(handle, gpu.cu_stream() as bsys::cudaStream_t) }.map_err(
            |source| GpuError::Blas {
                call: "cublasSetStream",
                source,
            },
        )?;
        // SAFETY: the workspace lives as long as the handle (both owned by `made`).
        unsafe {
            bsys::cublasSetWorkspace_v2(
                handle,
                made._workspace.view().ptr() as *mut c_void,
                WORKSPACE_BYTES,
            )
        }
        .result()
        .map_err(|source| GpuError::Blas {
            call: "cublasSetWorkspace",
            source,
        })?;
        Ok(made)
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` (all row-major), accumulated in f32.
    pub fn matmul_nt<O: OutType>(
        &self,
        x: DevSlice<'_, bf16>,
        w: DevSlice<'_, bf16>,
        y: DevSlice<'_, O>,
        d: GemmDims,
    ) -> Result<(), GpuError> {
        self.gemm_nt(x, w, y, d, 0.0)
    }

    /// `y[m, n] += x[m, k] · w[n, k]ᵀ` (all row-major), accumulated in f32
    /// with `y`'s values and rounded once.
    pub fn matmul_nt_add<O: OutType>(
        &self,
        x: DevSlice<'_, bf16>,
        w: DevSlice<'_, bf16>,
        y: DevSlice<'_, O>,
        d: GemmDims,
    ) -> Result<(), GpuError> {
        self.gemm_nt(x, w, y, d, 1.0)
    }

    /// `y = x · wᵀ + beta · y`.
    fn gemm_nt<O: OutType>(
        &self,
        x: DevSlice<'_, bf16>,
        w: DevSlice<'_, bf16>,
        y: DevSlice<'_, O>,
        d: GemmDims,
        beta: f32,
    ) -> Result<(), GpuError> {
        let dim = |name: &str, v: usize| -> Result<i32, GpuError> {
            match i32::try_from(v) {
                Ok(x) if x > 0 => Ok(x),
                _ => Err(GpuError::Layout(format!(
                    "dimension {name} = {v} must be in 1..=i32::MAX"
                ))),
            }
        };
        let (m, n, k) = (dim("m", d.m)?, dim("n", d.n)?, dim("k", d.k)?);
        for (what, have, need) in [
            ("x [m, k]", x.len(), d.m * d.k),
            ("w [n, k]", w.len(), d.n * d.k),
            ("y [m, n]", y.len(), d.m * d.n),
        ] {
            if have < need {
                return Err(GpuError::Layout(format!(
                    "operand {what} with m={}, n={}, k={} needs {need} elements, view holds {have}",
                    d.m, d.n, d.k
                )));
            }
        }
        drv_bind(&self.gpu)?;
        let alpha = 1.0f32;
        // Column-major view: Yᵀ[n, m] = W[n, k] (stored as k x n, transposed) · Xᵀ (k x m).
        // SAFETY: the views were checked to hold the operands; the handle is on our stream.
        unsafe {
            blas::gemm_ex(
                self.handle,
                bsys::cublasOperation_t::CUBLAS_OP_T,
                bsys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                &alpha as *const f32 as *const c_void,
                w.ptr() as *const c_void,
                bsys::cudaDataType::CUDA_R_16BF,
                k,
                x.ptr() as *const c_void,
                bsys::cudaDataType::CUDA_R_16BF,
                k,
                &beta as *const f32 as *const c_void,
                y.ptr() as *mut c_void,
                O::CUDA_TYPE,
                n,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|source| GpuError::Blas {
            call: "cublasGemmEx",
            source,
        })
    }
}

fn drv_bind(gpu: &Gpu) -> Result<(), GpuError> {
    crate::error::drv("cuCtxSetCurrent", gpu.ctx().bind_to_thread())
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created once and is destroyed once.
        let _ = unsafe { blas::destroy_handle(self.handle) };
    }
}
