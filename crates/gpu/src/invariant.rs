//! Batch-invariant GEMMs over cuBLASLt (deterministic mode): every product
//! shape `(operands, n, k)` runs one pinned algorithm at every row count
//! `m`, an algorithm that neither splits K nor reduces across blocks, so a
//! row's result does not depend on how many rows share the call or where
//! the row sits.
//!
//! Contract: the row-major products of [`crate::Blas::matmul_nt`] (bf16
//! in, bf16 or f32 out) and [`crate::BlasLt::matmul_fp8_nt`] (e4m3 with
//! per-row scales, bf16 out). [`InvariantGemm::candidates`] lists
//! cuBLASLt's algorithms for a shape that keep K whole and run at every `m`
//! in `1..=MAX_M`; the caller picks one (timing each through
//! [`InvariantGemm::matmul`] with `Some(algo)`) and [`InvariantGemm::pin`]s
//! it. A product of an unpinned shape, `m > MAX_M`, a view too short or a
//! zero dimension is an error naming it, never passed to cuBLASLt. The
//! workspace is fixed at creation, so calls can be captured into a graph.
//! Costs: one cuBLASLt launch per call; layouts are made once per
//! `(operands, m, n, k)` and cached.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys};
use half::bf16;

use crate::blas::GemmDims;
use crate::blaslt::{Desc, LtHandle, WORKSPACE_BYTES, dims, lt_err};
use crate::buffer::DevSlice;
use crate::device::Gpu;
use crate::error::GpuError;

/// Most rows one invariant product takes (every candidate runs up to it).
pub const MAX_M: usize = 1 << 16;

/// Heuristic results asked for at each probe row count.
const PROBE_ALGOS: usize = 32;

/// The operand and output types of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operands {
    /// bf16 inputs, bf16 output.
    Bf16,
    /// bf16 inputs, f32 output (logits).
    Bf16ToF32,
    /// e4m3 inputs with f32 row scales, bf16 output.
    Fp8,
}

impl Operands {
    fn types(self) -> (sys::cudaDataType, sys::cudaDataType) {
        use sys::cudaDataType as T;
        match self {
            Operands::Bf16 => (T::CUDA_R_16BF, T::CUDA_R_16BF),
            Operands::Bf16ToF32 => (T::CUDA_R_16BF, T::CUDA_R_32F),
            Operands::Fp8 => (T::CUDA_R_8F_E4M3, T::CUDA_R_16BF),
        }
    }
}

/// The inputs of one product: `x [m, k]` and `w [n, k]`, row-major.
#[derive(Clone, Copy)]
pub enum Inputs<'a> {
    Bf16 {
        x: DevSlice<'a, bf16>,
        w: DevSlice<'a, bf16>,
    },
    /// `x` quantised per row with scales `sx [m]`, `w` per output channel with `sw [n]`.
    Fp8 {
        x: DevSlice<'a, u8>,
        sx: DevSlice<'a, f32>,
        w: DevSlice<'a, u8>,
        sw: DevSlice<'a, f32>,
    },
}

