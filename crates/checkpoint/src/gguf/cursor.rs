//! [`Cursor`]: the bounds-checked little-endian reader [`Gguf::parse`] reads
//! a GGUF header with.
//!
//! Contract: every read checks the remaining length first and reports a
//! short buffer as [`GgufError::Truncated`] naming what was being read and
//! where; counts are checked against the bytes left before anything is
//! allocated; arrays nest at most 8 deep. Costs: O(bytes read); only strings
//! and arrays allocate.
//!
//! [`Gguf::parse`]: super::Gguf::parse

use super::{GgufError, Value};

/// The fewest bytes a value of type `ty` takes (a string or an array its
/// length prefix), so an array count can be checked against the bytes left.
fn min_size(ty: u32) -> usize {
    match ty {
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => 1,
    }
}

pub(super) struct Cursor<'a> {
    pub(super) buf: &'a [u8],
    /// Next byte to read.
    pub(super) pos: usize,
    /// Labels errors.
    pub(super) path: &'a str,
}

impl<'a> Cursor<'a> {
    pub(super) fn take(
        &mut self,
        n: usize,
        what: &dyn Fn() -> String,
    ) -> Result<&'a [u8], GgufError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(GgufError::Truncated {
                path: self.path.to_string(),
                what: what(),
                offset: self.pos,
            });
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub(super) fn arr<const N: usize>(
        &mut self,
        what: &dyn Fn() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(super) fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    pub(super) fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    /// A count that must fit in the remaining bytes at `min_size` bytes per item.
    pub(super) fn count(
        &mut self,
        min_size: usize,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.buf.len() - self.pos) / min_size.max(1);
        match usize::try_from(n) {
            Ok(n) if n <= left => Ok(n),
            _ => Err(GgufError::Truncated {
                path: self.path.to_string(),
                what: format!("{} (count {n} exceeds the file)", what()),
                offset: at,
            }),
        }
    }

    pub(super) fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let n = self.count(1, what)?;
        let at = self.pos;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::Invalid {
            path: self.path.to_string(),
            what: format!("{} at byte {at}", what()),
            reason: "string is not UTF-8".into(),
        })
    }

    pub(super) fn value(
        &mut self,
        ty: u32,
        what: &dyn Fn() -> String,
        depth: usize,
    ) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(what)?[0]),
            1 => Value::I8(i8::from_le_bytes(self.arr(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => Value::Bool(self.arr::<1>(what)?[0] != 0),
            8 => Value::String(self.string(what)?),
            9 if depth < 8 => {
                let inner = self.u32(what)?;
                let n = self.count(min_size(inner), what)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(inner, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(what)?)),
            other => {
                return Err(GgufError::Invalid {
                    path: self.path.to_string(),
                    what: what(),
                    reason: format!("unknown value type {other} (or arrays nested too deep)"),
                });
            }
        })
    }
}
