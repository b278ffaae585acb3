//! A streaming BF16 safetensors writer.
//!
//! Contract: the header (names, shapes, offsets) is fixed at creation from the
//! list of [`TensorSpec`]s; data is then appended in that order, in chunks of
//! any size, so a caller never holds more than the chunk it is writing (the
//! synthetic 1B model and GGUF imports stream through this). [`finish`]
//! fails unless every tensor received exactly its element count. The output
//! is byte-for-byte deterministic for the same specs and data; the header is
//! padded with spaces to 8 bytes like the reference implementation.
//!
//! Costs: one buffered sequential write of the file; memory is the header
//! plus an 8 MiB buffer.
//!
//! [`finish`]: SafetensorsWriter::finish

use half::bf16;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A tensor's name and shape (the writer stores BF16 only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Writes one safetensors file tensor by tensor; see the module doc.
pub struct SafetensorsWriter {
    path: PathBuf,
    out: BufWriter<File>,
    specs: Vec<TensorSpec>,
    /// Index of the tensor being written.
    current: usize,
    /// Elements of `specs[current]` already written.
    written: usize,
}

fn io_err(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

impl SafetensorsWriter {
    /// Creates `path` and writes the header for `specs` (data follows in this order).
    pub fn create(path: &Path, specs: Vec<TensorSpec>) -> std::io::Result<Self> {
        let mut header = serde_json::Map::new();
        let mut meta = serde_json::Map::new();
        meta.insert("format".into(), "pt".into());
        header.insert("__metadata__".into(), meta.into());
        let mut offset = 0usize;
        for s in &specs {
            let end = offset + s.numel() * 2;
            header.insert(
                s.name.clone(),
                serde_json::json!({"dtype": "BF16", "shape": s.shape, "data_offsets": [offset, end]}),
            );
            offset = end;
        }
        let mut text = serde_json::Value::Object(header).to_string().into_bytes();
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        let file = File::create(path).map_err(|e| io_err(path, e))?;
        let mut out = BufWriter::with_capacity(8 << 20, file);
        out.write_all(&(text.len() as u64).to_le_bytes())
            .and_then(|_| out.write_all(&text))
            .map_err(|e| io_err(path, e))?;
        let mut w = SafetensorsWriter {
            path: path.to_path_buf(),
            out,
            specs,
            current: 0,
            written: 0,
        };
        w.skip_empty();
        Ok(w)
    }

    /// The tensor the next chunk belongs to (`None` once all are written).
    pub fn current(&self) -> Option<&TensorSpec> {
        self.specs.get(self.current)
    }

    fn skip_empty(&mut self) {
        while self.current < self.specs.len() && self.written == self.specs[self.current].numel() {
            self.current += 1;
            self.written = 0;
        }
    }

    /// Appends `chunk` to the current tensor; a chunk never spans two tensors.
    pub fn write_chunk(&mut self, chunk: &[bf16]) -> std::io::Result<()> {
        let Some(spec) = self.specs.get(self.current) else {
            return Err(std::io::Error::other(format!(
                "{}: data written past the last tensor",
                self.path.display()
            )));
        };
        if self.written + chunk.len() > spec.numel() {
            return Err(std::io::Error::other(format!(
                "{}: tensor `{}` given {} elements, expected {}",
                self.path.display(),
                spec.name,
                self.written + chunk.len(),
                spec.numel()
            )));
        }
        // safetensors is little-endian: on such targets the memory is the file format
        #[cfg(target_endian = "little")]
        let written = self.out.write_all(bytemuck::cast_slice::<bf16, u8>(chunk));
        #[cfg(not(target_endian = "little"))]
        let written = {
            let bytes: Vec<u8> = chunk
                .iter()
                .flat_map(|x| x.to_bits().to_le_bytes())
                .collect();
            self.out.write_all(&bytes)
        };
        written.map_err(|e| io_err(&self.path, e))?;
        self.written += chunk.len();
        self.skip_empty();
        Ok(())
    }

    /// Flushes and syncs the file; an error if some tensor is incomplete.
    pub fn finish(mut self) -> std::io::Result<()> {
        if let Some(spec) = self.specs.get(self.current) {
            return Err(std::io::Error::other(format!(
                "{}: tensor `{}` incomplete ({} of {} elements)",
                self.path.display(),
                spec.name,
                self.written,
                spec.numel()
            )));
        }
        self.out.flush().map_err(|e| io_err(&self.path, e))?;
        let file = self
            .out
            .into_inner()
            .map_err(|e| io_err(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| io_err(&self.path, e))
    }
}
