//! The byte budget of one render: every string or collection a chat
//! template builds, and every byte it writes (to the prompt or into a
//! capture), is charged as it is made, and the render fails once the total
//! passes its budget.
//!
//! minijinja bounds instructions (fuel), not bytes, and a few instructions
//! can double a string thirty times (`{% set s = s ~ s %}`, a macro that
//! writes its argument twice, a `{% set %}` block). So the compiled template
//! is rewritten before it runs (minijinja's `unstable_machinery` API):
//! - after each instruction that makes a new value (`~`, `+`, `*`, slices,
//!   list and map literals, filter, function, method and macro calls,
//!   captured output) a call to [`CHARGE_MADE`] charges the value's size
//!   and hands it on unchanged (a lazy sequence from `+` or `*` at the
//!   size it will have when built, a lazy iterable a call returns, such as
//!   `range(n)`, at nothing: iterating it builds nothing);
//! - before each `Emit` a call to [`CHARGE_WRITTEN`] charges what writing
//!   the value produces (a collection or iterable at its printed size);
//! - before each `EmitRaw` (template text) [`CHARGE_LEN`] charges its length.
//!
//! Jump targets are remapped to the rewritten positions (a jump to an
//! `Emit` lands on its charge). A value is charged once made, so a render
//! holds at most its budget plus one operation's result; minijinja itself
//! caps a repeated string (`*`) at 100 MB, and the method callback refuses a
//! count argument larger than what is left.
//!
//! Costs: the rewrite is linear in the template's instructions (done per
//! render, a few microseconds for real templates); each charge is O(1)
//! except for a written collection, measured item by item (which writing
//! it costs anyway).

use minijinja::machinery::{Instruction, Instructions};
use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind};
use std::cell::Cell;

/// The function that charges a newly made value and returns it.
pub(super) const CHARGE_MADE: &str = "__lamina_charge_made";
/// [`CHARGE_MADE`] for what a call returns.
pub(super) const CHARGE_RETURNED: &str = "__lamina_charge_returned";
/// The function that charges a value about to be written and returns it.
pub(super) const CHARGE_WRITTEN: &str = "__lamina_charge_written";
/// The function that charges a byte count.
pub(super) const CHARGE_LEN: &str = "__lamina_charge_len";
/// Templates may not use names with this prefix (they could shadow the
/// charging functions).
pub(super) const RESERVED_PREFIX: &str = "__lamina_";

/// Bytes one element of a list or map is charged (minijinja's value size),
/// and a written number or other scalar.
const VALUE_BYTES: u64 = 24;
/// How deep a written collection is measured; deeper levels count as one
/// value each.
const MEASURE_DEPTH: usize = 32;

