//! Process facts: is it running (a zombie is not), when did it start, and whose is it.
//!
//! What the broker needs to know about another process: is it running (not merely an
//! unreaped zombie), when did it start (so a recycled pid is not taken for the process
//! that wrote a lockfile), and which user runs it (a lockfile naming another user's process
//! is not the user's editor's). One interface, three sources:
//!
//! - [`Source::Procfs`] (Linux): `/proc/<pid>/stat`, its state letter and field 22;
//!   `/proc/<pid>/status`, its `Uid:` line.
//! - [`Source::Darwin`] (macOS): `proc_pidinfo(PROC_PIDTBSDINFO)`, `pbi_status`,
//!   `pbi_start_tvsec`/`pbi_start_tvusec` and `pbi_ruid`.
//! - [`Source::Signal`] (anywhere, and what the others fall back to): `kill(pid, 0)` only;
//!   a zombie counts as alive, and the start and the uid are unknown.
//!
//! `PI_IDE_BROKER_PROCESS_FACTS=procfs|darwin|signal` picks another source for the whole
//! process (read once): the tests run the identity and lockfile tests again with `signal`, so
//! the path a platform without the others takes runs on Linux too. A source the platform
//! lacks reads as knowing nothing, as `signal` does.
//!
//! A pid that exists but is not ours (`EPERM`) is alive, as pi-ide decides.

/// Where process facts are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Linux's `/proc`.
    Procfs,
    /// macOS's `proc_pidinfo`.
    Darwin,
    /// `kill(pid, 0)` alone.
    Signal,
    /// Windows: `OpenProcess`, `GetExitCodeProcess`, `GetProcessTimes`.
    Win32,
}

/// The environment variable that picks a [`Source`] other than the platform's own.
pub const SOURCE_ENV: &str = "PI_IDE_BROKER_PROCESS_FACTS";

impl Source {
    /// The best source this platform has.
    pub fn native() -> Source {
        if cfg!(target_os = "linux") {
            Source::Procfs
        } else if cfg!(target_vendor = "apple") {
            Source::Darwin
        } else if cfg!(windows) {
            Source::Win32
        } else {
            Source::Signal
        }
    }

    /// The source in force: [`SOURCE_ENV`]'s, else the platform's own (read once).
    pub fn current() -> Source {
        static CURRENT: std::sync::OnceLock<Source> = std::sync::OnceLock::new();
        *CURRENT.get_or_init(|| match std::env::var(SOURCE_ENV).as_deref() {
            Ok("procfs") => Source::Procfs,
            Ok("darwin") => Source::Darwin,
            Ok("signal") => Source::Signal,
            Ok("win32") => Source::Win32,
            _ => Source::native(),
        })
    }
}

/// A process as its source sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// It has exited but its parent has not reaped it yet.
    pub zombie: bool,
    /// When it started, in an opaque unit of its source: equal for the same process, and
    /// larger for a later one (Linux: clock ticks since boot; macOS: microseconds since the
    /// epoch). `None` where the source cannot tell.
    pub start: Option<u64>,
    /// When it started, in unix seconds, where known.
    pub start_unix: Option<i64>,
}

/// True if `pid` names a running process (ours or not), false if it is gone or a zombie.
pub fn alive(pid: u32) -> bool {
    running(pid).is_some()
}

/// A future that resolves when process `pid` exits (a pidfd of it, polled by tokio's reactor;
/// Linux 5.3+); `None` when no pidfd could be opened (the process is gone, or no such kernel).
/// It needs a running tokio runtime.
#[cfg(target_os = "linux")]
pub fn exit_of(pid: u32) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let p = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()?;
    let interest = tokio::io::Interest::READABLE;
    // SAFETY: `fd` is an open pidfd that the AsyncFd owns (and so keeps open) for its whole life.
    #[allow(unsafe_code)]
    let fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }.ok()?;
    Some(async move {
        let _ = fd.readable().await;
    })
}

/// What is known of `pid` when it is running (ours or not), read once; `None` when it is gone
/// or a zombie. The signal-only source knows only that it runs (no start time).
pub fn running(pid: u32) -> Option<Facts> {
    if !signal_alive(pid) {
        return None;
    }
    match facts(pid) {
        Some(f) if f.zombie => None,
        Some(f) => Some(f),
        None => Some(Facts {
            zombie: false,
            start: None,
            start_unix: None,
        }),
    }
}

