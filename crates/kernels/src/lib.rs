//! kernels: the CUDA kernels of the forward pass, their typed Rust
//! launchers and a CPU reference for each. The attention kernels take a
//! layer's [`ScoreRule`] (scale and sliding window; no soft-cap).
//!
//! Contract: `build.rs` compiles every `src/cu/*.cu` (one kernel family per
//! file) into one fatbin embedded in the binary; [`Kernels::load`] loads it
//! once and resolves every entry point, or says exactly why CUDA kernels are
//! unavailable ([`unavailable_reason`]). Each launcher sits in the Rust file
//! named after its `.cu` file, checks every view's length against the shape
//! it is given before launching, and reports launch failures as
//! [`KernelError`]. Launchers whose kernels index memory through device-side
//! tables (token ids, slots, block tables) are `unsafe fn`: the caller
//! guarantees those indices are in range (the backend validates each batch
//! on the host). The CPU references the GPU tests compare against are the
//! `ops` crate's operations (the CPU backend's own code).
//!
//! Kernels that cannot drift: every kernel takes one `#[repr(C)]` argument
//! struct by value ([`abi`], with `SampleParams`, the sampling kernels'
//! per-row record), whose C++ twin, with size and offset asserts on both
//! sides, `build.rs` generates from the same description; every launch
//! constant, the head-dim list and the GEMV chunk rule live in [`consts`] and
//! reach the `.cu` files through a generated header. No `.cu` file declares
//! such a struct or constant itself (`build.rs` refuses one that does), so a
//! rename on either side fails the build.
//! Costs: loading the module takes milliseconds; launches are asynchronous.

/// The kernels' argument structs: one `#[repr(C)]` struct per kernel, size
/// and every field offset const-asserted here and `static_assert`ed in the
/// C++ structs `build.rs` generates from the same description.
pub mod abi;
/// Launch constants shared with the CUDA side (`OUT_DIR/lamina_consts.cuh`):
/// the one place for the head-dim list, block sizes and tile sizes.
pub mod consts;

pub mod activation;
pub mod decode_attention;
pub mod embedding;
pub mod flash_prefill;
pub mod fp8;
pub mod gemv;
pub mod gguf;
pub mod invariant_gemm;
pub mod kv;
pub mod layer_extras;
pub mod lora;
pub mod persistent;
pub mod prefill_attention;
pub mod qgemm;
pub mod rmsnorm;
pub mod rope_kv;
pub mod sampling;
pub mod weight_format;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use gpu::{Function, Gpu, GpuError, Module};
use ops::attention::ScoreRule;

pub use consts::HEAD_DIMS;
pub use decode_attention::DecodePlan;
pub use kv::KvCaches;
pub use sampling::SampleParams;

/// Errors loading or launching kernels.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The binary carries no kernels (no nvcc at build time).
    #[error("{0}")]
    Unavailable(String),
    /// A driver / cuBLAS / buffer error.
    #[error(transparent)]
    Gpu(#[from] GpuError),
    /// Operands inconsistent with the shape a launcher was given.
    #[error("kernel `{kernel}`: {reason}")]
    Shape {
        kernel: &'static str,
        reason: String,
    },
    /// A shape the kernels were not built for.
    #[error("kernel `{kernel}` does not support {reason}")]
    Unsupported {
        kernel: &'static str,
        reason: String,
    },
}

#[cfg(kernels_built)]
static FATBIN: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kernels.fatbin"));

/// The embedded fatbin, or why there is none.
pub fn fatbin() -> Result<&'static [u8], KernelError> {
    #[cfg(kernels_built)]
    {
        Ok(FATBIN)
    }
    #[cfg(not(kernels_built))]
    {
        Err(KernelError::Unavailable(
            env!("KERNELS_UNAVAILABLE").to_string(),
        ))
    }
}

/// `None` when this binary carries CUDA kernels, else the reason and the fix.
pub fn unavailable_reason() -> Option<String> {
    fatbin().err().map(|e| e.to_string())
}

