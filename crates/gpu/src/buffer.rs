//! Device and pinned host buffers.
//!
//! Contract: a [`DeviceBuffer<T>`] owns `len` elements of device memory
//! (allocated zeroed, freed on drop); a [`DevSlice`] is a `Copy` view of a
//! range of one, borrowed from it, that kernels and copies take. Views carry
//! a raw device address: writing through one from a shared borrow is how
//! device memory works (the device, not Rust, owns the bytes), so callers
//! order their kernels on the one stream. A [`PinnedBuffer<T>`] is
//! page-locked host memory for asynchronous copies.
//! Costs: allocation and free are synchronous driver calls; views are free.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{CudaContext, result, sys};

use crate::error::{GpuError, drv};

/// Owned device memory holding `len` values of `T`.
pub struct DeviceBuffer<T: Pod> {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) len: usize,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) _t: PhantomData<T>,
}

// SAFETY: the buffer is a plain device address plus the context that owns it;
// the context is thread-safe and the address is valid on any thread bound to it.
unsafe impl<T: Pod> Send for DeviceBuffer<T> {}
// SAFETY: shared access only hands out addresses; see the module contract.
unsafe impl<T: Pod> Sync for DeviceBuffer<T> {}

impl<T: Pod> DeviceBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A view of the whole buffer.
    pub fn view(&self) -> DevSlice<'_, T> {
        DevSlice {
            ptr: self.ptr,
            len: self.len,
            _t: PhantomData,
        }
    }

    /// A view of `range`; errors when it runs past the end.
    pub fn slice(&self, range: Range<usize>) -> Result<DevSlice<'_, T>, GpuError> {
        self.view()
            .sub(range.start, range.end.saturating_sub(range.start))
    }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` was returned by cuMemAlloc in this context and is freed once.
            let r = unsafe { result::free_sync(self.ptr) };
            self.ctx.record_err(r);
        }
    }
}

/// A borrowed range of device memory of `T` values.
#[derive(Debug)]
pub struct DevSlice<'a, T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    _t: PhantomData<&'a T>,
}

impl<T> Clone for DevSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevSlice<'_, T> {}

impl<'a, T> DevSlice<'a, T> {
    /// The empty view at address 0 (for optional kernel operands).
    pub fn null() -> Self {
        DevSlice {
            ptr: 0,
            len: 0,
            _t: PhantomData,
        }
    }

    /// Device address of the first element.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the view holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The sub-view `[offset, offset + len)`; errors when it runs past the end.
    pub fn sub(&self, offset: usize, len: usize) -> Result<DevSlice<'a, T>, GpuError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DevSlice {
                ptr: self.ptr + (offset * std::mem::size_of::<T>()) as u64,
                len,
                _t: PhantomData,
            }),
            _ => Err(GpuError::Buffer {
                what: format!("view of {} elements", self.len),
                reason: format!("sub-range {offset}..{offset}+{len} runs past the end"),
            }),
        }
    }

    /// Reinterprets the view as `U` values; errors unless the byte length is a
    /// multiple of `U`'s size and the address is aligned for `U`.
    pub fn cast<U: Pod>(&self) -> Result<DevSlice<'a, U>, GpuError> {
        let (bytes, size) = (self.num_bytes(), std::mem::size_of::<U>());
        if size == 0
            || !bytes.is_multiple_of(size)
            || !self.ptr.is_multiple_of(std::mem::align_of::<U>() as u64)
        {
            return Err(GpuError::Buffer {
                what: format!("view of {bytes} bytes at {:#x}", self.ptr),
                reason: format!("cannot be read as {size}-byte values"),
            });
        }
        Ok(DevSlice {
            ptr: self.ptr,
            len: bytes / size,
            _t: PhantomData,
        })
    }

    /// Errors unless the view holds at least `need` elements; `what` names the operand.
    pub fn require(&self, what: &str, need: usize) -> Result<(), GpuError> {
        if self.len < need {
            return Err(GpuError::Buffer {
                what: what.to_string(),
                reason: format!("needs {need} elements, view holds {}", self.len),
            });
        }
        Ok(())
    }
}

/// Page-locked host memory holding `len` values of `T`, zeroed at allocation.
pub struct PinnedBuffer<T: Pod> {
    ptr: *mut T,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer exclusively owns its host allocation; moving it between
// threads moves that ownership.
unsafe impl<T: Pod> Send for PinnedBuffer<T> {}

impl<T: Pod> PinnedBuffer<T> {
    pub(crate) fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, GpuError> {
        drv("cuCtxSetCurrent", ctx.bind_to_thread())?;
        let bytes = (len.max(1)) * std::mem::size_of::<T>();
        // SAFETY: a plain page-locked allocation of `bytes` bytes in the bound context.
        let raw = drv("cuMemHostAlloc", unsafe { result::malloc_host(bytes, 0) })?;
        // SAFETY: `raw` points to `bytes` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(raw as *mut u8, 0, bytes) };
        Ok(PinnedBuffer {
            ptr: raw as *mut T,
            len,
            ctx: ctx.clone(),
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The contents.
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised (zeroed, Pod) values owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The contents, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed once.
            let r = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
            self.ctx.record_err(r);
        }
    }
}