/// The process's start token (see [`Facts::start`]).
pub fn start_token(pid: u32) -> Option<u64> {
    facts(pid)?.start
}

/// When the process started, in unix seconds.
pub fn start_unix(pid: u32) -> Option<i64> {
    facts(pid)?.start_unix
}

/// What the source in force knows of `pid`; `None` when it knows nothing (gone, or the
/// signal-only source).
pub fn facts(pid: u32) -> Option<Facts> {
    match Source::current() {
        Source::Procfs => procfs::facts(pid),
        Source::Darwin => darwin::facts(pid),
        Source::Win32 => win32::facts(pid),
        Source::Signal => None,
    }
}

/// The real uid of running process `pid`, from the source in force: `/proc/<pid>/status`'s
/// `Uid:` line (Linux), `pbi_ruid` of `proc_pidinfo` (macOS). `None` where the source cannot
/// tell: the signal-only source, Windows (a lockfile's owner SID is checked there instead),
/// a process gone meanwhile, or another user's process that `/proc` mounted with `hidepid`
/// hides (then what proves a lockfile is the check of its port's listener, `ports`).
pub fn real_uid(pid: u32) -> Option<u32> {
    match Source::current() {
        Source::Procfs => procfs::real_uid(pid),
        Source::Darwin => darwin::real_uid(pid),
        Source::Win32 | Source::Signal => None,
    }
}

/// The path this process's binary was started from, even once that file was replaced or
/// removed (Linux's `/proc/self/exe` then reads `<path> (deleted)`): where the binary
/// installed now is.
pub fn own_exe() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let installed = exe.to_str().and_then(|t| t.strip_suffix(" (deleted)"));
    match installed {
        Some(path) if cfg!(target_os = "linux") => Some(std::path::PathBuf::from(path)),
        _ => Some(exe),
    }
}

/// Our parent's pid, where the platform tells (`None` on Windows, where a parent may be gone
/// and its pid reused).
pub fn parent_id() -> Option<u32> {
    #[cfg(unix)]
    {
        Some(std::os::unix::process::parent_id())
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// `kill(pid, 0)`: the pid exists (`EPERM`: exists, not ours).
#[cfg(unix)]
fn signal_alive(pid: u32) -> bool {
    let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return false;
    };
    match rustix::process::test_kill_process(pid) {
        Ok(()) => true,
        Err(e) => e == rustix::io::Errno::PERM,
    }
}

/// Linux's `/proc`.
pub mod procfs {
    use super::Facts;

    /// Numeric field `field` of `/proc/<pid>/stat`, numbered as in proc(5) (22 is
    /// starttime); `None` when the process is gone or there is no `/proc`.
    pub fn stat_field(pid: u32, field: usize) -> Option<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        after_name(&stat)?
            .split_whitespace()
            .nth(field.checked_sub(3)?)?
            .parse()
            .ok()
    }

    /// The fields after the ")" that ends the command name (field 2), which may itself hold
    /// spaces and parentheses.
    fn after_name(stat: &str) -> Option<&str> {
        stat.rsplit_once(')').map(|(_, rest)| rest)
    }

    pub(super) fn facts(pid: u32) -> Option<Facts> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut fields = after_name(&stat)?.split_whitespace();
        // Field 3, the state: Z is a zombie, X dead (seen only in passing).
        let state = fields.next()?;
        let start = fields.nth(22 - 4).and_then(|s| s.parse::<u64>().ok());
        // USER_HZ is 100 on every Linux architecture Rust targets.
        let start_unix = start.and_then(|t| Some(boot_time()? + i64::try_from(t / 100).ok()?));
        Some(Facts {
            zombie: matches!(state, "Z" | "X"),
            start,
            start_unix,
        })
    }

    /// The real uid (the first of the four on the `Uid:` line) of `/proc/<pid>/status`.
    pub(super) fn real_uid(pid: u32) -> Option<u32> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        uid_in_status(&status)
    }

    /// The real uid of a `/proc/<pid>/status` text.
    pub(super) fn uid_in_status(status: &str) -> Option<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// When this machine booted, in unix seconds (`btime` of `/proc/stat`), read once.
    fn boot_time() -> Option<i64> {
        static BOOT: std::sync::OnceLock<Option<i64>> = std::sync::OnceLock::new();
        *BOOT.get_or_init(|| {
            std::fs::read_to_string("/proc/stat")
                .ok()?
                .lines()
                .find_map(|l| l.strip_prefix("btime "))?
                .trim()
                .parse()
                .ok()
        })
    }
}

