//! The daemon's open-files limit, raised to the hard limit at start.
//!
//! A flood of connections then runs into the broker's own budgets (`registry::limits`) long
//! before `accept` runs out of descriptors.

/// The soft open-files limit after raising it to the hard one (capped at [`CEILING`]), or the
/// limit as it was when it cannot be raised; `None` where the platform has no such limit.
pub fn raise_open_files() -> Option<u64> {
    #[cfg(unix)]
    {
        use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
        let now = getrlimit(Resource::Nofile);
        let soft = now.current.unwrap_or(CEILING);
        let want = now.maximum.unwrap_or(CEILING).min(CEILING);
        if want > soft {
            let raised = Rlimit {
                current: Some(want),
                maximum: now.maximum,
            };
            if setrlimit(Resource::Nofile, raised).is_ok() {
                return Some(want);
            }
        }
        Some(soft)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The soft open-files limit now; `None` where the platform has none.
pub fn open_files() -> Option<u64> {
    #[cfg(unix)]
    {
        rustix::process::getrlimit(rustix::process::Resource::Nofile).current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// The most the broker raises its soft limit to: macOS refuses more than `OPEN_MAX` for an
/// unlimited hard limit, and `select`-era code has no place here anyway.
#[cfg(unix)]
pub const CEILING: u64 = 1 << 20;

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let before = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        let now = raise_open_files().expect("unix has a limit");
        assert_eq!(Some(now), open_files());
        let hard = before.maximum.unwrap_or(CEILING).min(CEILING);
        assert!(
            now >= before.current.unwrap_or(0).min(hard),
            "{now} {before:?}"
        );
        assert_eq!(now, hard.max(before.current.unwrap_or(0).min(CEILING)));
    }
}
