//! Reading a file a user names (a command-line path, a path sent over
//! HTTP) without trusting what the path turns out to be.
//!
//! Contract: every function opens the path once (following symlinks), then
//! checks the opened file itself (`fstat`, so the file checked is the file
//! read): anything but a regular file (a directory, a FIFO, a socket, a
//! device such as `/dev/zero`) is refused at once, naming the path and what
//! it is. On Unix the open is non-blocking, so a FIFO with no writer is
//! refused instead of hanging the caller. A file larger than the caller's
//! byte limit is refused before a byte of it is read; a file that grows
//! while being read is read only up to the limit and then refused.
//! [`map_regular`] maps the file instead of reading it: memory is spent
//! only on the pages the caller touches.
//!
//! Costs: one `open` and one `fstat`; reading is the file's size, bounded by
//! the limit.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{path}: cannot open it: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: is {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("{path}: is {size} bytes, above the limit of {limit} bytes")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: is not UTF-8 text (invalid byte at offset {offset})")]
    NotUtf8 { path: PathBuf, offset: usize },
}

impl FileError {
    /// The path the error is about.
    pub fn path(&self) -> &Path {
        match self {
            FileError::Open { path, .. }
            | FileError::NotRegular { path, .. }
            | FileError::TooLarge { path, .. }
            | FileError::Read { path, .. }
            | FileError::NotUtf8 { path, .. } => path,
        }
    }

    /// Whether the path could not be reached as a regular file at all
    /// (missing, not permitted, not a regular file): the errors that tell
    /// a remote caller only whether something exists.
    pub fn is_access(&self) -> bool {
        matches!(self, FileError::Open { .. } | FileError::NotRegular { .. })
    }
}

/// What a non-regular file is, for the error.
fn kind_of(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a plain file"
    }
}

/// Opens `path` and checks it is a regular file; returns it and its size.
pub fn open_regular(path: &Path) -> Result<(File, u64), FileError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // a FIFO opens at once instead of waiting for a writer; regular
        // files ignore the flag
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path).map_err(|source| FileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let meta = file.metadata().map_err(|source| FileError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular {
            path: path.to_path_buf(),
            kind: kind_of(meta.file_type()),
        });
    }
    Ok((file, meta.len()))
}

fn too_large(path: &Path, size: u64, limit: u64) -> FileError {
    FileError::TooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    }
}

/// The bytes of the regular file `path`, at most `max_bytes` of them.
pub fn read_regular(path: &Path, max_bytes: u64) -> Result<Vec<u8>, FileError> {
    let (file, size) = open_regular(path)?;
    if size > max_bytes {
        return Err(too_large(path, size, max_bytes));
    }
    let mut out = Vec::with_capacity(size as usize);
    // one byte past the limit tells a file that grew while being read
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|source| FileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if out.len() as u64 > max_bytes {
        return Err(too_large(path, out.len() as u64, max_bytes));
    }
    Ok(out)
}

/// The text of the regular file `path` (UTF-8), at most `max_bytes` long.
pub fn read_regular_string(path: &Path, max_bytes: u64) -> Result<String, FileError> {
    let bytes = read_regular(path, max_bytes)?;
    String::from_utf8(bytes).map_err(|e| FileError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// The regular file `path` mapped read-only, at most `max_bytes` long.
pub fn map_regular(path: &Path, max_bytes: u64) -> Result<memmap2::Mmap, FileError> {
    let (file, size) = open_regular(path)?;
    if size > max_bytes {
        return Err(too_large(path, size, max_bytes));
    }
    // SAFETY: a read-only private map of a regular file, read through
    // bounds-checked slices; a file changed underneath gives wrong bytes
    // or a parse error, and a concurrent truncation could fault, which no
    // file API can rule out (as with every mmap-based loader).
    unsafe { memmap2::Mmap::map(&file) }.map_err(|source| FileError::Read {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_files_are_read_within_the_limit() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a.txt");
        std::fs::write(&p, "hello").unwrap();
        assert_eq!(read_regular(&p, 5).unwrap(), b"hello");
        assert_eq!(read_regular_string(&p, 100).unwrap(), "hello");
        assert_eq!(&map_regular(&p, 5).unwrap()[..], b"hello");
        let e = read_regular(&p, 4).unwrap_err();
        assert!(
            matches!(
                e,
                FileError::TooLarge {
                    size: 5,
                    limit: 4,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("a.txt"), "{e}");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        let e = read_regular_string(&p, 10).unwrap_err();
        assert!(matches!(e, FileError::NotUtf8 { offset: 0, .. }), "{e}");
    }

    #[test]
    fn sparse_files_past_the_limit_cost_nothing() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sparse");
        let f = File::create(&p).unwrap();
        f.set_len(3 << 30).unwrap();
        let e = read_regular(&p, 1 << 20).unwrap_err();
        assert!(
            matches!(e, FileError::TooLarge { size, .. } if size == 3 << 30),
            "{e}"
        );
        assert!(map_regular(&p, 1 << 20).is_err());
    }

    #[test]
    fn directories_and_missing_paths_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = read_regular(d.path(), 1 << 20).unwrap_err();
        assert!(
            matches!(
                e,
                FileError::NotRegular {
                    kind: "a directory",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.is_access());
        let e = read_regular(&d.path().join("absent"), 1 << 20).unwrap_err();
        assert!(matches!(e, FileError::Open { .. }), "{e}");
        assert!(e.is_access());
    }

    #[cfg(unix)]
    #[test]
    fn devices_and_fifos_are_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        let e = read_regular(&link, 1 << 20).unwrap_err();
        assert!(
            matches!(
                e,
                FileError::NotRegular {
                    kind: "a device",
                    ..
                }
            ),
            "{e}"
        );
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // no writer ever opens it: a blocking open would hang here
        let e = read_regular(&fifo, 1 << 20).unwrap_err();
        assert!(
            matches!(e, FileError::NotRegular { kind: "a FIFO", .. }),
            "{e}"
        );
    }
}