/// The pid exists: `OpenProcess` opens it (access denied: it exists, not ours) and it has
/// not exited.
#[cfg(windows)]
fn signal_alive(pid: u32) -> bool {
    win32::exists(pid)
}

/// Windows' process API; elsewhere it knows nothing.
mod win32 {
    use super::Facts;

    #[cfg(windows)]
    #[allow(unsafe_code)]
    mod os {
        use super::Facts;
        use windows_sys::Win32::Foundation::{
            CloseHandle, GetLastError, ERROR_ACCESS_DENIED, FILETIME, STILL_ACTIVE,
        };
        use windows_sys::Win32::System::Threading::{
            GetExitCodeProcess, GetProcessTimes, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
        };

        /// 100 ns intervals between 1601-01-01 and 1970-01-01.
        const UNIX_EPOCH_AS_FILETIME: u64 = 116_444_736_000_000_000;

        /// Runs `f` on a query handle of `pid`; `Err(true)` when it exists but is not ours.
        fn with_process<T>(
            pid: u32,
            f: impl FnOnce(*mut std::ffi::c_void) -> T,
        ) -> Result<T, bool> {
            if pid == 0 {
                return Err(false);
            }
            // SAFETY: plain calls; the handle is checked, used by `f` only, and closed once.
            unsafe {
                let h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid);
                if h.is_null() {
                    return Err(GetLastError() == ERROR_ACCESS_DENIED);
                }
                let r = f(h);
                CloseHandle(h);
                Ok(r)
            }
        }

        pub fn exists(pid: u32) -> bool {
            let running = with_process(pid, |h| {
                let mut code = 0u32;
                // SAFETY: `h` is a valid query handle for the call's length.
                let ok = unsafe { GetExitCodeProcess(h, &mut code) };
                ok == 0 || code != STILL_ACTIVE as u32
            });
            match running {
                // "exited" is the inner bool's negation.
                Ok(exited) => !exited,
                Err(not_ours) => not_ours,
            }
        }

        pub fn facts(pid: u32) -> Option<Facts> {
            let created = with_process(pid, |h| {
                let zero = FILETIME {
                    dwLowDateTime: 0,
                    dwHighDateTime: 0,
                };
                let (mut c, mut e, mut k, mut u) = (zero, zero, zero, zero);
                // SAFETY: `h` is a valid query handle; the four FILETIMEs are writable.
                let ok = unsafe { GetProcessTimes(h, &mut c, &mut e, &mut k, &mut u) };
                (ok != 0).then(|| (u64::from(c.dwHighDateTime) << 32) | u64::from(c.dwLowDateTime))
            })
            .ok()??;
            let unix = created.checked_sub(UNIX_EPOCH_AS_FILETIME)? / 10_000_000;
            Some(Facts {
                zombie: false,
                start: Some(created),
                start_unix: i64::try_from(unix).ok(),
            })
        }
    }

    #[cfg(windows)]
    pub(super) use os::{exists, facts};

    #[cfg(not(windows))]
    pub(super) fn facts(_pid: u32) -> Option<Facts> {
        None
    }
}

/// macOS's `proc_pidinfo`; elsewhere it knows nothing.
mod darwin {
    use super::Facts;

