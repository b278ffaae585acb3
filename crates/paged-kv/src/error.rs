//! Errors of the KV bookkeeping. Every variant names the sequence, field or
//! value at fault; running out of blocks is an ordinary error the scheduler
//! acts on (queue or preempt), never a panic.

use crate::SeqId;

/// What went wrong in a [`crate::KvManager`] call. A failed call changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The operation needs `needed` allocatable blocks but only `free` are
    /// (free plus cached-evictable).
    #[error("out of KV blocks: {needed} needed, {free} allocatable")]
    OutOfBlocks { needed: usize, free: usize },
    /// No sequence with this id is held.
    #[error("unknown sequence {0}")]
    UnknownSeq(SeqId),
    /// A sequence with this id is already held.
    #[error("sequence {0} already exists")]
    SeqExists(SeqId),
    /// `mark_computed` was given more tokens than the sequence holds.
    #[error("sequence {seq}: cannot mark {computed} tokens computed, it holds only {len}")]
    ComputedBeyondLength {
        seq: SeqId,
        computed: usize,
        len: usize,
    },
    /// `set_token` was given a position that is computed (its block may be
    /// cached under its tokens' hash) or past the sequence.
    #[error(
        "sequence {seq}: position {pos} cannot be rewritten ({computed} of {len} tokens computed)"
    )]
    NotRewritable {
        seq: SeqId,
        pos: usize,
        computed: usize,
        len: usize,
    },
    /// `truncate` was given a length below the computed tokens (their
    /// blocks may be cached) or past the sequence.
    #[error("sequence {seq}: cannot truncate to {len} tokens ({computed} computed, {held} held)")]
    NotTruncatable {
        seq: SeqId,
        len: usize,
        computed: usize,
        held: usize,
    },
    /// The pool configuration is unusable; `field` names the [`crate::KvConfig`] field.
    #[error("invalid KV config: {field} = {value}: {reason}")]
    InvalidConfig {
        field: &'static str,
        value: usize,
        reason: &'static str,
    },
    /// [`crate::KvManager::check_invariants`] found a broken invariant (a bug here).
    #[error("KV invariant violated: {0}")]
    InvariantViolated(String),
}