thread_local! {
    /// Bytes left to the render running on this thread (`None`: none is).
    static LEFT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// The reason a render that ran out of bytes fails with.
pub(super) fn exhausted_reason(budget: u64) -> String {
    format!(
        "the chat template exceeded its memory budget ({budget} bytes of text and values \
         built or written) rendering this conversation"
    )
}

/// Marks the budget of the render running on this thread until dropped.
pub(super) struct Scope {
    budget: u64,
    outer: Option<u64>,
}

impl Scope {
    pub(super) fn enter(budget: u64) -> Scope {
        let outer = LEFT.with(|l| l.replace(Some(budget)));
        Scope { budget, outer }
    }

    /// Whether the render ran out of its budget.
    pub(super) fn exhausted(&self) -> bool {
        LEFT.with(|l| l.get()) == Some(0)
    }

    pub(super) fn budget(&self) -> u64 {
        self.budget
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        LEFT.with(|l| l.set(self.outer));
    }
}

/// Charges `bytes` to the running render.
fn charge_bytes(bytes: u64) -> Result<(), Error> {
    LEFT.with(|l| match l.get() {
        Some(left) if bytes > left => {
            l.set(Some(0));
            Err(Error::new(
                ErrorKind::InvalidOperation,
                "memory budget exhausted",
            ))
        }
        Some(left) => {
            l.set(Some(left - bytes));
            Ok(())
        }
        None => Ok(()),
    })
}

/// What is left of the running render's budget (`u64::MAX` outside one).
pub(super) fn left() -> u64 {
    LEFT.with(|l| l.get()).unwrap_or(u64::MAX)
}

/// `__lamina_charge_made(v)`: charges what `v` holds, returns `v`.
pub(super) fn charge_made(v: Value) -> Result<Value, Error> {
    charge_bytes(made_size(&v, true))?;
    Ok(v)
}

/// `__lamina_charge_returned(v)`: charges what `v` holds, lazy iterables
/// at nothing; returns `v`.
pub(super) fn charge_returned(v: Value) -> Result<Value, Error> {
    charge_bytes(made_size(&v, false))?;
    Ok(v)
}

/// `__lamina_charge_written(v)`: charges what writing `v` produces,
/// returns `v`.
pub(super) fn charge_written(v: Value) -> Result<Value, Error> {
    charge_bytes(written_size(&v, MEASURE_DEPTH))?;
    Ok(v)
}

/// `__lamina_charge_len(n)`: charges `n` bytes.
pub(super) fn charge_len(n: u64) -> Result<(), Error> {
    charge_bytes(n)
}

/// The bytes a new value holds: a string's length, a collection's
/// elements (which were charged when made). With `lazy`, a lazy sequence
/// that knows its length counts as built (minijinja concatenates lists
/// lazily, and materialises a deep chain at once); without, it holds
/// nothing.
fn made_size(v: &Value, lazy: bool) -> u64 {
    let elements = || (v.len().unwrap_or(0) as u64).saturating_mul(VALUE_BYTES);
    match v.kind() {
        ValueKind::String => v.as_str().map_or(0, |s| s.len() as u64),
        ValueKind::Bytes => v.as_bytes().map_or(0, |b| b.len() as u64),
        ValueKind::Seq | ValueKind::Map => elements(),
        ValueKind::Iterable if lazy => elements(),
        _ => 0,
    }
}

/// The bytes writing `v` produces, about: strings at their length, every
/// other scalar at [`VALUE_BYTES`], collections and iterables item by item
/// (`depth` levels down, then [`VALUE_BYTES`] an item).
fn written_size(v: &Value, depth: usize) -> u64 {
    match v.kind() {
        ValueKind::String | ValueKind::Bytes => made_size(v, false),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable => {
            let Ok(items) = v.try_iter() else {
                return VALUE_BYTES;
            };
            let is_map = v.kind() == ValueKind::Map;
            items.fold(0u64, |acc, k| {
                let item = if depth == 0 {
                    VALUE_BYTES
                } else if is_map {
                    let val = v.get_item(&k).map_or(0, |x| written_size(&x, depth - 1));
                    written_size(&k, depth - 1).saturating_add(val)
                } else {
                    written_size(&k, depth - 1)
                };
                acc.saturating_add(item)
            })
        }
        _ => VALUE_BYTES,
    }
}

/// The charge placed after `instr` when it pushes one newly made value.
fn after(instr: &Instruction) -> Option<&'static str> {
    match instr {
        Instruction::StringConcat
        | Instruction::Add
        | Instruction::Mul
        | Instruction::Slice
        | Instruction::BuildList(_)
        | Instruction::BuildMap(_)
        | Instruction::EndCapture => Some(CHARGE_MADE),
        Instruction::ApplyFilter(..)
        | Instruction::CallFunction(..)
        | Instruction::CallMethod(..)
        | Instruction::CallObject(_) => Some(CHARGE_RETURNED),
        _ => None,
    }
}

/// The charges placed before `instr`.
fn before<'s>(instr: &Instruction<'s>) -> Vec<Instruction<'s>> {
    match instr {
        Instruction::Emit => vec![Instruction::CallFunction(CHARGE_WRITTEN, Some(1))],
        Instruction::EmitRaw(s) => vec![
            Instruction::LoadConst(Value::from(s.len())),
            Instruction::CallFunction(CHARGE_LEN, Some(1)),
            Instruction::DiscardTop,
        ],
        _ => Vec::new(),
    }
}

/// `code` with the charges placed, jump targets remapped.
pub(super) fn rewrite<'s>(code: &Instructions<'s>) -> Instructions<'s> {
    let n = code.len();
    let at = |i: usize| code.get(i as u32);
    // where each old instruction's first charge (or itself) lands
    let mut start = Vec::with_capacity(n + 1);
    let mut pos: u32 = 0;
    for instr in (0..n).filter_map(at) {
        start.push(pos);
        pos += before(instr).len() as u32 + 1 + u32::from(after(instr).is_some());
    }
    start.push(pos);
    let map = |t: &u32| start.get(*t as usize).copied().unwrap_or(pos);
    let mut out = Instructions::new(code.name(), code.source());
    for (i, instr) in (0..n).filter_map(|i| at(i).map(|x| (i, x))) {
        let span = code.get_span(i as u32);
        let line = code.get_line(i as u32).unwrap_or(0) as u16;
        let mut push = |x: Instruction<'s>| match span {
            Some(s) => out.add_with_span(x, s),
            None => out.add_with_line(x, line),
        };
        for x in before(instr) {
            push(x);
        }
        let moved = match instr {
            Instruction::Jump(t) => Instruction::Jump(map(t)),
            Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(map(t)),
            Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(map(t)),
            Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(map(t)),
            Instruction::Iterate(t) => Instruction::Iterate(map(t)),
            Instruction::BuildMacro(name, t, flags) => {
                Instruction::BuildMacro(name, map(t), *flags)
            }
            other => other.clone(),
        };
        let charge = after(&moved);
        push(moved);
        if let Some(f) = charge {
            push(Instruction::CallFunction(f, Some(1)));
        }
    }
    out
}
