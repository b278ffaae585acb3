//! The device: context, stream, module loading, kernel launch, copies, timing.
//!
//! Contract: every method binds the context to the calling thread first (the
//! backend runs on the engine's thread, not the one that built it) and orders
//! its work on the one stream. Copies named `*_to_host` block until the data
//! is on the host; everything else is asynchronous.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{CudaContext, CudaStream, result, sys};

use crate::buffer::{DevSlice, DeviceBuffer, PinnedBuffer};
use crate::error::{GpuError, drv};
use crate::launch::{Function, LaunchConfig, Module};

/// Checks that the CUDA driver library can be opened and sees a device,
/// without panicking; the error says why not.
pub fn driver_available() -> Result<(), String> {
    // SAFETY: probing for the shared library only opens it.
    if !unsafe { sys::is_culib_present() } {
        return Err(
            "the CUDA driver library (libcuda.so) was not found; install the NVIDIA driver".into(),
        );
    }
    result::init().map_err(|e| format!("cuInit failed: {e}"))?;
    match result::device::get_count() {
        Ok(0) => Err("the CUDA driver reports no device".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("cuDeviceGetCount failed: {e}")),
    }
}

/// How many CUDA devices the driver sees (an error saying why when none can be used).
pub fn device_count() -> Result<usize, String> {
    driver_available()?;
    result::device::get_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| format!("cuDeviceGetCount failed: {e}"))
}

