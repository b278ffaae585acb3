//! A GGUF (v2/v3) reader and dequantiser, and the import of llama GGUF files
//! into a Hugging Face model directory ([`import_to_dir`]).
//!
//! Contract: [`Gguf::parse`] reads the header, every metadata value (all
//! scalar types, strings, nested arrays), the tensor infos and the alignment
//! (`general.alignment`, default 32) from a byte slice, bounds-checking every
//! read: a short or corrupt file is a [`GgufError`] naming the file and what
//! was being read, never a panic or a huge allocation. A key or tensor name
//! given twice, or dims whose element count overflows, is an error naming
//! it. Tensor dims are kept as
//! GGUF stores them, fastest-varying first (the reverse of the row-major
//! shape). [`dequantize`] supports F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1 and the K types Q2_K-Q6_K with
//! ggml's block layouts; other types are an error naming the tensor.
//!
//! Layout: this file holds the types and [`Gguf::parse`]; `cursor.rs` the
//! bounds-checked little-endian reader, `dequant.rs` the block formats,
//! `import.rs` the Hugging Face import, `bos.rs` whether the vocabulary
//! adds BOS (llama.cpp's decision).
//!
//! Costs: parsing is O(metadata) and copies only metadata; tensor data stays
//! in the caller's (usually memory-mapped) slice until dequantised, one
//! tensor at a time, into f32.

mod arch;
#[cfg(test)]
mod arch_tests;
mod bos;
mod cursor;
mod dequant;
mod dequant_k;
mod import;
#[cfg(test)]
mod tests;

pub use arch::Arch;
pub use bos::{adds_bos, file_adds_bos};
pub use dequant::{GgmlType, dequantize};
pub use import::{TokenizerFiles, import_to_dir, import_with_tokenizer, unpermute_rows};

use std::collections::BTreeMap;

use cursor::Cursor;

/// Errors reading or importing a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: not a GGUF file (magic {magic:?})")]
    Magic { path: String, magic: [u8; 4] },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    Version { path: String, version: u32 },
    #[error("{path}: truncated or corrupt while reading {what} at byte {offset}")]
    Truncated {
        path: String,
        what: String,
        offset: usize,
    },
    #[error("{path}: {what}: {reason}")]
    Invalid {
        path: String,
        what: String,
        reason: String,
    },
    #[error("tensor `{tensor}`: {reason}")]
    Tensor { tensor: String, reason: String },
    #[error("metadata key `{key}`: {reason}")]
    Metadata { key: String, reason: String },
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] contract::config::ConfigError),
    #[error("building tokenizer.json: {0}")]
    Tokenizer(String),
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Any non-negative integer as u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer as i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any number as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, fastest-varying first (GGUF order).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Byte offset of the data relative to [`Gguf::data_start`].
    pub offset: u64,
}

impl TensorInfo {
    /// Row-major shape (slowest first), as Hugging Face and safetensors write it.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone)]
pub struct Gguf {
    /// Labels errors (usually the file path).
    pub path: String,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: usize,
    /// Absolute byte offset of the tensor data section.
    pub data_start: usize,
}

/// Refuses tensors whose data ranges overlap, naming both (tensors of an
/// unknown type or no bytes are left to the reads that meet them).
fn check_overlaps(path: &str, tensors: &[TensorInfo]) -> Result<(), GgufError> {
    let mut ranges: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter_map(|t| {
            let size = t.ty.byte_size(t.numel()).ok()? as u64;
            (size > 0).then(|| (t.offset, t.offset.saturating_add(size), t.name.as_str()))
        })
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        let ((s0, e0, a), (s1, e1, b)) = (w[0], w[1]);
        if s1 < e0 {
            return Err(GgufError::Invalid {
                path: path.to_string(),
                what: format!("tensors `{a}` and `{b}`"),
                reason: format!("their data ranges overlap ([{s0}, {e0}) and [{s1}, {e1}))"),
            });
        }
    }
    Ok(())
}