    /// `PROC_PIDTBSDINFO` of `pid`: its BSD process record.
    #[cfg(target_vendor = "apple")]
    #[allow(unsafe_code)]
    fn bsd_info(pid: u32) -> Option<libc::proc_bsdinfo> {
        let pid = libc::c_int::try_from(pid).ok()?;
        let mut info = std::mem::MaybeUninit::<libc::proc_bsdinfo>::zeroed();
        let size = libc::c_int::try_from(std::mem::size_of::<libc::proc_bsdinfo>()).ok()?;
        // SAFETY: `info` is a writable buffer of exactly `size` bytes for the struct that
        // PROC_PIDTBSDINFO fills; proc_pidinfo writes at most `size` bytes and returns how
        // many it wrote (or <= 0 on failure, when `info` is not read).
        let wrote = unsafe {
            libc::proc_pidinfo(
                pid,
                libc::PROC_PIDTBSDINFO,
                0,
                info.as_mut_ptr().cast(),
                size,
            )
        };
        if wrote != size {
            return None;
        }
        // SAFETY: proc_pidinfo filled the whole struct (checked just above), and every field
        // of it is plain integers, valid for any bit pattern (it was zeroed first anyway).
        Some(unsafe { info.assume_init() })
    }

    #[cfg(target_vendor = "apple")]
    pub(super) fn facts(pid: u32) -> Option<Facts> {
        let info = bsd_info(pid)?;
        let start = info
            .pbi_start_tvsec
            .checked_mul(1_000_000)?
            .checked_add(info.pbi_start_tvusec)?;
        Some(Facts {
            zombie: info.pbi_status == libc::SZOMB,
            start: Some(start),
            start_unix: i64::try_from(info.pbi_start_tvsec).ok(),
        })
    }

    /// Its real uid (`pbi_ruid`).
    #[cfg(target_vendor = "apple")]
    pub(super) fn real_uid(pid: u32) -> Option<u32> {
        bsd_info(pid).map(|info| info.pbi_ruid)
    }

    #[cfg(not(target_vendor = "apple"))]
    pub(super) fn facts(_pid: u32) -> Option<Facts> {
        None
    }

    #[cfg(not(target_vendor = "apple"))]
    pub(super) fn real_uid(_pid: u32) -> Option<u32> {
        None
    }
}

/// Processes of another uid, for the tests: uid and gid 65534 (`nobody`) through `setpriv`
/// (util-linux), which only root may do. Where that cannot be, the test says `SKIPPED: why`
/// and returns (a failure under `PI_IDE_BROKER_REQUIRE_ALL=1`, as in the integration suite).
#[cfg(all(any(test, feature = "testkit"), target_os = "linux"))]
pub mod other_uid {
    use std::io::BufRead;

    /// The uid (and gid) the children run as.
    pub const NOBODY: u32 = 65534;

    /// A child running as [`NOBODY`], killed and reaped when dropped.
    pub struct Child {
        child: std::process::Child,
        /// What it printed first: only once it runs as [`NOBODY`] (`setpriv` drops the ids
        /// before it runs the program).
        pub first_line: String,
        /// The rest of its output (held, so that its writes never meet a closed pipe).
        stdout: std::io::BufReader<std::process::ChildStdout>,
    }

    impl Child {
        /// Its pid.
        pub fn pid(&self) -> u32 {
            self.child.id()
        }

