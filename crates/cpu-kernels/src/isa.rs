//! The instruction sets the kernels have paths for, and run-time detection.
//!
//! Contract: [`Isa::best`] is the fastest path this processor runs, detected
//! once; `LAMINA_CPU_ISA=portable|avx2|avx512` lowers it (a request above
//! what the processor has is ignored). [`split_products`]: whether prompt
//! products run on AVX-512 BF16 and VNNI ([`crate::gemm_split`]), which any
//! of those three values also turns off (`avx512bf16`, like no value, keeps
//! it where the processor has it). [`Isa::available`] lists every path
//! the machine can run, for tests. A kernel given an [`Isa`] the machine
//! lacks falls back to the portable path (never an illegal instruction).
//! Costs: one CPUID query per process.

use std::sync::OnceLock;

/// A kernel path, ordered from least to most capable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust, vectorised by LLVM for the compile target's baseline
    /// (SSE2 on x86-64, NEON on aarch64).
    Portable,
    /// x86-64 AVX2 with FMA (8 f32 lanes).
    Avx2,
    /// x86-64 AVX-512F (16 f32 lanes).
    Avx512,
}

impl Isa {
    /// Whether this processor can run the path.
    pub fn supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every path this processor runs, portable first.
    pub fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }

    /// The best supported path (capped by `LAMINA_CPU_ISA`), detected once.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = match std::env::var("LAMINA_CPU_ISA").as_deref() {
                Ok("portable") => Isa::Portable,
                Ok("avx2") => Isa::Avx2,
                _ => Isa::Avx512,
            };
            Isa::available()
                .into_iter()
                .filter(|&i| i <= cap)
                .max()
                .unwrap_or(Isa::Portable)
        })
    }

    /// `self` if the processor runs it, else the portable path.
    pub(crate) fn checked(self) -> Isa {
        if self.supported() {
            self
        } else {
            Isa::Portable
        }
    }

    /// Short name for logs and benchmark lines.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2+fma",
            Isa::Avx512 => "avx512f",
        }
    }
}

/// Whether prompt products may run [`crate::gemm_split`]: the processor has
/// AVX-512 BF16 and VNNI, [`Isa::best`] is AVX-512 and `LAMINA_CPU_ISA` is
/// unset or `avx512bf16`. Detected once.
pub fn split_products() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let capped = matches!(
            std::env::var("LAMINA_CPU_ISA").as_deref(),
            Ok("portable" | "avx2" | "avx512")
        );
        !capped && Isa::best() == Isa::Avx512 && crate::gemm_split::supported()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_is_available_and_portable_always_is() {
        let all = Isa::available();
        assert_eq!(all[0], Isa::Portable);
        assert!(all.contains(&Isa::best()));
        assert!(Isa::Avx512.checked().supported());
    }
}
