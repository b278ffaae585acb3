//! A model's part of one GPU shared by the models of one `lamina serve`,
//! when the KV pools are sized from `--gpu-memory-utilization`.
//!
//! The runtime sizes a pool from the device's memory in use when the
//! model opens: `utilization` of the total, less what is in use, less the
//! model's weights and workspace. With several models, what is in use
//! includes the models loaded before, so a fixed utilization per model
//! would leave the later ones nothing. Instead the server's budget is
//! fixed once, before any model loads (`utilization` x total, less what
//! other processes held then), and at each load (a reload included) the
//! model's utilization is worked out from what is in use at that moment,
//! so that it gets `share` of that budget whatever the others hold.

/// What a model's loads need to get their share of the GPU budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuShare {
    /// The CUDA device (the first of the model's replicas).
    pub device: usize,
    /// The model's part of the budget, in (0, 1].
    pub share: f64,
    /// The server's `--gpu-memory-utilization`.
    pub utilization: f64,
    /// Bytes in use on the device before the server loaded any model.
    pub in_use_at_start: usize,
}

impl GpuShare {
    /// The share of `share` on `device`, reading what is in use there
    /// now (before any model of the server loads); `None` when the
    /// device cannot be read (the runtime then reports it).
    pub fn at_start(device: usize, share: f64, utilization: f64) -> Option<GpuShare> {
        let (free, total) = model::cuda::memory_info(device).ok()?;
        Some(GpuShare {
            device,
            share,
            utilization,
            in_use_at_start: total.saturating_sub(free),
        })
    }

    /// The utilization to open the model with now, or `None` when the
    /// device cannot be read.
    pub fn utilization_now(&self) -> Option<f64> {
        let (free, total) = model::cuda::memory_info(self.device).ok()?;
        Some(self.utilization_for(total, total.saturating_sub(free)))
    }

    /// The utilization that leaves the model `share` of the server's
    /// budget on a device of `total` bytes with `in_use_now` bytes in use:
    /// (in use now + share x budget) / total, in (0, 1].
    pub fn utilization_for(&self, total: usize, in_use_now: usize) -> f64 {
        let total = total.max(1) as f64;
        let budget = (self.utilization * total - self.in_use_at_start as f64).max(0.0);
        ((in_use_now as f64 + self.share * budget) / total).clamp(f64::MIN_POSITIVE, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::GpuShare;

    const G: usize = 1 << 30;

    #[test]
    fn each_model_gets_its_share_whatever_the_others_hold() {
        // an 80 GiB device, 1 GiB held by others at start, 0.9 of it the
        // server's: a budget of 71 GiB, half of it each
        let s = GpuShare {
            device: 0,
            share: 0.5,
            utilization: 0.9,
            in_use_at_start: G,
        };
        let total = 80 * G;
        let budget = 0.9 * total as f64 - G as f64;
        for in_use_now in [G, 36 * G, 40 * G] {
            let u = s.utilization_for(total, in_use_now);
            // the runtime's allowance: u x total, less what is in use now
            let allowed = u * total as f64 - in_use_now as f64;
            assert!(
                (allowed - 0.5 * budget).abs() < 1.0,
                "{in_use_now}: {allowed}"
            );
        }
    }

    #[test]
    fn the_utilization_stays_in_range() {
        let s = GpuShare {
            device: 0,
            share: 1.0,
            utilization: 1.0,
            in_use_at_start: 0,
        };
        assert_eq!(s.utilization_for(80 * G, 80 * G), 1.0);
        let none = GpuShare {
            utilization: 0.01,
            in_use_at_start: 10 * G,
            ..s
        };
        assert!(none.utilization_for(80 * G, 0) > 0.0);
    }
}
