//! CUDA graph capture and replay of the stream's work.
//!
//! Contract: [`Graph::capture`] runs a closure with the stream in capture
//! mode and always ends the capture, also when the closure fails, so the
//! stream is usable afterwards. The closure must not allocate, synchronize or
//! copy to pageable host memory: those calls fail during capture, and the
//! error names them. A replay re-runs the recorded kernels with the same
//! device addresses, so everything they touch must outlive the graph.
//! Costs: capture + instantiate take milliseconds; a replay is one launch.

use std::sync::Arc;

use cudarc::driver::{CudaGraph, sys};

use crate::device::Gpu;
use crate::error::{GpuError, drv};

/// An instantiated, replayable graph.
pub struct Graph {
    exec: CudaGraph,
}

// SAFETY: the graph is only launched through `&mut self`-free calls on the
// owning backend's thread; the handle itself may move between threads.
unsafe impl Send for Graph {}

impl Graph {
    /// Captures the work `record` enqueues on `gpu`'s stream.
    pub fn capture<F>(gpu: &Arc<Gpu>, record: F) -> Result<Graph, GpuError>
    where
        F: FnOnce() -> Result<(), GpuError>,
    {
        gpu.begin_capture()?;
        let recorded = record();
        let ended = gpu.stream().end_capture(sys::CUgraphInstantiate_flags(0));
        recorded?;
        match drv("cuStreamEndCapture", ended)? {
            Some(exec) => Ok(Graph { exec }),
            None => Err(GpuError::Buffer {
                what: "graph capture".into(),
                reason: "the capture recorded no work".into(),
            }),
        }
    }

    /// Uploads the graph's resources so the first replay has no set-up cost.
    pub fn upload(&self) -> Result<(), GpuError> {
        drv("cuGraphUpload", self.exec.upload())
    }

    /// Replays the graph on the stream it was captured on (asynchronous).
    pub fn launch(&self, gpu: &Gpu) -> Result<(), GpuError> {
        drv("cuCtxSetCurrent", gpu.ctx().bind_to_thread())?;
        drv("cuGraphLaunch", self.exec.launch())
    }
}