/// Query / KV head counts and head size of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl HeadShape {
    /// Width of one fused `[q | k | v]` row: `(heads + 2 kv_heads) * head_dim`.
    pub fn qkv_width(&self) -> usize {
        (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
    }
    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.num_heads / self.num_kv_heads.max(1)
    }
    /// Elements of one cache slot: `kv_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    fn check(&self, kernel: &'static str) -> Result<(), KernelError> {
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(KernelError::Shape {
                kernel,
                reason: format!(
                    "{} heads not divisible by {} KV heads",
                    self.num_heads, self.num_kv_heads
                ),
            });
        }
        Ok(())
    }
}

/// Choices the caller makes for the kernels of one [`Kernels`]; the default
/// takes every fast path the device has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelOptions {
    /// Prefill on the warpgroup-MMA (`wgmma`) flash kernels where the device
    /// is compute capability 9.0; off: the mma.sync tiling everywhere.
    pub wgmma: bool,
    /// Launch the kernels that wait on `griddepcontrol` with programmatic
    /// dependent launch where the device supports it (sm_90+).
    pub pdl: bool,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            wgmma: true,
            pdl: true,
        }
    }
}

/// Every entry point of the loaded kernel module.
pub struct Kernels {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) embedding_gather: Function,
    pub(crate) gather_rows_bf16: Function,
    pub(crate) add_rmsnorm: Function,
    pub(crate) rope_kv_write: Function,
    pub(crate) silu_mul: Function,
    pub(crate) gelu_tanh_mul: Function,
    pub(crate) bias_rows: Function,
    pub(crate) head_rmsnorm: Function,
    pub(crate) softcap_rows: Function,
    pub(crate) lora_shrink: Function,
    pub(crate) lora_expand: Function,
    pub(crate) lora_select: Function,
    pub(crate) fp8_dequant_rows: Function,
    pub(crate) fp8_quant_rows: Function,
    pub(crate) invariant_gemm_bf16: Function,
    pub(crate) invariant_gemm_f32: Function,
    pub(crate) invariant_gemm_tiled_bf16: Function,
    pub(crate) invariant_gemm_tiled_f32: Function,
    /// `prefill_attention_d{D}` for each `D` of [`HEAD_DIMS`], in order.
    pub(crate) prefill: [Function; HEAD_DIMS.len()],
    /// The same over FP8 caches (`prefill_attention_fp8_d{D}`).
    pub(crate) prefill8: [Function; HEAD_DIMS.len()],
    /// `[head dim index][group cap index]`: `decode_attention_d{D}_g{G}` for
    /// each `D` of [`HEAD_DIMS`] and `G` of `decode_attention::GROUP_CAPS`.
    pub(crate) decode: [[Function; decode_attention::GROUP_CAPS.len()]; HEAD_DIMS.len()],
    /// The same over FP8 caches (`decode_attention_fp8_d{D}_g{G}`).
    pub(crate) decode8: [[Function; decode_attention::GROUP_CAPS.len()]; HEAD_DIMS.len()],
    /// `flash_{prefill,narrow,hopper,narrow_small,narrow_tiny}_d{64,128,256}`
    /// and their shared memory, where built and where they fit the device
    /// (`flash_prefill::FlashEntries`).
    pub(crate) flash_prefill: flash_prefill::FlashEntries,
    /// The same entries over FP8 caches (`flash_*_fp8_d*`).
    pub(crate) flash_prefill8: flash_prefill::FlashEntries,
    /// Streaming multiprocessors and the shared memory of one (sizes the
    /// narrow flash tiling's waves).
    pub(crate) sms: usize,
    pub(crate) smem_per_sm: usize,
    /// The device runs `flash_hopper_*` (compute capability 9.0, whose code
    /// in the fatbin is the sm_90a build) and [`KernelOptions::wgmma`] is set.
    pub(crate) flash_hopper: bool,
    /// `[weight format][variant][row tile]` (see `gemv::WeightFormat` and
    /// `gemv::VARIANTS`), one entry per `WeightFormat::ALL`.
    pub(crate) gemv: Vec<[[Function; 5]; 6]>,
    /// `gguf_dequant_*`, one per block format of `WeightFormat::ALL` (the
    /// others `None`).
    pub(crate) gguf_dequant: Vec<Option<Function>>,
    /// `qgemm_*`, one per block format of `WeightFormat::ALL` (the others
    /// `None`).
    pub(crate) qgemm: Vec<Option<Function>>,
    pub(crate) sample_partials: Function,
    pub(crate) sample_rows: Function,
    /// `persistent_*`, one per weight format and head size of `persistent`.
    pub(crate) persistent: Vec<persistent::Entry>,
    /// What each kernel the persistent kernel runs is to it, by name.
    pub(crate) persist_kinds: HashMap<String, persistent::OpKind>,
    /// The active recording (`persistent`): launches go here, not to the GPU.
    pub(crate) recording: Mutex<Option<persistent::Recorded>>,
    /// Launch the kernels that wait on `griddepcontrol` (`cu/pdl.cuh`) with
    /// programmatic dependent launch: sm_90+ with [`KernelOptions::pdl`] (the
    /// GEMVs' weight loads then overlap the previous kernel's tail).
    pub(crate) pdl: bool,
    _module: Module,
}

