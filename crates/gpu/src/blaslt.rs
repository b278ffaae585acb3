//! FP8 GEMM over cuBLASLt: `Y[m, n] = (sx[m] · X8[m, k]) · (sw[n] · W8[n, k])ᵀ`,
//! e4m3 operands each with one f32 scale per row (cuBLASLt's outer-vector
//! scaling: per token for the activations, per output channel for the
//! weights), f32 accumulation, bf16 output.
//!
//! Contract: the row-major product of [`crate::Blas::matmul_nt`] in FP8.
//! A shape cuBLASLt has no algorithm for is reported by [`BlasLt::supports`]
//! (the caller keeps another path); views too short, zero or out-of-`i32`
//! dimensions and `k` not a multiple of 16 are rejected with
//! [`GpuError::Layout`] before any call. The workspace is fixed at creation,
//! so calls can be captured into a CUDA graph.
//! Costs: one cuBLASLt launch per call; the descriptors and the chosen
//! algorithm of each shape are made once (an algorithm query, ~0.1 ms) and
//! cached.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys};
use half::bf16;

use crate::blas::GemmDims;
use crate::buffer::{DevSlice, DeviceBuffer};
use crate::device::Gpu;
use crate::error::GpuError;

/// Workspace handed to cuBLASLt (its recommendation for Hopper).
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

pub(crate) fn lt_err(call: &'static str) -> impl Fn(lt::CublasError) -> GpuError {
    move |e| GpuError::BlasLt { call, source: e }
}

/// A matmul descriptor, destroyed on drop.
pub(crate) struct Desc(pub(crate) sys::cublasLtMatmulDesc_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created once by `Desc::new`, destroyed once; cuBLASLt has
        // copied what it needs by the time a matmul call returns.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}

impl Desc {
    /// The row-major product's descriptor: `op(A) = Aᵀ`, `op(B) = B`, f32
    /// compute and scale type, no operand scales.
    pub(crate) fn plain() -> Result<Desc, GpuError> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let desc = Desc(
            lt::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            )
            .map_err(lt_err("cublasLtMatmulDescCreate"))?,
        );
        let (t, n) = (
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32,
            cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N as i32,
        );
        // SAFETY: the descriptor was just created; each value has the
        // attribute's documented type (int32 enums).
        unsafe {
            set_desc(desc.0, A::CUBLASLT_MATMUL_DESC_TRANSA, &t)?;
            set_desc(desc.0, A::CUBLASLT_MATMUL_DESC_TRANSB, &n)?;
        }
        Ok(desc)
    }

    /// The FP8 product's descriptor: [`Desc::plain`] with outer-vector
    /// scales at `sw` (per row of `op(A)`) and `sx` (per column of `B`).
    pub(crate) fn new(sw: u64, sx: u64) -> Result<Desc, GpuError> {
        use sys::cublasLtMatmulDescAttributes_t as A;
        let desc = Desc::plain()?;
        let outer =
            sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F as i32;
        // SAFETY: the descriptor is live; each value has the attribute's
        // documented type (int32 enums, device pointers as u64).
        unsafe {
            set_desc(desc.0, A::CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer)?;
            set_desc(desc.0, A::CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer)?;
            set_desc(desc.0, A::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw)?;
            set_desc(desc.0, A::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx)?;
        }
        Ok(desc)
    }
}

/// The layouts and algorithm of one shape.
struct Plan {
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: Option<sys::cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each layout was created once by `BlasLt::plan` and is destroyed once.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.d);
        }
    }
}

/// A cuBLASLt handle on a [`Gpu`]'s stream with its fixed workspace (what
/// every cuBLASLt product here holds); the handle is destroyed on drop.
pub(crate) struct LtHandle {
    pub(crate) handle: sys::cublasLtHandle_t,
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) workspace: DeviceBuffer<u8>,
}

impl LtHandle {
    /// Creates a handle with a fixed workspace; an error when the library
    /// (libcublasLt.so) cannot be opened.
    pub(crate) fn new(gpu: &Arc<Gpu>) -> Result<LtHandle, GpuError> {
        // SAFETY: probing for the shared library only opens it.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::NoDriver(
                "the cuBLASLt library (libcublasLt.so) was not found".into(),
            ));
        }
        let workspace = gpu.alloc::<u8>(WORKSPACE_BYTES)?;
        gpu.synchronize()?;
        let handle = lt::create_handle().map_err(lt_err("cublasLtCreate"))?;
        Ok(LtHandle {
            handle,
            gpu: gpu.clone(),
            workspace,
        })
    }
}