        /// The next line it prints (blocking until it does), trimmed; `None` once it ends.
        pub fn next_line(&mut self) -> Option<String> {
            let mut line = String::new();
            match self.stdout.read_line(&mut line) {
                Ok(n) if n > 0 => Some(line.trim().to_string()),
                _ => None,
            }
        }
    }

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// `test` cannot run here, for want of `what`.
    pub fn cannot_run(test: &str, what: &str) {
        let msg = format!("{test}: needs {what}");
        if std::env::var("PI_IDE_BROKER_REQUIRE_ALL").is_ok_and(|v| v == "1") {
            panic!("{msg} (PI_IDE_BROKER_REQUIRE_ALL=1: nothing may be skipped)");
        }
        // Past the harness's capture, so a skip never passes unsaid.
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "SKIPPED: {msg}");
    }

    /// A Python 3 that any uid may run (not one under root's home), if there is one.
    pub fn python3() -> Option<&'static str> {
        ["/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
    }

    /// Runs `program args` as [`NOBODY`] and waits for the first line it prints; `None`
    /// (the test said to be skipped) when we are not root or `setpriv` is missing.
    pub fn spawn(test: &str, program: &str, args: &[&str]) -> Option<Child> {
        if !rustix::process::getuid().is_root() {
            cannot_run(test, "root, to run a process as uid 65534");
            return None;
        }
        let spawned = std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", program])
            .args(args)
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                cannot_run(test, &format!("setpriv (util-linux): {e}"));
                return None;
            }
        };
        let mut stdout = std::io::BufReader::new(child.stdout.take()?);
        let mut first_line = String::new();
        let read = stdout.read_line(&mut first_line);
        let mut c = Child {
            child,
            first_line: first_line.trim().to_string(),
            stdout,
        };
        assert!(
            read.is_ok_and(|n| n > 0),
            "{program} as uid 65534 printed nothing: {:?}",
            c.child.try_wait()
        );
        Some(c)
    }

    /// A process of [`NOBODY`] that runs until dropped.
    pub fn sleeper(test: &str) -> Option<Child> {
        spawn(test, "/bin/sh", &["-c", "echo up; exec sleep 600"])
    }

    /// A listener of [`NOBODY`] on 127.0.0.1 (a free port), accepting nothing: its port.
    pub fn listener(test: &str) -> Option<(Child, u16)> {
        let Some(python) = python3() else {
            cannot_run(test, "python3 in /usr/bin, for a listener of another uid");
            return None;
        };
        let script = "import socket, signal\n\
            l = socket.socket()\n\
            l.bind(('127.0.0.1', 0))\n\
            l.listen(8)\n\
            print(l.getsockname()[1], flush=True)\n\
            signal.pause()\n";
        let child = spawn(test, python, &["-c", script])?;
        let port = child.first_line.parse().expect("the listener's port");
        Some((child, port))
    }

    /// A listener of [`NOBODY`] on 127.0.0.1 (a free port) that accepts one connection,
    /// closes itself (printing `accepted`), then reads that connection to its end and prints
    /// `received <hex of every byte>`: its port.
    pub fn accept_once(test: &str) -> Option<(Child, u16)> {
        let Some(python) = python3() else {
            cannot_run(test, "python3 in /usr/bin, for a listener of another uid");
            return None;
        };
        let script = "import socket\n\
            l = socket.socket()\n\
            l.bind(('127.0.0.1', 0))\n\
            l.listen(8)\n\
            print(l.getsockname()[1], flush=True)\n\
            c, _ = l.accept()\n\
            l.close()\n\
            print('accepted', flush=True)\n\
            data = b''\n\
            while True:\n\
            \x20   d = c.recv(65536)\n\
            \x20   if not d:\n\
            \x20       break\n\
            \x20   data += d\n\
            print('received', data.hex(), flush=True)\n";
        let child = spawn(test, python, &["-c", script])?;
        let port = child.first_line.parse().expect("the listener's port");
        Some((child, port))
    }
}

