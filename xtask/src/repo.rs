//! The repository xtask's commands work on, and the environment of the
//! cargo runs they start.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root (the parent of xtask/).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Removes the variables `cargo run` set for xtask itself (its package
/// name, version, manifest dir...). Build scripts such as ring's rerun when
/// these change, so leaving them would make the tests' build and a plain
/// `cargo run --release -p cli` rebuild each other's dependencies.
pub(crate) fn clear_run_env(cmd: &mut Command) {
    const SET_BY_RUN: [&str; 6] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
    ];
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("CARGO_PKG_") || SET_BY_RUN.contains(&k.as_ref()) {
            cmd.env_remove(&key);
        }
    }
}