/// One CUDA device with its context and the stream all work is ordered on.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl Gpu {
    /// Opens device `ordinal`: its primary context and a fresh non-blocking stream.
    pub fn new(ordinal: usize) -> Result<Arc<Gpu>, GpuError> {
        driver_available().map_err(GpuError::NoDriver)?;
        let ctx = drv("cuDevicePrimaryCtxRetain", CudaContext::new(ordinal))?;
        // SAFETY: this crate never uses cudarc's tracked slices; all work is
        // ordered on one stream, so cudarc's per-buffer events are not needed.
        unsafe { ctx.disable_event_tracking() };
        let stream = drv("cuStreamCreate", ctx.new_stream())?;
        Ok(Arc::new(Gpu { ctx, stream }))
    }

    fn bind(&self) -> Result<(), GpuError> {
        drv("cuCtxSetCurrent", self.ctx.bind_to_thread())
    }

    /// The raw stream handle (for cuBLAS).
    pub(crate) fn cu_stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Device name and compute capability, e.g. `NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> Result<String, GpuError> {
        let name = drv("cuDeviceGetName", self.ctx.name())?;
        let (maj, min) = drv("cuDeviceGetAttribute", self.ctx.compute_capability())?;
        Ok(format!("{name} (sm_{maj}{min})"))
    }

    /// Number of streaming multiprocessors.
    pub fn sm_count(&self) -> Result<usize, GpuError> {
        Ok(self
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1))
    }

    /// The most dynamic shared memory one block may opt in to, in bytes.
    pub fn smem_per_block_optin(&self) -> Result<usize, GpuError> {
        self.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )
    }

    /// Shared memory of one streaming multiprocessor, in bytes.
    pub fn smem_per_sm(&self) -> Result<usize, GpuError> {
        self.attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        )
    }

    /// A count attribute of the device (negative read as 0).
    fn attribute(&self, a: sys::CUdevice_attribute) -> Result<usize, GpuError> {
        let n = drv("cuDeviceGetAttribute", self.ctx.attribute(a))?;
        Ok(n.max(0) as usize)
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), GpuError> {
        drv("cuMemGetInfo", self.ctx.mem_get_info())
    }

    /// Allocates `len` elements, zeroed in stream order (before any work
    /// enqueued after this call).
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<DeviceBuffer<T>, GpuError> {
        self.bind()?;
        let bytes = len.max(1) * std::mem::size_of::<T>();
        // SAFETY: a plain allocation in the bound context.
        let ptr = drv("cuMemAlloc", unsafe { result::malloc_sync(bytes) })?;
        let buf = DeviceBuffer {
            ptr,
            len,
            ctx: self.ctx.clone(),
            _t: PhantomData,
        };
        // On the one stream, so every later use of the buffer there comes
        // after the zeros: a memset on the legacy stream would be unordered
        // with this non-blocking stream and could land after a kernel's
        // writes (and cuMemsetD8 returns before it is done).
        // SAFETY: `ptr` holds `bytes` bytes just allocated.
        drv("cuMemsetD8Async", unsafe {
            result::memset_d8_async(ptr, 0, bytes, self.cu_stream())
        })?;
        Ok(buf)
    }

    /// Allocates a buffer holding a copy of `host` (blocking).
    pub fn upload<T: Pod>(&self, host: &[T]) -> Result<DeviceBuffer<T>, GpuError> {
        self.upload_parts(&[host])
    }

    /// Uploads `parts` one after another into one new device buffer: a
    /// matrix stacked from several (fused projections) without a host copy
    /// of the stack, each part copied from where it lies.
    pub fn upload_parts<T: Pod>(&self, parts: &[&[T]]) -> Result<DeviceBuffer<T>, GpuError> {
        let buf = self.alloc::<T>(parts.iter().map(|p| p.len()).sum())?;
        let mut at = 0;
        for p in parts {
            self.copy_to_device(p, buf.view().sub(at, p.len())?)?;
            at += p.len();
        }
        // ordered after the zero fill on the stream, and done on return
        self.synchronize()?;
        Ok(buf)
    }

    /// Allocates `len` elements of page-locked host memory.
    pub fn alloc_pinned<T: Pod>(&self, len: usize) -> Result<PinnedBuffer<T>, GpuError> {
        PinnedBuffer::new(&self.ctx, len)
    }

    /// Enqueues a copy of `src` into `dst` (lengths must match). With pageable
    /// `src` the driver stages it before returning; with pinned memory the
    /// caller keeps `src` untouched until the stream has passed this point.
    pub fn copy_to_device<T: Pod>(&self, src: &[T], dst: DevSlice<'_, T>) -> Result<(), GpuError> {
        copy_lengths("host-to-device copy", src.len(), dst.len(), true)?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is a live view of exactly `src.len()` elements of T.
        drv("cuMemcpyHtoDAsync", unsafe {
            result::memcpy_htod_async(dst.ptr(), src, self.cu_stream())
        })
    }

    /// Enqueues a copy of `src`, rows of `width` elements, into `dst` with
    /// its rows `pitch` elements apart: `dst[r * pitch + i] = src[r * width
    /// + i]` (the elements between rows untouched). Pageable `src` as in
    /// [`Gpu::copy_to_device`].
    pub fn copy_rows_to_device<T: Pod>(
        &self,
        src: &[T],
        width: usize,
        dst: DevSlice<'_, T>,
        pitch: usize,
    ) -> Result<(), GpuError> {
        if src.is_empty() {
            return Ok(());
        }
        let rows = src.len() / width.max(1);
        let need = (rows.max(1) - 1) * pitch + width;
        if width == 0 || rows * width != src.len() || pitch < width || dst.len() < need {
            return Err(GpuError::Buffer {
                what: "host-to-device row copy".into(),
                reason: format!(
                    "{} source elements in rows of {width} do not fit a destination of {} elements at a pitch of {pitch}",
                    src.len(),
                    dst.len()
                ),
            });
        }
        self.bind()?;
        let e = std::mem::size_of::<T>();
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: src.as_ptr() as *const c_void,
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: width * e,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst.ptr(),
            dstArray: std::ptr::null_mut(),
            dstPitch: pitch * e,
            WidthInBytes: width * e,
            Height: rows,
        };
        // SAFETY: `src` holds `rows` rows of `width` elements and `dst` the
        // last row's end at `(rows - 1) * pitch + width` (checked above).
        drv("cuMemcpy2DAsync", unsafe {
            sys::cuMemcpy2DAsync_v2(&copy, self.cu_stream()).result()
        })
    }

    /// Enqueues a copy of `src` into pinned `dst[..src.len()]`; valid on the
    /// host after [`Gpu::synchronize`].
    pub fn copy_to_pinned<T: Pod>(
        &self,
        src: DevSlice<'_, T>,
        dst: &mut PinnedBuffer<T>,
    ) -> Result<(), GpuError> {
        copy_lengths("device-to-pinned copy", src.len(), dst.len(), false)?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let n = src.len();
        // SAFETY: `dst` holds at least `n` elements and outlives the copy
        // because the caller synchronizes before reading or freeing it.
        drv("cuMemcpyDtoHAsync", unsafe {
            result::memcpy_dtoh_async(&mut dst.as_mut_slice()[..n], src.ptr(), self.cu_stream())
        })
    }

    /// Enqueues a device-to-device copy of `src` into `dst[..src.len()]`.
    pub fn copy_device<T: Pod>(
        &self,
        src: DevSlice<'_, T>,
        dst: DevSlice<'_, T>,
    ) -> Result<(), GpuError> {
        copy_lengths("device-to-device copy", src.len(), dst.len(), false)?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both are live views; `dst` holds at least `src.num_bytes()` bytes.
        drv("cuMemcpyDtoDAsync", unsafe {
            result::memcpy_dtod_async(dst.ptr(), src.ptr(), src.num_bytes(), self.cu_stream())
        })
    }

    /// A [`Fence`]: an event marking a point of this stream's work.
    pub fn fence(&self) -> Result<Fence, GpuError> {
        self.bind()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let event = drv("cuEventCreate", self.ctx.new_event(flags))?;
        Ok(Fence {
            event,
            stream: self.stream.clone(),
            recorded: false,
        })
    }

    /// Copies `src` to a new host vector, waiting for all earlier work.
    pub fn to_host<T: Pod>(&self, src: DevSlice<'_, T>) -> Result<Vec<T>, GpuError> {
        self.synchronize()?;
        let mut out = vec![T::zeroed(); src.len()];
        if !out.is_empty() {
            // SAFETY: `out` holds `src.len()` elements; the copy is synchronous.
            drv("cuMemcpyDtoH", unsafe {
                result::memcpy_dtoh_sync(&mut out, src.ptr())
            })?;
        }
        Ok(out)
    }

    /// Enqueues filling every byte of `dst` with `byte` (tests poison outputs with it).
    pub fn fill_bytes<T>(&self, dst: DevSlice<'_, T>, byte: u8) -> Result<(), GpuError> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: `dst` is a live view of `num_bytes` bytes.
        drv("cuMemsetD8Async", unsafe {
            result::memset_d8_async(dst.ptr(), byte, dst.num_bytes(), self.cu_stream())
        })
    }

    /// Blocks until all work on the stream is done; reports errors of earlier
    /// asynchronous work (e.g. a faulting kernel).
    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        drv("cuStreamSynchronize", self.stream.synchronize())
    }

    /// Loads a module from a fatbin / cubin / PTX image.
    pub fn load_module(&self, image: &[u8]) -> Result<Module, GpuError> {
        self.bind()?;
        let mut owned = image.to_vec();
        owned.push(0); // PTX images must be NUL-terminated; binaries ignore the tail.
        // SAFETY: `owned` is a complete module image that lives through the call.
        let module = drv("cuModuleLoadData", unsafe {
            result::module::load_data(owned.as_ptr() as *const c_void)
        })?;
        Ok(Module {
            module,
            ctx: self.ctx.clone(),
        })
    }

    /// Launches `f` with one by-value argument: a `#[repr(C)]` struct whose
    /// layout matches the kernel's parameter struct (the kernels crate asserts
    /// size and field offsets on both sides).
    ///
    /// # Safety
    /// `T` must have exactly the layout of the kernel's single parameter, and
    /// every device address in it must be valid for what the kernel does with
    /// it under `cfg` (valid, with room for everything the kernel reads and writes, until the stream has run it).
    pub unsafe fn launch_struct<T: Copy>(
        &self,
        f: &Function,
        cfg: LaunchConfig,
        args: &T,
    ) -> Result<(), GpuError> {
        self.bind()?;
        let mut ptrs = [args as *const T as *mut std::ffi::c_void];
        // SAFETY: delegated to the caller (see above); the one parameter
        // pointer points at `args`, which outlives the call, and
        // cuLaunchKernel copies the value.
        let r = unsafe {
            result::launch_kernel(
                f.func,
                cfg.grid,
                cfg.block,
                cfg.shared_bytes,
                self.cu_stream(),
                &mut ptrs,
            )
        };
        r.map_err(|source| GpuError::Launch {
            name: f.name.clone(),
            source,
        })
    }

    /// Whether kernels can be launched with programmatic dependent launch
    /// (compute capability 9.0 or newer).
    pub fn supports_pdl(&self) -> Result<bool, GpuError> {
        Ok(self.compute_capability()?.0 >= 9)
    }

    /// The device's compute capability, `(major, minor)`.
    pub fn compute_capability(&self) -> Result<(i32, i32), GpuError> {
        drv("cuDeviceGetAttribute", self.ctx.compute_capability())
    }

    /// [`Gpu::launch_struct`] with programmatic dependent launch: `f` may
    /// start while the previous kernel on the stream is still running, so it
    /// must execute `griddepcontrol.wait` (`cudaGridDependencySynchronize`)
    /// before reading anything that kernel writes, and before writing
    /// anything it reads. Use only where [`Gpu::supports_pdl`] is true.
    ///
    /// # Safety
    /// As [`Gpu::launch_struct`], plus the wait described above.
    pub unsafe fn launch_struct_pdl<T: Copy>(
        &self,
        f: &Function,
        cfg: LaunchConfig,
        args: &T,
    ) -> Result<(), GpuError> {
        // SAFETY: an all-zero attribute is a valid value of this plain C union/struct.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        // SAFETY: delegated to the caller (see above).
        unsafe { self.launch_with(f, cfg, args, attr) }
    }

    /// [`Gpu::launch_struct`] as a cooperative launch: every block of the
    /// grid is resident at once (the launch fails otherwise), which a
    /// kernel whose blocks wait for each other needs.
    ///
    /// # Safety
    /// As [`Gpu::launch_struct`].
    pub unsafe fn launch_struct_cooperative<T: Copy>(
        &self,
        f: &Function,
        cfg: LaunchConfig,
        args: &T,
    ) -> Result<(), GpuError> {
        // SAFETY: an all-zero attribute is a valid value of this plain C union/struct.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
        attr.value.cooperative = 1;
        // SAFETY: delegated to the caller (see above).
        unsafe { self.launch_with(f, cfg, args, attr) }
    }

    /// [`Gpu::launch_struct`] through `cuLaunchKernelEx` with one launch
    /// attribute.
    ///
    /// # Safety
    /// As [`Gpu::launch_struct`], plus what `attr` asks of the kernel.
    unsafe fn launch_with<T: Copy>(
        &self,
        f: &Function,
        cfg: LaunchConfig,
        args: &T,
        mut attr: sys::CUlaunchAttribute,
    ) -> Result<(), GpuError> {
        self.bind()?;
        let mut ptrs = [args as *const T as *mut std::ffi::c_void];
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid.0,
            gridDimY: cfg.grid.1,
            gridDimZ: cfg.grid.2,
            blockDimX: cfg.block.0,
            blockDimY: cfg.block.1,
            blockDimZ: cfg.block.2,
            sharedMemBytes: cfg.shared_bytes,
            hStream: self.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: delegated to the caller (see above); `config`, `attr` and
        // `ptrs` live through the call, which copies them and the argument.
        let r = unsafe {
            sys::cuLaunchKernelEx(&config, f.func, ptrs.as_mut_ptr(), std::ptr::null_mut())
        }
        .result();
        r.map_err(|source| GpuError::Launch {
            name: f.name.clone(),
            source,
        })
    }

    /// Starts capturing the stream's work into a graph (see [`crate::Graph`]).
    pub fn begin_capture(&self) -> Result<(), GpuError> {
        self.bind()?;
        drv(
            "cuStreamBeginCapture",
            self.stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )
    }

    /// A pair of timing events.
    pub fn timer(&self) -> Result<Timer, GpuError> {
        self.bind()?;
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = drv("cuEventCreate", self.ctx.new_event(flags))?;
        let end = drv("cuEventCreate", self.ctx.new_event(flags))?;
        Ok(Timer {
            start,
            end,
            stream: self.stream.clone(),
        })
    }

    /// The device-to-device copy rate in bytes a second, counted as read
    /// plus write (`2 * bytes` a copy), as torch's `y.copy_(x)` times it:
    /// two buffers of `bytes` allocated here, `warmups` untimed copies,
    /// then `reps` copies between two events on the stream. The buffers
    /// are freed on return.
    pub fn copy_bandwidth(
        &self,
        bytes: usize,
        warmups: usize,
        reps: usize,
    ) -> Result<f64, GpuError> {
        let src = self.alloc::<u8>(bytes)?;
        let dst = self.alloc::<u8>(bytes)?;
        for _ in 0..warmups {
            self.copy_device(src.view(), dst.view())?;
        }
        let timer = self.timer()?;
        timer.start()?;
        for _ in 0..reps {
            self.copy_device(src.view(), dst.view())?;
        }
        let ms = timer.stop_ms()?;
        Ok(2.0 * bytes as f64 * reps as f64 / (f64::from(ms) / 1e3).max(1e-9))
    }

    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// Two events around a region of stream work.
