//! The allocator's thresholds, set once at start so large frames reuse memory.
//!
//! glibc's malloc serves a block of 128 KiB or more with a fresh `mmap` (a threshold it raises
//! as such blocks are freed, up to 32 MiB), and gives the top of its heap back to the kernel
//! once more than twice that threshold is free. A call carrying a 1 MiB file passes through
//! about four such blocks (the session's read buffer, the request frame, the editor link's read
//! buffer, the tail of the answer the agent's socket did not take at once), all freed when the
//! call is done. Every such call then faulted about 950 fresh pages in, and the faults took
//! about a third of the daemon's CPU for it (`cargo bench --bench broker -- --payload 1048576`
//! measures it).
//! Fixed thresholds keep freed blocks up to [`MMAP_THRESHOLD`] in the heap, and up to
//! [`TRIM_THRESHOLD`] of free heap mapped, for the next call.
//!
//! Other platforms' allocators (musl, macOS) keep their defaults: this is a no-op there.

/// Blocks below this come from the heap and are reused once freed; larger ones are mapped
/// afresh for each use (frames that large are rare: the default frame limit is 64 MiB).
pub const MMAP_THRESHOLD: usize = 8 << 20;

/// Free memory at the top of the heap kept mapped before any is given back: a few large calls
/// in flight at once, and no more. It is the most a burst of large frames leaves resident.
pub const TRIM_THRESHOLD: usize = 16 << 20;

/// Sets the thresholds for this process. Call it once, first thing in `main`.
pub fn keep_freed_frames() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: mallopt takes two plain integers and only changes malloc's own tunables; it is
    // called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int);
    }
}
