//! [`copy_bandwidth`]: how fast the memory a model would run from copies,
//! measured now (`lamina bench` divides a decode step's bytes by it for a
//! floor under the step's time).
//!
//! Costs: two buffers of [`GPU_COPY_BYTES`] on GPU 0 (CUDA) or of
//! [`HOST_COPY_BYTES`] in host memory, for the measurement's duration (a
//! second or less), freed on return. Measure before a model loads, so the
//! buffers never compete with its KV pool.

use rayon::prelude::*;

use crate::error::RuntimeError;
use crate::options::Device;
use crate::resolve::use_cuda;

/// Bytes of each of the two device buffers (torch's `y.copy_(x)` of 1 GiB).
const GPU_COPY_BYTES: usize = 1 << 30;
/// Timed device copies, after [`WARMUPS`].
const GPU_REPS: usize = 20;
/// Bytes of each of the two host buffers.
const HOST_COPY_BYTES: usize = 256 << 20;
/// Timed host copies, after [`WARMUPS`] (the median is kept).
const HOST_REPS: usize = 9;
/// Untimed copies first (the host's fault the destination's pages in).
const WARMUPS: usize = 3;

/// The copy bandwidth of the memory `device` resolves to (GPU 0, where a
/// one-replica runtime runs, or the host) in bytes a second, counted as
/// read plus write (`2 * bytes / time`). CUDA: two [`GPU_COPY_BYTES`]
/// buffers, [`WARMUPS`] device-to-device copies, then [`GPU_REPS`] between
/// two events on the stream (`model::cuda::copy_bandwidth`). The CPU: two
/// [`HOST_COPY_BYTES`] buffers copied by every thread of the rayon pool
/// the CPU backend runs on (a slice each, `copy_from_slice`), the median
/// of [`HOST_REPS`] copies after [`WARMUPS`].
pub fn copy_bandwidth(device: Device) -> Result<f64, RuntimeError> {
    match use_cuda(device)? {
        true => model::cuda::copy_bandwidth(0, GPU_COPY_BYTES, WARMUPS, GPU_REPS)
            .map_err(|e| RuntimeError::Device(format!("measuring GPU 0's copy bandwidth: {e}"))),
        false => host_copy_bandwidth(HOST_COPY_BYTES, WARMUPS, HOST_REPS),
    }
}

/// Host memory's copy rate over `bytes` buffers (see [`copy_bandwidth`]).
fn host_copy_bandwidth(bytes: usize, warmups: usize, reps: usize) -> Result<f64, RuntimeError> {
    let buffer = |fill: u8| -> Result<Vec<u8>, RuntimeError> {
        let mut v = Vec::new();
        v.try_reserve_exact(bytes).map_err(|e| {
            RuntimeError::Invalid(format!(
                "measuring the host's copy bandwidth: allocating {bytes} bytes: {e}"
            ))
        })?;
        // written, so the source's pages are real memory, not the zero page
        v.resize(bytes, fill);
        Ok(v)
    };
    let (src, mut dst) = (buffer(1)?, buffer(0)?);
    let chunk = bytes.div_ceil(rayon::current_num_threads()).max(1);
    let mut secs = Vec::with_capacity(reps);
    for i in 0..warmups + reps {
        let start = std::time::Instant::now();
        (dst.par_chunks_mut(chunk))
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        if i >= warmups {
            secs.push(start.elapsed().as_secs_f64());
        }
    }
    std::hint::black_box(&dst);
    secs.sort_by(f64::total_cmp);
    let median = secs.get(secs.len() / 2).copied().unwrap_or(f64::INFINITY);
    Ok(2.0 * bytes as f64 / median.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_copy_moves_a_positive_finite_rate() {
        let rate = host_copy_bandwidth(1 << 20, 1, 3).unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{rate}");
    }
}