pub struct Timer {
    start: cudarc::driver::CudaEvent,
    end: cudarc::driver::CudaEvent,
    stream: Arc<CudaStream>,
}

impl Timer {
    /// Records the start event.
    pub fn start(&self) -> Result<(), GpuError> {
        drv("cuEventRecord", self.start.record(&self.stream))
    }

    /// Records the end event, waits for it and returns the milliseconds between.
    pub fn stop_ms(&self) -> Result<f32, GpuError> {
        drv("cuEventRecord", self.end.record(&self.stream))?;
        drv("cuEventSynchronize", self.end.synchronize())?;
        drv("cuEventElapsedTime", self.start.elapsed_ms(&self.end))
    }
}

/// A point in the stream's work the host can wait for without waiting for
/// what was enqueued after it (pipelined steps: the samples of step N while
/// step N + 1 runs).
pub struct Fence {
    event: cudarc::driver::CudaEvent,
    stream: Arc<CudaStream>,
    recorded: bool,
}

impl Fence {
    /// Marks the work enqueued so far.
    pub fn record(&mut self) -> Result<(), GpuError> {
        drv("cuEventRecord", self.event.record(&self.stream))?;
        self.recorded = true;
        Ok(())
    }

    /// Blocks until the marked work is done (at once if never recorded).
    pub fn wait(&self) -> Result<(), GpuError> {
        if !self.recorded {
            return Ok(());
        }
        drv("cuEventSynchronize", self.event.synchronize())
    }
}

/// Checks a copy's lengths: equal when `exact`, else the source fitting the
/// destination; the error names the copy and both lengths.
fn copy_lengths(what: &str, src: usize, dst: usize, exact: bool) -> Result<(), GpuError> {
    if src == dst || (!exact && src < dst) {
        return Ok(());
    }
    Err(GpuError::Buffer {
        what: what.into(),
        reason: format!("source has {src} elements, destination {dst}"),
    })
}