impl Drop for LtHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created once and is destroyed once (its
        // owner declares it last, so its layouts go first).
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// A cuBLASLt handle bound to a [`Gpu`]'s stream, with its per-shape plans.
pub struct BlasLt {
    plans: RefCell<HashMap<GemmDims, Plan>>,
    lt: LtHandle,
}

// SAFETY: the handle and plans are used only through `&self` methods on one
// thread at a time (the backend's); cuBLASLt handles may move between threads.
unsafe impl Send for BlasLt {}

impl BlasLt {
    /// Creates a handle with a fixed workspace; an error when the library
    /// (libcublasLt.so) cannot be opened.
    pub fn new(gpu: &Arc<Gpu>) -> Result<BlasLt, GpuError> {
        Ok(BlasLt {
            plans: RefCell::new(HashMap::new()),
            lt: LtHandle::new(gpu)?,
        })
    }

    /// Whether cuBLASLt has an FP8 algorithm for shape `d` on this device.
    pub fn supports(&self, d: GemmDims) -> Result<bool, GpuError> {
        dims(d)?;
        self.with_plan(d, |p| Ok(p.algo.is_some()))
    }

    /// `y[m, n] = (sx[m] x[m, k]) · (sw[n] w[n, k])ᵀ` (row-major, e4m3
    /// operands, f32 row scales), accumulated in f32, written as bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul_fp8_nt(
        &self,
        x: DevSlice<'_, u8>,
        sx: DevSlice<'_, f32>,
        w: DevSlice<'_, u8>,
        sw: DevSlice<'_, f32>,
        y: DevSlice<'_, bf16>,
        d: GemmDims,
    ) -> Result<(), GpuError> {
        dims(d)?;
        for (what, have, need) in [
            ("x [m, k]", x.len(), d.m * d.k),
            ("sx [m]", sx.len(), d.m),
            ("w [n, k]", w.len(), d.n * d.k),
            ("sw [n]", sw.len(), d.n),
            ("y [m, n]", y.len(), d.m * d.n),
        ] {
            if have < need {
                return Err(GpuError::Layout(format!(
                    "FP8 operand {what} with m={}, n={}, k={} needs {need} elements, view holds {have}",
                    d.m, d.n, d.k
                )));
            }
        }
        crate::error::drv("cuCtxSetCurrent", self.lt.gpu.ctx().bind_to_thread())?;
        self.with_plan(d, |p| {
            let algo = p.algo.as_ref().ok_or_else(|| {
                GpuError::Layout(format!(
                    "cuBLASLt has no FP8 algorithm for m={}, n={}, k={}",
                    d.m, d.n, d.k
                ))
            })?;
            // cuBLAS's column-major view: Yᵀ[n, m] = op(A) · B with A = W
            // (k x n, transposed: n x k, scaled per row of op(A)) and B = Xᵀ
            // (k x m, scaled per column). A descriptor per call: its scale
            // pointers are this call's.
            let desc = Desc::new(sw.ptr(), sx.ptr())?;
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: views checked to hold the operands; handle, plan and
            // workspace are ours; the stream is the Gpu's.
            unsafe {
                lt::matmul(
                    self.lt.handle,
                    desc.0,
                    &alpha as *const f32 as *const c_void,
                    &beta as *const f32 as *const c_void,
                    w.ptr() as *const c_void,
                    p.a,
                    x.ptr() as *const c_void,
                    p.b,
                    y.ptr() as *const c_void,
                    p.d,
                    y.ptr() as *mut c_void,
                    p.d,
                    algo,
                    self.lt.workspace.view().ptr() as *mut c_void,
                    WORKSPACE_BYTES,
                    self.lt.gpu.cu_stream() as sys::cudaStream_t,
                )
            }
            .map_err(lt_err("cublasLtMatmul"))
        })
    }

    /// Runs `f` on the plan of shape `d`, made on first use.
    fn with_plan<T>(
        &self,
        d: GemmDims,
        f: impl FnOnce(&Plan) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        let mut plans = self.plans.borrow_mut();
        let plan = match plans.entry(d) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(d)?),
        };
        f(plan)
    }

    /// The layouts of shape `d` and cuBLASLt's first algorithm for it.
    fn plan(&self, d: GemmDims) -> Result<Plan, GpuError> {
        let e4m3 = sys::cudaDataType::CUDA_R_8F_E4M3;
        let (m, n, k) = (d.m as u64, d.n as u64, d.k as u64);
        // the algorithm query wants scale pointers set (any device address)
        let any = self.lt.workspace.view().ptr();
        let desc = Desc::new(any, any)?;
        // (each layout is owned by `plan` from here, dropped with it)
        let mut plan = Plan {
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: None,
        };
        let layout = |t, rows, cols, ld| {
            lt::create_matrix_layout(t, rows, cols, ld)
                .map_err(lt_err("cublasLtMatrixLayoutCreate"))
        };
        plan.a = layout(e4m3, k, n, k as i64)?;
        plan.b = layout(e4m3, k, m, k as i64)?;
        plan.d = layout(sys::cudaDataType::CUDA_R_16BF, n, m, n as i64)?;
        let pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let bytes = WORKSPACE_BYTES as u64;
        // SAFETY: `pref` was just created and is destroyed below; the
        // attribute is a uint64; the descriptors are valid.
        let found = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &bytes as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            );
            let found = set.and_then(|()| {
                lt::get_matmul_algo_heuristic(
                    self.lt.handle,
                    desc.0,
                    plan.a,
                    plan.b,
                    plan.d,
                    plan.d,
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            found
        };
        plan.algo = found.ok().map(|h| h.algo);
        Ok(plan)
    }
}

/// Sets descriptor attribute `attr` to `v`.
///
/// # Safety
/// `desc` is a live descriptor and `T` is the attribute's documented type.
pub(crate) unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    v: &T,
) -> Result<(), GpuError> {
    // SAFETY: forwarded from the caller; `v` is valid for its size.
    unsafe {
        lt::set_matmul_desc_attribute(
            desc,
            attr,
            v as *const T as *const c_void,
            std::mem::size_of::<T>(),
        )
    }
    .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
}

/// Checks the dimensions: each in `1..=i32::MAX`, `k` a multiple of 16
/// (cuBLASLt's FP8 alignment).
pub(crate) fn dims(d: GemmDims) -> Result<(), GpuError> {
    for (name, v) in [("m", d.m), ("n", d.n), ("k", d.k)] {
        if v == 0 || i32::try_from(v).is_err() {
            return Err(GpuError::Layout(format!(
                "dimension {name} = {v} must be in 1..=i32::MAX"
            )));
        }
    }
    if !d.k.is_multiple_of(16) {
        return Err(GpuError::Layout(format!(
            "FP8 GEMM: k = {} must be a multiple of 16",
            d.k
        )));
    }
    Ok(())
}
