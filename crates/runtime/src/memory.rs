//! Host memory the process no longer uses, handed back.
//!
//! glibc's allocator keeps freed chunks in its arenas (one per thread that
//! allocated, up to eight a core) and lifts its mmap threshold after a large
//! free, so the host buffers of a model load (files read, weights converted,
//! staging for the upload) stay in the process after they are freed: loading
//! and unloading models raised the resident size by hundreds of MiB over the
//! first tens of cycles before it levelled off. [`tune_host_allocator`]
//! fixes the mmap threshold (blocks of 256 KiB and more mapped on their own
//! and unmapped when freed: a model's tensors go back to the system when it
//! unloads); smaller freed chunks stay in the arenas, where the next load
//! reuses them. A model server tunes at start. Trimming the arenas
//! (`malloc_trim`) around each load was tried: a lower resident size, but
//! the pages fault in again at the next load (slower reloads) and the
//! size then alternates with what the last load touched. Elsewhere (other
//! C libraries) tuning does nothing.

/// Sets the allocator up for loading and unloading models (module doc):
/// call it first thing (arenas already made are kept).
pub fn tune_host_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt sets the allocator's parameters under its own lock;
    // it touches no memory the program holds.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}
