//! Runs `cargo test` passes and keeps their counts, failures and skips for
//! one summary at the end of `cargo xtask test`.
//!
//! Contract: [`run_pass`] echoes cargo's output as it comes (stdout to
//! stdout, stderr to stderr) and returns what it read from it: the
//! `test result:` counts of every binary, the `... FAILED` test names, the
//! binaries cargo lists as failed and the `SKIPPED <test>: ...` lines the
//! tests write (`cpu_kernels::isa::test_runs_here`). [`print`] writes the
//! summary; its last line has the plain `N passed, N failed, N skipped`
//! form CI reads.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};

/// What one `cargo test` pass printed.
#[derive(Debug, Default)]
pub struct Pass {
    /// What the pass ran, for the summary (`all paths`, `cap avx2`...).
    pub label: String,
    pub passed: u64,
    pub failed: u64,
    pub ignored: u64,
    /// `test <name> ... FAILED` names.
    pub failures: Vec<String>,
    /// cargo's list of failed targets (`-p cli --test fp8`), and build errors.
    pub failed_targets: Vec<String>,
    /// `SKIPPED <test>: <why>` lines.
    pub skipped: Vec<String>,
    /// Whether cargo exited 0.
    pub ok: bool,
}

impl Pass {
    /// Reads one line of cargo's or a test binary's output.
    fn read(&mut self, line: &str, in_failed_list: &mut bool) {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("test result: ") {
            self.passed += count(rest, "passed");
            self.failed += count(rest, "failed");
            self.ignored += count(rest, "ignored");
        } else if let Some(name) = t
            .strip_prefix("test ")
            .and_then(|r| r.strip_suffix(" ... FAILED"))
        {
            self.failures.push(name.to_string());
        } else if let Some(skipped) = t.strip_prefix("SKIPPED ") {
            self.skipped.push(skipped.to_string());
        } else if t.starts_with("error:") && t.contains("target") && t.contains("failed") {
            *in_failed_list = true;
            return;
        } else if t.starts_with("error: could not compile") {
            self.failed_targets.push(t.to_string());
        } else if *in_failed_list && t.starts_with('`') {
            self.failed_targets.push(t.trim_matches('`').to_string());
            return;
        }
        *in_failed_list = false;
    }
}

/// The number before `word` in a `test result:` line (`12 passed; 0 failed`).
fn count(result: &str, word: &str) -> u64 {
    result
        .split([';', '.'])
        .filter_map(|part| part.trim().strip_suffix(word))
        .filter_map(|n| n.trim().parse().ok())
        .next()
        .unwrap_or(0)
}

/// Echoes `from` to `to` line by line, reading each line into `pass`.
fn pump(from: impl Read, mut to: impl Write, pass: Arc<Mutex<Pass>>) {
    let mut in_failed_list = false;
    for line in BufReader::new(from).lines() {
        let Ok(line) = line else { break };
        // a lost echo only loses the echo; the counts still come
        let _ = writeln!(to, "{line}");
        if let Ok(mut p) = pass.lock() {
            p.read(&line, &mut in_failed_list);
        }
    }
}

/// Runs `cmd` (a `cargo test` command), echoing and reading its output.
pub fn run_pass(label: &str, mut cmd: Command) -> Result<Pass> {
    let pass = Arc::new(Mutex::new(Pass {
        label: label.to_string(),
        ..Pass::default()
    }));
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running cargo test")?;
    let out = child.stdout.take().context("cargo test's stdout")?;
    let err = child.stderr.take().context("cargo test's stderr")?;
    let (p1, p2) = (pass.clone(), pass.clone());
    let t1 = std::thread::spawn(move || pump(out, std::io::stdout(), p1));
    let t2 = std::thread::spawn(move || pump(err, std::io::stderr(), p2));
    let status = child.wait().context("waiting for cargo test")?;
    let _ = (t1.join(), t2.join());
    let mut pass = std::mem::take(&mut *pass.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    pass.ok = status.success();
    if !pass.ok && pass.failures.is_empty() && pass.failed_targets.is_empty() {
        pass.failed_targets
            .push(format!("cargo test exited with {status}"));
    }
    Ok(pass)
}

/// Prints the summary of every pass; returns whether all of them passed.
pub fn print(passes: &[Pass]) -> bool {
    println!("\n==== cargo xtask test: summary ====");
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for p in passes {
        println!(
            "{}: {} passed, {} failed, {} ignored, {} skipped by the processor{}",
            p.label,
            p.passed,
            p.failed,
            p.ignored,
            p.skipped.len(),
            if p.ok { "" } else { " -- FAILED" }
        );
        for f in &p.failures {
            println!("  FAILED {f}");
        }
        for t in &p.failed_targets {
            println!("  failed target: {t}");
        }
        for s in &p.skipped {
            println!("  skipped {s}");
        }
        passed += p.passed;
        failed += p.failed + u64::from(!p.ok && p.failed == 0);
        skipped += p.ignored + p.skipped.len() as u64;
    }
    println!("xtask: {passed} passed, {failed} failed, {skipped} skipped");
    passes.iter().all(|p| p.ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_counts_failures_targets_and_skips() {
        let mut p = Pass::default();
        let mut list = false;
        for line in [
            "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "test cpu::tests::quant ... FAILED",
            "test result: FAILED. 4 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "SKIPPED vector::dot_avx512: this processor lacks avx512f",
            "error: 2 targets failed:",
            "    `-p model --lib`",
            "    `-p cli --test fp8`",
            "some other line",
            "    `not a target`",
        ] {
            p.read(line, &mut list);
        }
        assert_eq!((p.passed, p.failed, p.ignored), (16, 1, 3));
        assert_eq!(p.failures, ["cpu::tests::quant"]);
        assert_eq!(p.failed_targets, ["-p model --lib", "-p cli --test fp8"]);
        assert_eq!(
            p.skipped,
            ["vector::dot_avx512: this processor lacks avx512f"]
        );
    }
}
