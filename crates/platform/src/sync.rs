//! The one lock helper: every std mutex in the crate is taken through it.
//!
//! The bottom layer's one lock helper: every std mutex in the crate is taken through it.

use std::sync::{Mutex, MutexGuard};

/// Locks a std mutex, recovering from poisoning (no invariant in this crate spans a panic
/// while a lock is held). Never hold the guard across an `.await`.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
