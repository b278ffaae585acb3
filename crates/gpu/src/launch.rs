//! Modules, kernel entry points and launch arguments.
//!
//! Contract: a [`Module`] stays loaded while it lives; a [`Function`] is a
//! handle into it (the kernels crate keeps both together). Costs: none beyond the
//! driver calls named.

use std::sync::Arc;

use cudarc::driver::{CudaContext, result, sys};

use crate::error::{GpuError, drv};

/// A loaded module (unloaded on drop).
pub struct Module {
    pub(crate) module: sys::CUmodule,
    pub(crate) ctx: Arc<CudaContext>,
}

// SAFETY: a module handle is usable from any thread bound to its context.
unsafe impl Send for Module {}
// SAFETY: lookups on a loaded module are thread-safe in the driver.
unsafe impl Sync for Module {}

impl Module {
    /// Looks up kernel `name` (an `extern "C"` symbol).
    pub fn function(&self, name: &str) -> Result<Function, GpuError> {
        drv("cuCtxSetCurrent", self.ctx.bind_to_thread())?;
        let cname = std::ffi::CString::new(name).map_err(|_| GpuError::Buffer {
            what: format!("kernel name {name:?}"),
            reason: "contains a NUL byte".into(),
        })?;
        // SAFETY: the module is loaded and `cname` is NUL-terminated.
        let func =
            unsafe { result::module::get_function(self.module, cname) }.map_err(|source| {
                GpuError::MissingKernel {
                    name: name.to_string(),
                    source,
                }
            })?;
        Ok(Function {
            func,
            name: name.to_string(),
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded once and its functions are not used after drop
            // (the kernels crate keeps the module alive as long as its functions).
            let r = unsafe { result::module::unload(self.module) };
            self.ctx.record_err(r);
        }
    }
}

/// A kernel entry point of a loaded [`Module`].
#[derive(Debug, Clone)]
pub struct Function {
    pub(crate) func: sys::CUfunction,
    pub(crate) name: String,
}

// SAFETY: a function handle is an immutable driver object usable from any thread.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Allows `bytes` of dynamic shared memory (needed above 48 KiB).
    pub fn set_max_dynamic_shared(&self, bytes: usize) -> Result<(), GpuError> {
        // SAFETY: a plain attribute set on a valid function handle.
        drv("cuFuncSetAttribute", unsafe {
            result::function::set_function_attribute(
                self.func,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes as i32,
            )
        })
    }
}

impl Function {
    /// How many blocks of `threads` threads with `smem` bytes of dynamic
    /// shared memory one multiprocessor holds at once.
    pub fn max_active_blocks_per_sm(&self, threads: u32, smem: u32) -> Result<usize, GpuError> {
        let mut n = 0i32;
        // SAFETY: a query on a valid function handle, writing one int.
        drv("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                self.func,
                threads as i32,
                smem as usize,
            )
            .result()
        })?;
        Ok(n.max(0) as usize)
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch of `blocks` x `threads`.
    pub fn linear(blocks: u32, threads: u32) -> Self {
        LaunchConfig {
            grid: (blocks.max(1), 1, 1),
            block: (threads, 1, 1),
            shared_bytes: 0,
        }
    }
}