/// The output `y [m, n]` of one product.
#[derive(Clone, Copy)]
pub enum Output<'a> {
    Bf16(DevSlice<'a, bf16>),
    F32(DevSlice<'a, f32>),
}

/// One cuBLASLt algorithm (opaque), as [`InvariantGemm::candidates`] lists them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Algo(sys::cublasLtMatmulAlgo_t);

/// The layouts of one `(operands, m, n, k)`.
struct Layouts {
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
}

impl Drop for Layouts {
    fn drop(&mut self) {
        // SAFETY: each non-null layout was created once by `Layouts::new`
        // and is destroyed once.
        unsafe {
            for l in [self.a, self.b, self.d] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
        }
    }
}

impl Layouts {
    /// cuBLAS's column-major view: `Yᵀ[n, m] = op(A) · B`, `A = W` (k x n,
    /// transposed), `B = Xᵀ` (k x m).
    fn new(ops: Operands, d: GemmDims) -> Result<Layouts, GpuError> {
        let (input, out) = ops.types();
        let (m, n, k) = (d.m as u64, d.n as u64, d.k as u64);
        let mut l = Layouts {
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
        };
        let layout = |t, rows, cols, ld| {
            lt::create_matrix_layout(t, rows, cols, ld)
                .map_err(lt_err("cublasLtMatrixLayoutCreate"))
        };
        l.a = layout(input, k, n, k as i64)?;
        l.b = layout(input, k, m, k as i64)?;
        l.d = layout(out, n, m, n as i64)?;
        Ok(l)
    }
}

/// A cuBLASLt handle whose products run pinned algorithms (module doc).
pub struct InvariantGemm {
    pinned: RefCell<HashMap<(Operands, usize, usize), Algo>>,
    layouts: RefCell<HashMap<(Operands, GemmDims), Layouts>>,
    lt: LtHandle,
}

// SAFETY: the handle, layouts and algorithms are used only through `&self`
// methods on one thread at a time (the backend's); cuBLASLt handles may
// move between threads.
unsafe impl Send for InvariantGemm {}

impl InvariantGemm {
    /// Creates a handle with a fixed workspace; an error when the library
    /// (libcublasLt.so) cannot be opened.
    pub fn new(gpu: &Arc<Gpu>) -> Result<InvariantGemm, GpuError> {
        Ok(InvariantGemm {
            pinned: RefCell::new(HashMap::new()),
            layouts: RefCell::new(HashMap::new()),
            lt: LtHandle::new(gpu)?,
        })
    }

    /// The descriptor of `ops` (FP8: with scales at `sw` and `sx`).
    fn desc(ops: Operands, sw: u64, sx: u64) -> Result<Desc, GpuError> {
        match ops {
            Operands::Fp8 => Desc::new(sw, sx),
            _ => Desc::plain(),
        }
    }

    /// cuBLASLt's algorithms for `(ops, n, k)` that keep K whole (no
    /// split-K, no cross-block reduction) and run at `m = 1` and at
    /// [`MAX_M`], in the order its heuristics ranked them at a few row
    /// counts (empty: no such algorithm).
    pub fn candidates(&self, ops: Operands, n: usize, k: usize) -> Result<Vec<Algo>, GpuError> {
        dims(GemmDims { m: 1, n, k })?;
        crate::error::drv("cuCtxSetCurrent", self.lt.gpu.ctx().bind_to_thread())?;
        // the queries want scale pointers set (any device address)
        let any = self.lt.workspace.view().ptr();
        let desc = Self::desc(ops, any, any)?;
        let mut found: Vec<Algo> = Vec::new();
        for m in [1, 16, 256, 4096] {
            let lay = Layouts::new(ops, GemmDims { m, n, k })?;
            for a in self.heuristics(&desc, &lay)? {
                if !found.contains(&a) {
                    found.push(a);
                }
            }
        }
        let (one, big) = (
            Layouts::new(ops, GemmDims { m: 1, n, k })?,
            Layouts::new(ops, GemmDims { m: MAX_M, n, k })?,
        );
        found
            .retain(|a| keeps_k_whole(a) && self.runs(&desc, &one, a) && self.runs(&desc, &big, a));
        Ok(found)
    }

    /// Up to [`PROBE_ALGOS`] heuristic results for `lay`.
    fn heuristics(&self, desc: &Desc, lay: &Layouts) -> Result<Vec<Algo>, GpuError> {
        let pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let bytes = WORKSPACE_BYTES as u64;
        let mut out = vec![empty_result(); PROBE_ALGOS];
        let mut count = 0i32;
        // SAFETY: `pref` was just created and is destroyed below; the
        // attribute is a uint64; descriptors and layouts are live; `out`
        // holds PROBE_ALGOS results.
        let status = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &bytes as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            );
            let found = set.and_then(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.lt.handle,
                    desc.0,
                    lay.a,
                    lay.b,
                    lay.d,
                    lay.d,
                    pref,
                    PROBE_ALGOS as i32,
                    out.as_mut_ptr(),
                    &mut count,
                )
                .result()
            });
            let _ = lt::destroy_matmul_pref(pref);
            found
        };
        // no algorithm for a shape is an empty list, not an error
        if status.is_err() {
            return Ok(Vec::new());
        }
        let n = usize::try_from(count).unwrap_or(0).min(PROBE_ALGOS);
        Ok(out[..n]
            .iter()
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS)
            .map(|r| Algo(r.algo))
            .collect())
    }

    /// Whether `algo` runs the shape of `lay` within the workspace.
    fn runs(&self, desc: &Desc, lay: &Layouts, algo: &Algo) -> bool {
        let mut res = empty_result();
        // SAFETY: live handle, descriptor and layouts; `res` is written by the call.
        let st = unsafe {
            sys::cublasLtMatmulAlgoCheck(
                self.lt.handle,
                desc.0,
                lay.a,
                lay.b,
                lay.d,
                lay.d,
                &algo.0,
                &mut res,
            )
        };
        st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && res.workspaceSize <= WORKSPACE_BYTES
    }

    /// Runs every product of `(ops, n, k)` on `algo` from now on.
    pub fn pin(&self, ops: Operands, n: usize, k: usize, algo: Algo) {
        self.pinned.borrow_mut().insert((ops, n, k), algo);
    }

    /// Whether `(ops, n, k)` has a pinned algorithm.
    pub fn is_pinned(&self, ops: Operands, n: usize, k: usize) -> bool {
        self.pinned.borrow().contains_key(&(ops, n, k))
    }

    /// `y[m, n] = x[m, k] · w[n, k]ᵀ` (FP8: each side times its row
    /// scales), accumulated in f32, on `algo` or else the shape's pinned one.
    pub fn matmul(
        &self,
        inputs: Inputs<'_>,
        out: Output<'_>,
        d: GemmDims,
        algo: Option<&Algo>,
    ) -> Result<(), GpuError> {
        dims(d)?;
        if d.m > MAX_M {
            return Err(GpuError::Layout(format!(
                "invariant GEMM: m = {} rows exceed the most one call takes ({MAX_M})",
                d.m
            )));
        }
        let (ops, ptrs) = operands(inputs, out, d)?;
        let pinned = self.pinned.borrow();
        let algo = match algo.or_else(|| pinned.get(&(ops, d.n, d.k))) {
            Some(a) => *a,
            None => {
                return Err(GpuError::Layout(format!(
                    "invariant GEMM: no algorithm pinned for {ops:?} n={}, k={}",
                    d.n, d.k
                )));
            }
        };
        crate::error::drv("cuCtxSetCurrent", self.lt.gpu.ctx().bind_to_thread())?;
        let desc = Self::desc(ops, ptrs.sw, ptrs.sx)?;
        let mut layouts = self.layouts.borrow_mut();
        let lay = match layouts.entry((ops, d)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(Layouts::new(ops, d)?),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: `operands` checked the views hold the operands; handle,
        // layouts and workspace are ours; the stream is the Gpu's.
        unsafe {
            lt::matmul(
                self.lt.handle,
                desc.0,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                ptrs.w as *const c_void,
                lay.a,
                ptrs.x as *const c_void,
                lay.b,
                ptrs.y as *const c_void,
                lay.d,
                ptrs.y as *mut c_void,
                lay.d,
                &algo.0,
                self.lt.workspace.view().ptr() as *mut c_void,
                WORKSPACE_BYTES,
                self.lt.gpu.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(lt_err("cublasLtMatmul"))
    }
}

/// Device addresses of one product's operands.
struct Ptrs {
    x: u64,
    w: u64,
    y: u64,
    sx: u64,
    sw: u64,
}

/// The operand kind of `inputs` and `out` and their addresses, after
/// checking every view holds its operand for `d`.
fn operands(
    inputs: Inputs<'_>,
    out: Output<'_>,
    d: GemmDims,
) -> Result<(Operands, Ptrs), GpuError> {
    let (y, y_len) = match out {
        Output::Bf16(y) => (y.ptr(), y.len()),
        Output::F32(y) => (y.ptr(), y.len()),
    };
    let mut checks = vec![("y [m, n]", y_len, d.m * d.n)];
    let (ops, p) = match (inputs, out) {
        (Inputs::Bf16 { x, w }, out) => {
            checks.extend([
                ("x [m, k]", x.len(), d.m * d.k),
                ("w [n, k]", w.len(), d.n * d.k),
            ]);
            let ops = match out {
                Output::Bf16(_) => Operands::Bf16,
                Output::F32(_) => Operands::Bf16ToF32,
            };
            (
                ops,
                Ptrs {
                    x: x.ptr(),
                    w: w.ptr(),
                    y,
                    sx: 0,
                    sw: 0,
                },
            )
        }
        (Inputs::Fp8 { x, sx, w, sw }, Output::Bf16(_)) => {
            checks.extend([
                ("x [m, k]", x.len(), d.m * d.k),
                ("sx [m]", sx.len(), d.m),
                ("w [n, k]", w.len(), d.n * d.k),
                ("sw [n]", sw.len(), d.n),
            ]);
            let p = Ptrs {
                x: x.ptr(),
                w: w.ptr(),
                y,
                sx: sx.ptr(),
                sw: sw.ptr(),
            };
            (Operands::Fp8, p)
        }
        (Inputs::Fp8 { .. }, Output::F32(_)) => {
            return Err(GpuError::Layout(
                "invariant GEMM: FP8 inputs write bf16 output only".into(),
            ));
        }
    };
    for (what, have, need) in checks {
        if have < need {
            return Err(GpuError::Layout(format!(
                "invariant GEMM operand {what} with m={}, n={}, k={} needs {need} elements, view holds {have}",
                d.m, d.n, d.k
            )));
        }
    }
    Ok((ops, p))
}

/// A heuristic result for cuBLASLt to fill in.
fn empty_result() -> sys::cublasLtMatmulHeuristicResult_t {
    sys::cublasLtMatmulHeuristicResult_t {
        algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        workspaceSize: 0,
        state: sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
        wavesCount: 0.0,
        reserved: [0; 4],
    }
}

/// Whether `algo` keeps K whole: one split, no reduction scheme.
fn keeps_k_whole(algo: &Algo) -> bool {
    use sys::cublasLtMatmulAlgoConfigAttributes_t as C;
    let get = |attr: C| -> Option<u32> {
        let mut v = 0u32;
        let mut written = 0usize;
        // SAFETY: `algo` is a valid algorithm value; the attribute is a
        // uint32 written into `v`.
        let st = unsafe {
            sys::cublasLtMatmulAlgoConfigGetAttribute(
                &algo.0,
                attr,
                &mut v as *mut u32 as *mut c_void,
                std::mem::size_of::<u32>(),
                &mut written,
            )
        };
        (st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
    };
    let splits = get(C::CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
    let scheme = get(C::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    matches!(splits, Some(0 | 1)) && scheme == Some(0)
}