impl Kernels {
    /// Loads the embedded fatbin on `gpu` and resolves every kernel.
    pub fn load(gpu: &Arc<Gpu>, options: KernelOptions) -> Result<Kernels, KernelError> {
        let module = gpu.load_module(fatbin()?)?;
        let f = |name: &str| module.function(name);
        let tiles = |i: usize, fmt: gemv::WeightFormat| -> Result<[Function; 5], GpuError> {
            let t = |m: usize| -> Result<Function, GpuError> {
                let func = f(&gemv::entry(i, fmt, m))?;
                if gemv::NORM_VARIANTS.contains(&i) {
                    func.set_max_dynamic_shared(gemv::MAX_NORM_SMEM)?;
                }
                Ok(func)
            };
            Ok([t(1)?, t(2)?, t(4)?, t(8)?, t(16)?])
        };
        let table = |fmt: gemv::WeightFormat| -> Result<[[Function; 5]; 6], GpuError> {
            let t = |i| tiles(i, fmt);
            Ok([t(0)?, t(1)?, t(2)?, t(3)?, t(4)?, t(5)?])
        };
        let gemv = (gemv::WeightFormat::ALL.iter())
            .map(|&fmt| table(fmt))
            .collect::<Result<Vec<_>, _>>()?;
        let gguf_dequant = (gemv::WeightFormat::ALL.iter())
            .map(|&fmt| gguf::entry(fmt).map(|name| f(&name)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let qgemm = (gemv::WeightFormat::ALL.iter())
            .map(|&fmt| {
                let name = qgemm::entry(fmt)?;
                Some(f(&name).and_then(|func| {
                    func.set_max_dynamic_shared(qgemm::SMEM_BYTES)?;
                    Ok(func)
                }))
            })
            .map(Option::transpose)
            .collect::<Result<Vec<_>, _>>()?;
        let max_smem = gpu.smem_per_block_optin()?;
        let flash = flash_prefill::load_functions(&module, false, max_smem)?;
        let flash8 = flash_prefill::load_functions(&module, true, max_smem)?;
        Ok(Kernels {
            gpu: gpu.clone(),
            embedding_gather: f("embedding_gather")?,
            gather_rows_bf16: f("gather_rows_bf16")?,
            add_rmsnorm: f("add_rmsnorm")?,
            rope_kv_write: f("rope_kv_write")?,
            silu_mul: f("silu_mul")?,
            gelu_tanh_mul: f("gelu_tanh_mul")?,
            bias_rows: f("bias_rows")?,
            head_rmsnorm: f("head_rmsnorm")?,
            softcap_rows: f("softcap_rows")?,
            lora_shrink: f("lora_shrink")?,
            lora_expand: f("lora_expand")?,
            lora_select: f("lora_select")?,
            fp8_dequant_rows: f("fp8_dequant_rows")?,
            fp8_quant_rows: f("fp8_quant_rows")?,
            invariant_gemm_bf16: f("invariant_gemm_bf16")?,
            invariant_gemm_f32: f("invariant_gemm_f32")?,
            invariant_gemm_tiled_bf16: f("invariant_gemm_tiled_bf16")?,
            invariant_gemm_tiled_f32: f("invariant_gemm_tiled_f32")?,
            prefill: per_head_dim(&module, "prefill_attention_d")?,
            prefill8: per_head_dim(&module, "prefill_attention_fp8_d")?,
            decode: decode_kernels(&module, "decode_attention")?,
            decode8: decode_kernels(&module, "decode_attention_fp8")?,
            flash_prefill: flash,
            flash_prefill8: flash8,
            sms: gpu.sm_count()?,
            smem_per_sm: gpu.smem_per_sm()?,
            flash_hopper: options.wgmma && gpu.compute_capability()? == (9, 0),
            gemv,
            gguf_dequant,
            qgemm,
            sample_partials: f("sample_partials")?,
            sample_rows: f("sample_rows")?,
            persistent: persistent_entries(&module)?,
            persist_kinds: persistent::op_kinds().into_iter().collect(),
            recording: Mutex::new(None),
            pdl: options.pdl && gpu.supports_pdl()?,
            _module: module,
        })
    }

    /// Launches a kernel that calls `pdl_wait()` before touching data of
    /// earlier kernels: with programmatic dependent launch when enabled.
    ///
    /// # Safety
    /// As [`Gpu::launch_struct`]; the kernel waits as `cu/pdl.cuh` says.
    pub(crate) unsafe fn launch_pdl<T: Copy + abi::ArgWords + 'static>(
        &self,
        f: &Function,
        cfg: gpu::LaunchConfig,
        args: &T,
    ) -> Result<(), GpuError> {
        if !self.pdl {
            // SAFETY: delegated to the caller.
            return unsafe { self.launch(f, cfg, args) };
        }
        if self.record(f, &cfg, args) {
            return Ok(());
        }
        // SAFETY: delegated to the caller.
        unsafe { self.gpu.launch_struct_pdl(f, cfg, args) }
    }

    /// Launches a kernel that does not wait on `griddepcontrol` (plain
    /// stream order), or records it (`persistent`).
    ///
    /// # Safety
    /// As [`Gpu::launch_struct`].
    pub(crate) unsafe fn launch<T: Copy + abi::ArgWords + 'static>(
        &self,
        f: &Function,
        cfg: gpu::LaunchConfig,
        args: &T,
    ) -> Result<(), GpuError> {
        if self.record(f, &cfg, args) {
            return Ok(());
        }
        // SAFETY: delegated to the caller.
        unsafe { self.gpu.launch_struct(f, cfg, args) }
    }

