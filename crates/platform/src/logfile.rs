//! A log file the service manager left on stderr, cut back to its tail while the daemon runs.
//!
//! launchd's `StandardErrorPath`: nothing else rotates it. Unix only (a Windows daemon's log
//! is the logon script's redirect, which this does not touch).

/// A log file the service manager opened for us (launchd's `StandardErrorPath`) grows without
/// end: nothing rotates it. Past this size it is cut down to its last [`LOG_KEEP`] bytes.
#[cfg(unix)]
pub const LOG_CAP: u64 = 16 << 20;
/// What a cut log keeps: its newest lines.
#[cfg(unix)]
pub const LOG_KEEP: u64 = 1 << 20;

/// Cuts the log on stderr back to its tail when it is a regular file over [`LOG_CAP`]
/// (nothing happens on a terminal, a pipe or the journal). Holds stderr's lock meanwhile, so
/// no log line is written halfway through the cut. Returns whether it cut.
#[cfg(unix)]
pub fn trim_stderr_log() -> std::io::Result<bool> {
    use std::os::fd::AsFd;
    let stderr = std::io::stderr();
    let _held = stderr.lock();
    let cut = trim_log(stderr.as_fd(), LOG_CAP, LOG_KEEP)?;
    if cut {
        // stdout, when it is the same file opened on its own, still points past the old end.
        let out = std::io::stdout();
        let _ = rustix::fs::seek(out.as_fd(), rustix::fs::SeekFrom::End(0));
    }
    Ok(cut)
}

/// Windows: the daemon's log is never a file a service manager left on stderr (the logon
/// start detaches it), so there is nothing to cut.
#[cfg(not(unix))]
pub fn trim_stderr_log() -> std::io::Result<bool> {
    Ok(false)
}

/// The cut itself, on any file: when `fd` is a regular file larger than `cap`, keeps its last
/// `keep` bytes from the start of a line, after one line saying what was cut. A service
/// manager opens the log write-only, so the tail is read through the file's path opened anew
/// (where the path cannot be found, the log is only emptied).
#[cfg(unix)]
pub fn trim_log(fd: std::os::fd::BorrowedFd<'_>, cap: u64, keep: u64) -> std::io::Result<bool> {
    let st = rustix::fs::fstat(fd)?;
    let regular =
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::RegularFile;
    let len = u64::try_from(st.st_size).unwrap_or(0);
    if !regular || len <= cap {
        return Ok(false);
    }
    let tail = fd_path(fd)
        .and_then(|p| read_tail(&p, len, keep).ok())
        .unwrap_or_default();
    let start = memchr::memchr(b'\n', &tail).map_or(tail.len(), |i| i + 1);
    let mut text = format!("[pi-ide-broker: log over {cap} bytes; older lines cut]\n").into_bytes();
    text.extend_from_slice(&tail[start..]);
    rustix::fs::ftruncate(fd, 0)?;
    rustix::fs::seek(fd, rustix::fs::SeekFrom::Start(0))?;
    let mut done = 0;
    while done < text.len() {
        done += rustix::io::write(fd, &text[done..])?;
    }
    Ok(true)
}

/// The last `keep` bytes of the `len` bytes of the file at `path`.
#[cfg(unix)]
fn read_tail(path: &std::path::Path, len: u64, keep: u64) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path)?;
    let from = len - keep.min(len);
    let mut tail = vec![0u8; usize::try_from(len - from).unwrap_or(0)];
    let mut got = 0;
    while got < tail.len() {
        match f.read_at(&mut tail[got..], from + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    tail.truncate(got);
    Ok(tail)
}

/// The path an open file descriptor names (Linux: `/proc/self/fd`; macOS: `F_GETPATH`).
#[cfg(unix)]
fn fd_path(fd: std::os::fd::BorrowedFd<'_>) -> Option<std::path::PathBuf> {
    #[cfg(target_vendor = "apple")]
    {
        use std::os::unix::ffi::OsStrExt;
        rustix::fs::getpath(fd)
            .ok()
            .map(|c| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(c.as_bytes())))
    }
    #[cfg(not(target_vendor = "apple"))]
    {
        use std::os::fd::AsRawFd;
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn a_log_over_its_cap_keeps_its_newest_whole_lines_and_goes_on_appending() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("broker.log");
        // Write-only, as launchd opens StandardErrorPath.
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        for i in 0..1000 {
            writeln!(f, "line {i:04} ..........").unwrap();
        }
        assert!(
            !trim_log(f.as_fd(), 1 << 20, 100).unwrap(),
            "under the cap: untouched"
        );
        assert!(trim_log(f.as_fd(), 1000, 100).unwrap());
        writeln!(f, "after the cut").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("older lines cut"), "{text}");
        assert_eq!(
            lines[1..lines.len() - 1].last(),
            Some(&"line 0999 ..........")
        );
        assert!(
            lines[1].starts_with("line 09"),
            "a whole line first: {text}"
        );
        assert_eq!(
            lines.last(),
            Some(&"after the cut"),
            "appends go on at the new end"
        );
        assert!(text.len() < 200, "{}", text.len());
    }

    #[test]
    fn a_non_regular_file_is_never_cut() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!trim_log(a.as_fd(), 0, 0).unwrap());
    }
}
