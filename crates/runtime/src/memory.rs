//! Host memory the process no longer uses, handed back.
//!
//! glibc's allocator keeps freed chunks in its arenas (one per thread that
//! allocated, up to eight a core) and lifts its mmap threshold after a large
//! free, so the host buffers of a model load (files read, weights converted,
//! staging for the upload) stay in the process after they are freed: loading
//! and unloading models raised the resident size by hundreds of MiB over the
//! first tens of cycles before it levelled off. [`trim_host_memory`] returns
//! the free pages of every arena to the system (`malloc_trim(0)`); a model
//! server calls it around each load. Elsewhere (other C libraries) it does
//! nothing. Costs: one walk of the arenas' free lists, milliseconds.

/// Returns the allocator's free memory to the operating system (module doc).
pub fn trim_host_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes each arena's lock and only releases pages of
    // chunks that are free; no memory the program holds is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}
