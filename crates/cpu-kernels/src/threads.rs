//! The one rayon pool the CPU kernels run on, sized to the physical cores.
//!
//! Contract: [`init_pool`] builds rayon's global pool with
//! [`physical_cores`] threads (SMT siblings share one core's vector units,
//! so a second thread per core only contends for them) unless
//! `RAYON_NUM_THREADS` is set or the pool already exists; call it before
//! the first parallel operation. [`init_pool_with`] takes an explicit
//! thread count instead (a `--threads` flag), which wins over both. [`physical_cores`] counts distinct
//! `thread_siblings_list` sets under `/sys/devices/system/cpu`, falling
//! back to the logical CPU count where that cannot be read.
//! Costs: a directory scan once; threads live for the process.

use std::collections::BTreeSet;

/// Physical cores of this machine (logical CPUs when unknown).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(dir) = std::fs::read_dir("/sys/devices/system/cpu") else {
        return logical;
    };
    let mut cores = BTreeSet::new();
    for e in dir.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("cpu") || !name[3..].chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(s) = std::fs::read_to_string(e.path().join("topology/thread_siblings_list")) {
            cores.insert(s.trim().to_string());
        }
    }
    // a process limited to fewer CPUs (affinity, cgroup) gets no more threads
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

/// Builds the global rayon pool on the physical cores (see the module doc);
/// returns the pool's thread count.
pub fn init_pool() -> usize {
    init_pool_with(None)
}

/// [`init_pool`] with `threads` threads when given (0 counts as not given).
pub fn init_pool_with(threads: Option<usize>) -> usize {
    let n = match threads.filter(|&n| n > 0) {
        Some(n) => Some(n),
        None if std::env::var_os("RAYON_NUM_THREADS").is_none() => Some(physical_cores()),
        None => None,
    };
    if let Some(n) = n {
        // an error means the pool already exists: keep it
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    rayon::current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_cores_is_between_one_and_the_logical_count() {
        let n = physical_cores();
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!(n >= 1 && n <= logical, "{n} of {logical}");
        assert!(init_pool() >= 1);
    }
}
