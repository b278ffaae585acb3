//! The text files commands read (`perplexity --text`, `quantize
//! --calibration`): regular files only (a FIFO, a device such as
//! `/dev/zero`, a directory are refused by name, also behind a symlink), at
//! most [`MAX_TEXT_BYTES`], read and tokenized a piece of at most
//! [`PIECE_BYTES`] at a time, so memory follows the tokens kept, never the
//! file's size.
//!
//! Pieces are cut at the start of a line (after a `\n`, before a printable
//! ASCII character), else between two ASCII words, else between two
//! characters. The byte-level BPE pre-tokenizers (GPT-2's, Llama 3's,
//! SmolLM's) always split there, so such a tokenizer gives the same tokens
//! as for the whole text; a text under [`PIECE_BYTES`] is one piece.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use tokenizer::Tokenizer;

/// The largest text file read (1 GiB).
pub const MAX_TEXT_BYTES: u64 = 1 << 30;
/// Bytes of text tokenized at once (1 MiB).
pub const PIECE_BYTES: usize = 1 << 20;

/// An open text file, read a piece at a time.
pub struct TextFile {
    file: File,
    path: PathBuf,
    /// The flag that named the file, for errors.
    flag: &'static str,
    /// Read, not yet handed out.
    buf: Vec<u8>,
    /// Bytes handed out before `buf`.
    offset: u64,
    read: u64,
    eof: bool,
    piece: usize,
}

impl TextFile {
    /// Opens `path` (given as `flag`) without blocking
    /// (`checkpoint::files::open_regular`), and refuses anything but a
    /// regular file of at most [`MAX_TEXT_BYTES`].
    pub fn open(path: &Path, flag: &'static str) -> Result<TextFile> {
        // a FIFO, device or directory is refused at once, by kind
        let (file, len) = checkpoint::files::open_regular(path)
            .with_context(|| format!("reading {flag} {}", path.display()))?;
        if len > MAX_TEXT_BYTES {
            bail!(
                "{flag} {} is {len} bytes, over the limit of {MAX_TEXT_BYTES} bytes (1 GiB) for a text",
                path.display()
            );
        }
        Ok(TextFile {
            file,
            path: path.to_path_buf(),
            flag,
            buf: Vec::new(),
            offset: 0,
            read: 0,
            eof: false,
            piece: PIECE_BYTES,
        })
    }

    /// `true` when the whole text is blank (empty or white space only).
    pub fn is_blank(&mut self) -> Result<bool> {
        self.fill()?;
        Ok(self.eof && self.buf.iter().all(u8::is_ascii_whitespace))
    }

    /// The next piece of text (at most [`PIECE_BYTES`]), `None` at the end.
    pub fn next_piece(&mut self) -> Result<Option<String>> {
        self.fill()?;
        if self.buf.is_empty() {
            return Ok(None);
        }
        let cut = if self.eof {
            self.buf.len()
        } else {
            cut_point(&self.buf)
        };
        let rest = self.buf.split_off(cut);
        let piece = std::mem::replace(&mut self.buf, rest);
        let at = self.offset;
        self.offset += cut as u64;
        String::from_utf8(piece).map(Some).map_err(|e| {
            anyhow!(
                "{} {} is not UTF-8 text (invalid bytes at offset {})",
                self.flag,
                self.path.display(),
                at + e.utf8_error().valid_up_to() as u64
            )
        })
    }

    /// Reads until a piece's worth is buffered or the file ends; a file
    /// that grew past [`MAX_TEXT_BYTES`] since it was opened is refused.
    fn fill(&mut self) -> Result<()> {
        while !self.eof && self.buf.len() < self.piece {
            let start = self.buf.len();
            self.buf.resize(self.piece, 0);
            let n = loop {
                match self.file.read(&mut self.buf[start..]) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!("reading {} {}", self.flag, self.path.display())
                        });
                    }
                }
            };
            self.buf.truncate(start + n);
            self.eof = n == 0;
            self.read += n as u64;
            if self.read > MAX_TEXT_BYTES {
                bail!(
                    "{} {} grew over the limit of {MAX_TEXT_BYTES} bytes (1 GiB) for a text while it was read",
                    self.flag,
                    self.path.display()
                );
            }
        }
        Ok(())
    }
}

/// Where to end a piece of the (full) buffer `buf`: after its last `\n`
/// that a printable ASCII character follows, else at its last space
/// between two ASCII letters or digits, else at its last character
/// boundary.
fn cut_point(buf: &[u8]) -> usize {
    let line = buf
        .windows(2)
        .rposition(|w| w[0] == b'\n' && w[1].is_ascii_graphic());
    if let Some(i) = line {
        return i + 1;
    }
    let word = buf.windows(3).rposition(|w| {
        w[0].is_ascii_alphanumeric() && w[1] == b' ' && w[2].is_ascii_alphanumeric()
    });
    if let Some(i) = word {
        return i + 1;
    }
    // a UTF-8 character starts at any byte but a continuation byte
    match buf.iter().rposition(|&b| b & 0xC0 != 0x80) {
        Some(i) if i > 0 => i,
        _ => buf.len(),
    }
}

/// The tokens of `text` (text only: special-token strings stay text, as
/// llama.cpp's tokenizer reads a file), after `bos` when given; reading
/// stops once `limit` tokens are held (there may be more).
pub fn tokenize(
    text: &mut TextFile,
    tok: &Tokenizer,
    bos: Option<u32>,
    limit: usize,
) -> Result<Vec<u32>> {
    let mut ids: Vec<u32> = bos.into_iter().collect();
    while ids.len() < limit {
        let Some(piece) = text.next_piece()? else {
            break;
        };
        let piece_ids = tok
            .encode_literal(&piece)
            .with_context(|| format!("tokenizing {} {}", text.flag, text.path.display()))?;
        ids.extend_from_slice(&piece_ids);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_cut_at_a_line_start_else_between_words_else_characters() {
        assert_eq!(cut_point(b"one\ntwo\n three"), 4);
        assert_eq!(cut_point(b"one two  three."), 3);
        assert_eq!(cut_point("..\u{e9}\u{e9}".as_bytes()), 4);
    }

    #[test]
    fn small_pieces_join_to_the_whole_text() {
        let path = std::env::temp_dir().join(format!("lamina-files-{}", std::process::id()));
        let text = "A line.\nAnother line with words\n\n  indented\u{e9}\u{e9}\u{e9} end.\n";
        std::fs::write(&path, text).unwrap();
        let mut f = TextFile::open(&path, "--text").unwrap();
        f.piece = 7;
        let mut joined = String::new();
        while let Some(p) = f.next_piece().unwrap() {
            assert!(p.len() <= 7, "{p:?}");
            joined.push_str(&p);
        }
        assert_eq!(joined, text);
        let _ = std::fs::remove_file(&path);
    }
}