impl Gguf {
    /// Parses the header of the GGUF file in `buf`; `path` labels errors.
    pub fn parse(buf: &[u8], path: &str) -> Result<Gguf, GgufError> {
        let mut c = Cursor { buf, pos: 0, path };
        let magic: [u8; 4] = c.arr(&|| "magic".into())?;
        if &magic != b"GGUF" {
            return Err(GgufError::Magic {
                path: path.to_string(),
                magic,
            });
        }
        let version = c.u32(&|| "version".into())?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_string(),
                version,
            });
        }
        // a tensor info takes at least 8 + 4 + 4 + 8 bytes; a kv at least 8 + 4 + 1
        let n_tensors = c.count(24, &|| "tensor count".into())?;
        let n_kv = c.count(13, &|| "metadata count".into())?;
        let mut metadata = BTreeMap::new();
        for i in 0..n_kv {
            let key = c.string(&|| format!("metadata key #{i}"))?;
            let what = || format!("metadata `{key}`");
            let ty = c.u32(&what)?;
            let v = c.value(ty, &what, 0)?;
            if metadata.contains_key(&key) {
                return Err(GgufError::Invalid {
                    path: path.to_string(),
                    what: what(),
                    reason: "the key appears twice".into(),
                });
            }
            metadata.insert(key, v);
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        let mut names = std::collections::HashSet::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = c.string(&|| format!("tensor info #{i}"))?;
            let what = || format!("tensor info `{name}`");
            let n_dims = c.u32(&what)? as usize;
            if n_dims > 4 {
                return Err(GgufError::Invalid {
                    path: path.to_string(),
                    what: what(),
                    reason: format!("{n_dims} dimensions (at most 4)"),
                });
            }
            let dims = (0..n_dims)
                .map(|_| c.u64(&what))
                .collect::<Result<Vec<_>, _>>()?;
            // numel() and shape() may then multiply and convert freely
            if dims
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(usize::try_from(d).ok()?))
                .is_none()
            {
                return Err(GgufError::Invalid {
                    path: path.to_string(),
                    what: what(),
                    reason: format!("dims {dims:?}: the element count overflows"),
                });
            }
            if !names.insert(name.clone()) {
                return Err(GgufError::Invalid {
                    path: path.to_string(),
                    what: what(),
                    reason: "the tensor name appears twice".into(),
                });
            }
            let ty = GgmlType::from_u32(c.u32(&what)?);
            let offset = c.u64(&what)?;
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }
        check_overlaps(path, &tensors)?;
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a as usize,
                _ => {
                    return Err(GgufError::Metadata {
                        key: "general.alignment".into(),
                        reason: format!("must be a power of two, got {v:?}"),
                    });
                }
            },
        };
        let data_start = c.pos.div_ceil(alignment) * alignment;
        Ok(Gguf {
            path: path.to_string(),
            version,
            metadata,
            tensors,
            alignment,
            data_start,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of tensor `t` inside `buf` (the whole file).
    pub fn tensor_bytes<'a>(&self, buf: &'a [u8], t: &TensorInfo) -> Result<&'a [u8], GgufError> {
        let bad = |reason: String| GgufError::Tensor {
            tensor: t.name.clone(),
            reason,
        };
        let size = t.ty.byte_size(t.numel()).map_err(&bad)?;
        let start = usize::try_from(t.offset)
            .ok()
            .and_then(|o| o.checked_add(self.data_start))
            .ok_or_else(|| bad(format!("offset {} overflows", t.offset)))?;
        if start % self.alignment != 0 {
            return Err(bad(format!(
                "offset {} is not aligned to {}",
                t.offset, self.alignment
            )));
        }
        start
            .checked_add(size)
            .and_then(|end| buf.get(start..end))
            .ok_or_else(|| {
                bad(format!(
                    "data [{start}, {start}+{size}) lies beyond the end of {} ({} bytes): file truncated",
                    self.path,
                    buf.len()
                ))
            })
    }

    /// Dequantises tensor `t` of the file `buf` to f32, in GGUF element order.
    pub fn dequantize(&self, buf: &[u8], t: &TensorInfo) -> Result<Vec<f32>, GgufError> {
        let bytes = self.tensor_bytes(buf, t)?;
        dequantize(t.ty, bytes, t.numel()).map_err(|reason| GgufError::Tensor {
            tensor: t.name.clone(),
            reason,
        })
    }

    /// A metadata value, or an error naming the missing key.
    pub fn get(&self, key: &str) -> Result<&Value, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError::Metadata {
            key: key.to_string(),
            reason: "missing".into(),
        })
    }

    /// A non-negative integer metadata value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.get(key)?;
        v.as_u64().ok_or_else(|| GgufError::Metadata {
            key: key.to_string(),
            reason: format!("expected an unsigned integer, got {v:?}"),
        })
    }

    /// A numeric metadata value.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.get(key)?;
        v.as_f64().ok_or_else(|| GgufError::Metadata {
            key: key.to_string(),
            reason: format!("expected a number, got {v:?}"),
        })
    }

    /// A string metadata value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.get(key)?;
        v.as_str().ok_or_else(|| GgufError::Metadata {
            key: key.to_string(),
            reason: format!("expected a string, got {v:?}"),
        })
    }
}