    /// The device the kernels run on.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }
}

/// Resolves `{prefix}{D}` for every `D` of [`HEAD_DIMS`], in order.
fn per_head_dim(module: &Module, prefix: &str) -> Result<[Function; HEAD_DIMS.len()], KernelError> {
    let mut fs = Vec::with_capacity(HEAD_DIMS.len());
    for d in HEAD_DIMS {
        fs.push(module.function(&format!("{prefix}{d}"))?);
    }
    // The loop pushed exactly HEAD_DIMS.len() functions.
    fs.try_into()
        .map_err(|_| KernelError::Unavailable(format!("{prefix}*: wrong count")))
}

/// The persistent kernel's entry points (`persistent::entry`), with room
/// for the GEMV norm inputs.
fn persistent_entries(module: &Module) -> Result<Vec<persistent::Entry>, KernelError> {
    let mut v = Vec::new();
    for format in persistent::FORMATS {
        for d in persistent::HEAD_DIMS {
            let func = module.function(&persistent::entry(format, d, persistent::GROUP_CAP))?;
            func.set_max_dynamic_shared(gemv::MAX_NORM_SMEM)?;
            v.push(persistent::Entry { format, d, func });
        }
    }
    Ok(v)
}

/// `{prefix}_d{D}_g{G}` for each head dim and group cap, in order.
fn decode_kernels(
    module: &Module,
    prefix: &str,
) -> Result<[[Function; decode_attention::GROUP_CAPS.len()]; HEAD_DIMS.len()], KernelError> {
    let mut rows = Vec::with_capacity(HEAD_DIMS.len());
    for d in HEAD_DIMS {
        let mut row = Vec::with_capacity(decode_attention::GROUP_CAPS.len());
        for g in decode_attention::GROUP_CAPS {
            row.push(module.function(&format!("{prefix}_d{d}_g{g}"))?);
        }
        let row: [Function; decode_attention::GROUP_CAPS.len()] = row
            .try_into()
            .map_err(|_| KernelError::Unavailable("decode_attention_*: wrong count".into()))?;
        rows.push(row);
    }
    rows.try_into()
        .map_err(|_| KernelError::Unavailable("decode_attention_*: wrong count".into()))
}

