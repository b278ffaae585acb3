//! Compiles every `src/cu/*.cu` with nvcc into one fatbin (sm_90 and sm_80
//! machine code plus compute_80 PTX) that `src/lib.rs` embeds.
//!
//! nvcc is looked up in `$NVCC`, `PATH`, `/usr/local/cuda/bin` and the
//! project-local `.cache/nvcc` that `cargo xtask install-nvcc` fills. Without
//! one (or with `LAMINA_SKIP_KERNELS=1`) the crate still builds, without the
//! `kernels_built` cfg, and reports at run time why CUDA is unavailable. When
//! nvcc is found, a kernel that fails to compile fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn find_nvcc(root: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Some(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let c = dir.join("nvcc");
            if c.is_file() {
                return Some(c);
            }
        }
    }
    [
        PathBuf::from("/usr/local/cuda/bin/nvcc"),
        root.join(".cache/nvcc/nvidia/cu13/bin/nvcc"),
    ]
    .into_iter()
    .find(|c| c.is_file())
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kernels_built)");
    println!("cargo::rerun-if-env-changed=NVCC");
    println!("cargo::rerun-if-env-changed=LAMINA_SKIP_KERNELS");
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    let cu_dir = manifest.join("src/cu");
    println!("cargo::rerun-if-changed={}", cu_dir.display());
    println!(
        "cargo::rerun-if-changed={}",
        root.join(".cache/nvcc").display()
    );
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&cu_dir)
        .expect("crates/kernels/src/cu exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu" || x == "cuh"))
        .collect();
    sources.sort();
    for s in &sources {
        println!("cargo::rerun-if-changed={}", s.display());
    }

    let skip = std::env::var("LAMINA_SKIP_KERNELS").is_ok_and(|v| v == "1");
    let nvcc = if skip { None } else { find_nvcc(&root) };
    let Some(nvcc) = nvcc else {
        let why = if skip {
            "built without CUDA kernels: LAMINA_SKIP_KERNELS=1 was set; unset it and rebuild"
        } else {
            "built without CUDA kernels: nvcc not found; run `cargo xtask install-nvcc` and rebuild"
        };
        println!("cargo::rustc-env=KERNELS_UNAVAILABLE={why}");
        println!("cargo::warning={why}");
        return;
    };

    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let unity = out.join("all_kernels.cu");
    let body: String = sources
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| format!("#include \"{}\"\n", p.display()))
        .collect();
    std::fs::write(&unity, body).expect("write the unity source into OUT_DIR");
    let fatbin = out.join("kernels.fatbin");
    let status = Command::new(&nvcc)
        .args([
            "-fatbin",
            "-O3",
            "-lineinfo",
            "-std=c++17",
            "-gencode=arch=compute_90,code=sm_90",
            "-gencode=arch=compute_80,code=sm_80",
            "-gencode=arch=compute_80,code=compute_80",
            "-I",
        ])
        .arg(&cu_dir)
        .arg("-o")
        .arg(&fatbin)
        .arg(&unity)
        .status();
    match status {
        Ok(s) if s.success() => {
            println!("cargo::rustc-cfg=kernels_built");
            println!("cargo::rustc-env=KERNELS_NVCC={}", nvcc.display());
        }
        Ok(s) => {
            eprintln!(
                "nvcc ({}) failed compiling the kernels: {s}",
                nvcc.display()
            );
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("cannot run nvcc at {}: {e}", nvcc.display());
            std::process::exit(1);
        }
    }
}
