//! The instruction sets the kernels have paths for, and run-time detection.
//!
//! Contract: [`Isa::best`] is the fastest path this processor runs within
//! the process's [`IsaCap`], detected once. The cap is the caller's: the
//! binary sets it with [`set_cap`] before the first kernel runs (a cap above
//! what the processor has is ignored). Unset, it is the one named by
//! [`CAP_ENV`] when that is set (so a test process runs every kernel under
//! a lower path without code of its own; the CLI's `--cpu-isa` reads the
//! same variable), else [`IsaCap::Avx512Bf16`], no cap. [`split_products`]: whether prompt products run on AVX-512 BF16
//! and VNNI ([`crate::gemm_split`]), which every cap below
//! [`IsaCap::Avx512Bf16`] turns off. [`Isa::available`] lists every path the
//! machine can run, for tests. A kernel given an [`Isa`] the machine lacks
//! falls back to the portable path (never an illegal instruction).
//! Costs: one CPUID query per process.

use std::sync::OnceLock;

/// The most capable path the kernels of this process may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IsaCap {
    /// The portable code only.
    Portable,
    /// At most AVX2 + FMA.
    Avx2,
    /// At most AVX-512F, without the AVX-512 BF16 / VNNI prompt products.
    Avx512,
    /// Everything the processor has (the default).
    Avx512Bf16,
}

impl IsaCap {
    /// Every cap, least capable first.
    pub const ALL: [IsaCap; 4] = [
        IsaCap::Portable,
        IsaCap::Avx2,
        IsaCap::Avx512,
        IsaCap::Avx512Bf16,
    ];

    /// The name [`IsaCap::from_name`] reads: `portable`, `avx2`, `avx512`, `avx512bf16`.
    pub fn name(self) -> &'static str {
        match self {
            IsaCap::Portable => "portable",
            IsaCap::Avx2 => "avx2",
            IsaCap::Avx512 => "avx512",
            IsaCap::Avx512Bf16 => "avx512bf16",
        }
    }

    /// The cap named `name` (see [`IsaCap::name`]).
    pub fn from_name(name: &str) -> Result<IsaCap, IsaError> {
        IsaCap::ALL
            .into_iter()
            .find(|c| c.name() == name)
            .ok_or_else(|| IsaError::UnknownCap(name.to_string()))
    }

    /// The most capable [`Isa`] under this cap.
    fn isa(self) -> Isa {
        match self {
            IsaCap::Portable => Isa::Portable,
            IsaCap::Avx2 => Isa::Avx2,
            IsaCap::Avx512 | IsaCap::Avx512Bf16 => Isa::Avx512,
        }
    }
}

/// A cap that cannot be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    /// [`set_cap`] after the kernels fixed another cap (a kernel ran, or
    /// `set_cap` was called before with another value).
    #[error("CPU ISA cap `{wanted}` comes too late: the kernels already run under `{current}`")]
    AlreadyFixed {
        wanted: &'static str,
        current: &'static str,
    },
    /// A name that is no cap.
    #[error("unknown CPU ISA cap `{0}` (expected portable, avx2, avx512 or avx512bf16)")]
    UnknownCap(String),
}

static CAP: OnceLock<IsaCap> = OnceLock::new();

/// The environment variable naming the default cap (`portable`, `avx2`,
/// `avx512`, `avx512bf16`), read once when [`set_cap`] was not called.
pub const CAP_ENV: &str = "LAMINA_CPU_ISA";

/// The cap [`CAP_ENV`] names, or the full one. A name that is no cap
/// is reported on stderr and ignored (the CLI refuses it before this).
fn cap_from_env() -> IsaCap {
    match std::env::var(CAP_ENV) {
        Ok(name) => IsaCap::from_name(name.trim()).unwrap_or_else(|e| {
            eprintln!("warning: {CAP_ENV}: {e}; using every path the processor has");
            IsaCap::Avx512Bf16
        }),
        Err(_) => IsaCap::Avx512Bf16,
    }
}

/// Caps the paths every kernel of this process may take. Call it once,
/// before the first kernel runs; calling it again with the same cap is a
/// no-op, with another an [`IsaError::AlreadyFixed`].
pub fn set_cap(cap: IsaCap) -> Result<(), IsaError> {
    let current = *CAP.get_or_init(|| cap);
    if current == cap {
        Ok(())
    } else {
        Err(IsaError::AlreadyFixed {
            wanted: cap.name(),
            current: current.name(),
        })
    }
}

/// The cap in force (fixed at its first read: [`CAP_ENV`]'s, else
/// [`IsaCap::Avx512Bf16`], when [`set_cap`] was not called before).
pub fn cap() -> IsaCap {
    *CAP.get_or_init(cap_from_env)
}

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

    /// The best supported path under the [`cap`], detected once.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let cap = cap().isa();
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
/// AVX-512 BF16 and VNNI, [`Isa::best`] is AVX-512 and the [`cap`] is
/// [`IsaCap::Avx512Bf16`]. Detected once.
pub fn split_products() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        cap() == IsaCap::Avx512Bf16 && Isa::best() == Isa::Avx512 && crate::gemm_split::supported()
    })
}

/// For a test of one path: whether this processor runs it (`supported`).
/// When it does not, writes `SKIPPED <test>: needs <lacks>, ...`
/// straight to the process's stderr, past the test harness's output
/// capture, so that every test run names the tests it could not run.
pub fn test_runs_here(supported: bool, test: &str, lacks: &str) -> bool {
    if !supported {
        use std::io::Write as _;
        // A lost line only loses the report; the test returns either way.
        let _ = writeln!(
            std::io::stderr().lock(),
            "SKIPPED {test}: needs {lacks}, which this processor lacks or the {CAP_ENV} cap excludes"
        );
    }
    supported
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

    #[test]
    fn caps_round_trip_their_names_and_a_second_different_cap_is_refused() {
        for c in IsaCap::ALL {
            assert_eq!(IsaCap::from_name(c.name()), Ok(c));
        }
        assert!(matches!(IsaCap::from_name("sse9"), Err(IsaError::UnknownCap(n)) if n == "sse9"));
        let current = cap();
        assert_eq!(set_cap(current), Ok(()));
        let other = IsaCap::ALL
            .into_iter()
            .find(|&c| c != current)
            .unwrap_or(IsaCap::Portable);
        assert!(matches!(set_cap(other), Err(IsaError::AlreadyFixed { .. })));
        assert!(Isa::best() <= current.isa());
    }
}
