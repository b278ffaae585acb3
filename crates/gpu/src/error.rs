//! The one error type of the gpu crate: every variant names the call or the
//! object at fault.

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;

/// Errors from the driver, cuBLAS or a rejected request.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The CUDA driver library could not be opened or initialised.
    #[error("no CUDA driver found: {0}")]
    NoDriver(String),
    /// A CUDA driver call returned an error status.
    #[error("CUDA driver call `{call}` failed: {source}")]
    Driver {
        call: &'static str,
        source: DriverError,
    },
    /// A cuBLAS call returned an error status.
    #[error("cuBLAS call `{call}` failed: {source}")]
    Blas {
        call: &'static str,
        source: CublasError,
    },
    /// A cuBLASLt call returned an error status.
    #[error("cuBLASLt call `{call}` failed: {source}")]
    BlasLt {
        call: &'static str,
        source: cudarc::cublaslt::result::CublasError,
    },
    /// A GEMM whose operands cannot be expressed as the row-major product asked for.
    #[error("GEMM layout rejected: {0}")]
    Layout(String),
    /// A buffer too small or a copy of mismatched length.
    #[error("buffer `{what}`: {reason}")]
    Buffer { what: String, reason: String },
    /// A kernel the module does not contain.
    #[error("kernel `{name}` not found in the module: {source}")]
    MissingKernel { name: String, source: DriverError },
    /// A kernel launch rejected by the driver.
    #[error("launch of kernel `{name}` failed: {source}")]
    Launch { name: String, source: DriverError },
}

/// Shorthand to wrap a driver result with the call's name.
pub(crate) fn drv<T>(call: &'static str, r: Result<T, DriverError>) -> Result<T, GpuError> {
    r.map_err(|source| GpuError::Driver { call, source })
}
