//! `cargo xtask install-nvcc`: installs CUDA's compiler from the pinned PyPI
//! wheels into the project-local `.cache/nvcc` (git-ignored), where
//! `crates/kernels/build.rs` finds it.
//!
//! Contract: runs `python3 -m pip install --target .cache/nvcc` with exactly
//! the versions in [`WHEELS`] (an unpinned `nvidia-nvvm` emits PTX that CUDA
//! 13.0 rejects), then checks that `nvidia/cu13/bin/nvcc --version` runs.
//! Idempotent: an existing working install is kept. Errors name the command.
//! Costs: ~270 MB download and disk the first time; seconds afterwards.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The pinned wheels (CUDA 13.0 toolchain).
pub const WHEELS: [&str; 5] = [
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
];

/// Where the wheels go, relative to the workspace root.
pub const TARGET_DIR: &str = ".cache/nvcc";

/// nvcc inside an install at `dir`.
pub fn nvcc_path(dir: &Path) -> PathBuf {
    dir.join("nvidia/cu13/bin/nvcc")
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn nvcc_works(nvcc: &Path) -> bool {
    Command::new(nvcc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Installs the wheels (unless a working nvcc is already there) and prints where nvcc is.
pub fn run() -> Result<()> {
    let dir = workspace_root().join(TARGET_DIR);
    let nvcc = nvcc_path(&dir);
    if nvcc_works(&nvcc) {
        println!("nvcc already installed: {}", nvcc.display());
        return Ok(());
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--no-deps", "--upgrade", "--target"])
        .arg(&dir)
        .args(WHEELS)
        .status()
        .context("running `python3 -m pip install` (is python3 with pip installed?)")?;
    if !status.success() {
        bail!(
            "`python3 -m pip install --target {} {}` failed: {status}",
            dir.display(),
            WHEELS.join(" ")
        );
    }
    if !nvcc_works(&nvcc) {
        bail!(
            "the wheels installed but {} --version does not run",
            nvcc.display()
        );
    }
    println!(
        "installed nvcc at {}; rebuild to compile the CUDA kernels",
        nvcc.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheels_are_pinned_and_nvcc_path_is_inside_the_target() {
        assert!(WHEELS.iter().all(|w| w.contains("==")));
        assert!(WHEELS.iter().any(|w| w.starts_with("nvidia-nvvm==13.0.")));
        let p = nvcc_path(Path::new("/x/.cache/nvcc"));
        assert_eq!(p, Path::new("/x/.cache/nvcc/nvidia/cu13/bin/nvcc"));
    }
}
