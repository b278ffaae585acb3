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
//! unloads); [`trim_host_memory`] returns the
//! free pages of every arena to the system (`malloc_trim(0)`). A model
//! server tunes at start and trims around each load. Elsewhere (other C
//! libraries) both do nothing. Costs: trimming walks the arenas' free
//! lists, milliseconds.

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

/// Returns the allocator's free memory to the operating system (module doc).
pub fn trim_host_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes each arena's lock and only releases pages of
    // chunks that are free; no memory the program holds is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}