/// Index of `head_dim` in [`HEAD_DIMS`], or the error naming the kernel.
pub(crate) fn head_dim_index(kernel: &'static str, head_dim: usize) -> Result<usize, KernelError> {
    HEAD_DIMS
        .iter()
        .position(|&d| d == head_dim)
        .ok_or(KernelError::Unsupported {
            kernel,
            reason: format!("head_dim {head_dim} (built for {HEAD_DIMS:?})"),
        })
}

/// A layer's score rule as the attention kernels take it: the score scale
/// and the sliding window (0: none; the kernels' `window_first` is
/// [`ScoreRule::first`]). The kernels run no soft-cap, and their online
/// softmax takes the maximum over raw scores, so a rule with a soft-cap or a
/// scale that is not positive and finite is refused, naming it.
pub(crate) fn rule_args(kernel: &'static str, rule: &ScoreRule) -> Result<(f32, u32), KernelError> {
    if let Some(cap) = rule.softcap {
        return Err(KernelError::Unsupported {
            kernel,
            reason: format!("an attention soft-cap ({cap})"),
        });
    }
    if !(rule.scale.is_finite() && rule.scale > 0.0) {
        return Err(KernelError::Unsupported {
            kernel,
            reason: format!("an attention scale of {} (must be positive)", rule.scale),
        });
    }
    let window = match rule.window {
        None => 0,
        Some(0) => {
            return Err(KernelError::Unsupported {
                kernel,
                reason: "a sliding window of 0 keys".into(),
            });
        }
        Some(w) => u32_of(kernel, "window", w)?,
    };
    Ok((rule.scale, window))
}

/// Checks `view` holds at least `need` elements; the error names kernel and operand.
pub(crate) fn need<T>(
    kernel: &'static str,
    what: &str,
    view: &gpu::DevSlice<'_, T>,
    need: usize,
) -> Result<(), KernelError> {
    if view.len() < need {
        return Err(KernelError::Shape {
            kernel,
            reason: format!(
                "operand `{what}` needs {need} elements, view holds {}",
                view.len()
            ),
        });
    }
    Ok(())
}

/// Converts a size to the kernels' 32-bit parameters; the error names it.
pub(crate) fn u32_of(kernel: &'static str, what: &str, v: usize) -> Result<u32, KernelError> {
    u32::try_from(v).map_err(|_| KernelError::Shape {
        kernel,
        reason: format!("`{what}` = {v} exceeds 32 bits"),
    })
}

/// Round-trips an f32 through bf16 (what the GPU stores).
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn availability_is_consistent_with_the_build() {
        match fatbin() {
            Ok(bytes) => assert!(bytes.len() > 1000, "fatbin of {} bytes", bytes.len()),
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("built without CUDA kernels"), "{msg}");
                assert!(unavailable_reason().is_some());
            }
        }
    }

    #[test]
    fn score_rules_reach_the_kernels_or_are_refused_by_name() {
        let causal = ScoreRule::causal(256);
        assert_eq!(rule_args("k", &causal).unwrap(), (1.0 / 16.0, 0));
        let windowed = ScoreRule {
            window: Some(512),
            ..causal
        };
        assert_eq!(rule_args("k", &windowed).unwrap(), (1.0 / 16.0, 512));
        let bad = [
            (
                ScoreRule {
                    softcap: Some(50.0),
                    ..causal
                },
                "soft-cap (50)",
            ),
            (
                ScoreRule {
                    window: Some(0),
                    ..causal
                },
                "window of 0",
            ),
            (
                ScoreRule {
                    scale: 0.0,
                    ..causal
                },
                "scale of 0",
            ),
            (
                ScoreRule {
                    scale: f32::NAN,
                    ..causal
                },
                "scale of NaN",
            ),
        ];
        for (rule, what) in bad {
            let e = rule_args("k", &rule).unwrap_err().to_string();
            assert!(e.contains(what) && e.contains("`k`"), "{e}");
        }
    }

    #[test]
    fn the_kernels_e4m3_maximum_is_the_codecs() {
        assert_eq!(consts::FP8_E4M3_MAX as f32, ops::fp8::E4M3_MAX);
    }
}
