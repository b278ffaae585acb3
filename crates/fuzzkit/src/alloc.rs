//! [`LimitedAlloc`]: a global allocator for fuzz test binaries that records,
//! per thread, the largest allocation made while a limit is set
//! ([`largest_allocation`]), so a property can assert that memory stays
//! proportional to its input (a header claiming 2^60 items must fail before
//! allocating for them).
//!
//! Contract: allocation itself is the system allocator's; requests above
//! [`HARD_CAP`] while a limit is set return null (the process aborts with
//! the size and a backtrace, instead of paging the machine to death). Costs: two
//! thread-local reads per allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Above this a limited thread's request is refused outright.
pub const HARD_CAP: usize = 1 << 32;

thread_local! {
    static LIMITED: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// Install in a test binary with `#[global_allocator]`.
pub struct LimitedAlloc;

fn note(size: usize) -> bool {
    let limited = LIMITED.try_with(Cell::get).unwrap_or(false);
    if !limited {
        return true;
    }
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    if size > HARD_CAP {
        // unlimited while reporting (the report allocates)
        let _ = LIMITED.try_with(|l| l.set(false));
        eprintln!(
            "fuzzkit: refusing a {size}-byte allocation, made at:\n{}",
            std::backtrace::Backtrace::force_capture()
        );
        return false;
    }
    true
}

// SAFETY: every method forwards to `System` with the caller's layout
// unchanged (or returns null, which the GlobalAlloc contract allows).
unsafe impl GlobalAlloc for LimitedAlloc {
    /// # Safety
    /// As [`GlobalAlloc::alloc`]: the caller's contract is `System`'s.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    /// # Safety
    /// As [`GlobalAlloc::alloc_zeroed`]: the caller's contract is `System`'s.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !note(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as in `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    /// # Safety
    /// As [`GlobalAlloc::dealloc`]: the caller's contract is `System`'s.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (alloc above).
        unsafe { System.dealloc(ptr, layout) }
    }

    /// # Safety
    /// As [`GlobalAlloc::realloc`]: the caller's contract is `System`'s.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !note(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds
        // realloc's contract for `new_size`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Runs `f` on this thread and returns its result with the largest single
/// allocation it made on this thread (0 when [`LimitedAlloc`] is not the
/// global allocator).
pub fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(0));
    LIMITED.with(|l| l.set(true));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            LIMITED.with(|l| l.set(false));
        }
    }
    let reset = Reset;
    let r = f();
    drop(reset);
    (r, LARGEST.with(Cell::get))
}