/// Runs the test modules named (test-name filters) again, in a child of the running test
/// binary, with the signal-only source: what a platform without `/proc` or `proc_pidinfo`
/// runs. Panics, with the child's output, unless each passes with at least one test. Returns
/// at once inside such a child.
#[cfg(any(test, feature = "testkit"))]
pub fn rerun_with_signal_only_facts(modules: &[&str]) {
    if std::env::var(SOURCE_ENV).is_ok() {
        return; // already the child
    }
    for module in modules {
        let exe = std::env::current_exe().expect("the test binary's path");
        let out = std::process::Command::new(exe)
            .args([module, "--test-threads", "2"])
            .env(SOURCE_ENV, "signal")
            .output()
            .expect("the test binary runs again");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{module} with signal-only facts:\n{text}"
        );
        let passed = text
            .lines()
            .find_map(|l| l.strip_prefix("test result: ok. "))
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<u32>().ok());
        assert!(
            passed.is_some_and(|n| n > 0),
            "{module} ran no test:\n{text}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The platform's own source, whatever the environment picked.
    #[cfg(unix)]
    fn native_facts(pid: u32) -> Option<Facts> {
        match Source::native() {
            Source::Procfs => procfs::facts(pid),
            Source::Darwin => darwin::facts(pid),
            Source::Win32 => win32::facts(pid),
            Source::Signal => None,
        }
    }

    /// A child that has exited and that nobody has reaped yet: a zombie until dropped.
    #[cfg(unix)]
    struct Zombie(std::process::Child);

    #[cfg(unix)]
    impl Zombie {
        fn new() -> Zombie {
            let child = std::process::Command::new("true").spawn().unwrap();
            let pid = child.id();
            // Wait, without reaping, until it has exited and its source says so.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while native_facts(pid).is_some_and(|f| !f.zombie) {
                assert!(std::time::Instant::now() < deadline, "child never exited");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Zombie(child)
        }
    }

    #[cfg(unix)]
    impl Drop for Zombie {
        fn drop(&mut self) {
            let _ = self.0.wait();
        }
    }

    #[cfg(any(target_os = "linux", target_vendor = "apple"))]
    #[test]
    fn an_unreaped_exited_process_is_dead_and_a_later_one_starts_later() {
        let me = std::process::id();
        let mine = native_facts(me).unwrap();
        assert!(!mine.zombie);
        assert!(mine.start.is_some() && mine.start_unix.is_some());
        let z = Zombie::new();
        let pid = z.0.id();
        assert!(signal_alive(pid), "kill(pid, 0) still succeeds on a zombie");
        let theirs = native_facts(pid).unwrap();
        assert!(theirs.zombie);
        assert!(mine.start <= theirs.start, "a later process starts later");
        // The contract of `alive`: dead where the source can tell (the signal-only source
        // cannot: its known weakness, which the child run of these tests pins down).
        assert_eq!(alive(pid), Source::current() == Source::Signal);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_stat_fields_are_numbered_as_in_proc5() {
        let me = std::process::id();
        assert_eq!(procfs::stat_field(me, 22), procfs::facts(me).unwrap().start);
        // Field 4 is the parent's pid; fields 1 and 2 (pid, name) are not numeric fields here.
        assert_eq!(
            procfs::stat_field(me, 4),
            Some(u64::from(std::os::unix::process::parent_id()))
        );
        assert_eq!(procfs::stat_field(me, 2), None);
    }

    /// `Uid:` of `/proc/<pid>/status` holds the real, effective, saved and file-system uids:
    /// the first is the real one.
    #[test]
    fn the_real_uid_is_the_first_on_the_status_uid_line() {
        let status = "Name:\tsu\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
        assert_eq!(procfs::uid_in_status(status), Some(1000));
        assert_eq!(procfs::uid_in_status("Name:\tx\n"), None);
        assert_eq!(procfs::uid_in_status("Uid:\tx\t0\n"), None);
    }

    /// Ours is ours; a process of uid 65534 is 65534's, where the source can tell (the
    /// signal-only source cannot: `None`).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_process_of_another_uid_is_told_from_ours() {
        let known = Source::current() == Source::native() && Source::current() != Source::Signal;
        let me = crate::user::uid();
        assert_eq!(real_uid(std::process::id()), known.then_some(me));
        assert_eq!(real_uid(u32::MAX), None);
        let Some(nobody) = other_uid::sleeper("a_process_of_another_uid_is_told_from_ours") else {
            return;
        };
        assert_eq!(real_uid(nobody.pid()), known.then_some(other_uid::NOBODY));
    }

    #[test]
    fn gone_pids_are_dead_and_ours_is_alive() {
        assert!(alive(std::process::id()));
        assert!(!alive(0));
        assert!(!alive(u32::MAX));
    }

    #[test]
    fn the_source_in_force_follows_the_environment() {
        let want = match std::env::var(SOURCE_ENV).as_deref() {
            Ok("signal") => Source::Signal,
            Ok("procfs") => Source::Procfs,
            Ok("darwin") => Source::Darwin,
            _ => Source::native(),
        };
        assert_eq!(Source::current(), want);
        let known = facts(std::process::id()).is_some();
        assert_eq!(known, want != Source::Signal && want == Source::native());
        assert_eq!(
            darwin::facts(std::process::id()).is_some(),
            cfg!(target_vendor = "apple")
        );
    }

    /// This module's tests again, in a child of this test binary, with the signal-only source
    /// (the daemon's crate does the same for its identity and lockfile tests).
    #[cfg(unix)] // POSIX paths, FIFOs or child processes
    #[test]
    fn process_tests_pass_with_signal_only_process_facts() {
        super::rerun_with_signal_only_facts(&["process::"]);
    }
}
