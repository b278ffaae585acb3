//! The backend's device errors: every failing device, kernel or library
//! call becomes `BackendError::Device("cuda: <operation>: <cause>")`, the
//! operation named by the caller.

use contract::backend::BackendError;
use kernels::KernelError;

pub(crate) fn dev_err(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Device(format!("cuda: {what}: {e}"))
}

/// A device error of operation `what`.
pub(super) fn ge(what: &'static str) -> impl Fn(gpu::GpuError) -> BackendError + Copy {
    move |e| dev_err(what, e)
}

/// A kernel error of operation `what`.
pub(super) fn ke(what: &'static str) -> impl Fn(KernelError) -> BackendError + Copy {
    move |e| dev_err(what, e)
}
