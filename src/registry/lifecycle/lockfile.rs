//! Reading and validating one editor lockfile (`<port>.lock`): the lifecycle's second step.
//!
//! Everything in it is hostile until proven otherwise: see docs/security.md. What it yields
//! is the editor layer's `Lockfile`; what it refuses, the editor layer's `Error` (the reason
//! `status` shows).

use crate::editor::lockfile::{check_port, Lockfile, MAX_LOCKFILE_BYTES};
use crate::editor::Error;
use crate::protocol::family::Family;
use crate::sys::secret::Token;
use serde::Deserialize;
use std::io::Read;
use std::path::Path;

/// The JSON shape, liberal where the real writers differ.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    pid: serde_json::Value,
    #[serde(default)]
    workspace_folders: Option<Vec<String>>,
    #[serde(default)]
    ide_name: Option<String>,
    #[serde(default)]
    transport: Option<String>,
    #[serde(default)]
    auth_token: serde_json::Value,
    /// Claude Code's IDE extensions on Windows write `true`.
    #[serde(default)]
    running_in_windows: bool,
    /// Present only in the broker's own virtual lockfiles (compat door): never an editor.
    #[serde(default, rename = "piIdeBroker")]
    broker_marker: Option<serde::de::IgnoredAny>,
}

/// The port a lockfile name announces, or why it does not.
pub fn port_from_name(path: &Path) -> Result<u16, Error> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or(Error::NotALockfile)?;
    if name.contains(".lock.tmp.") {
        return Err(Error::NotALockfile);
    }
    let stem = name.strip_suffix(".lock").ok_or(Error::NotALockfile)?;
    match stem.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) && !stem.starts_with('+') => {
            u16::try_from(p).map_err(|_| Error::BadPort)
        }
        _ => Err(Error::BadPort),
    }
}

/// Reads and validates `path` (in a dir of `family`). Never follows a symlink, never blocks
/// on a FIFO, never reads more than [`MAX_LOCKFILE_BYTES`].
///
/// What proves it the user's editor's, each refused with its own [`Error`]: the file is ours
/// and only we may write it (Unix: no group or other write bit); its pid runs, as us (where
/// the platform tells whose a process is: [`crate::platform::process::real_uid`]), and
/// started before the file was written; no other user listens on its port
/// ([`check_port`]). A Windows editor seen from WSL (`runningInWindows`) has neither a pid
/// nor a port we can look up: its link's health is what tells.
pub(crate) fn read(path: &Path, family: Family) -> Result<Lockfile, Error> {
    let port = port_from_name(path)?;
    use crate::platform::Error as OpenError;
    let own = crate::platform::user::open_own_regular(path).map_err(|e| match e {
        OpenError::Symlink => Error::Symlink,
        OpenError::Gone => Error::Gone,
        OpenError::NotRegular => Error::NotRegular,
        OpenError::ForeignOwner(uid) => Error::ForeignOwner(uid),
        OpenError::Io(e) => Error::Io(e),
        other => Error::Io(std::io::Error::other(other.to_string())),
    })?;
    // Writable by others: refused. Writable by its group: refused unless that group is the
    // user's own primary group (`umask 002` systems give each user a group of their own, and
    // Node writes editors' lockfiles 0664 there).
    let open_to = if own.group_is_ours { 0o002 } else { 0o022 };
    if let Some(mode) = own.mode.filter(|m| m & open_to != 0) {
        return Err(Error::OthersMayWrite {
            mode,
            path: path.to_path_buf(),
        });
    }
    let size = own.size;
    if size > MAX_LOCKFILE_BYTES {
        return Err(Error::TooLarge(size));
    }
    // Sized to the file, so a lockfile is read in one call.
    let mut text = String::with_capacity(usize::try_from(size).unwrap_or(0) + 1);
    own.file
        .take(MAX_LOCKFILE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidData => Error::Malformed("not UTF-8".into()),
            _ => Error::Io(e),
        })?;
    if text.len() as u64 > MAX_LOCKFILE_BYTES {
        return Err(Error::TooLarge(text.len() as u64));
    }
    let lock = parse(&text, path, family, port)?;
    if lock.wsl.is_some() {
        // A Windows pid: not ours to look up from here. The link's health check is what
        // tells a live editor from a stale file; the file is never removed from this side.
        return Ok(lock);
    }
    let Some(process) = crate::platform::process::running(lock.pid) else {
        return Err(Error::DeadPid(lock.pid));
    };
    // Where the platform cannot tell whose it is (signal-only facts, Windows, a `hidepid`
    // /proc), the pid goes unchecked, as before this check: the port's check still holds.
    if let Some(uid) = crate::platform::process::real_uid(lock.pid)
        .filter(|uid| *uid != crate::platform::user::uid())
    {
        return Err(Error::ForeignPid { pid: lock.pid, uid });
    }
    let written = own.modified_unix;
    if process
        .start_unix
        .is_some_and(|started| started > written + 1)
    {
        return Err(Error::RecycledPid(lock.pid));
    }
    check_port(&lock, None)?;
    Ok(lock)
}

/// Parses lockfile text (no file-system checks, no pid check).
pub fn parse(text: &str, path: &Path, family: Family, port: u16) -> Result<Lockfile, Error> {
    if text.trim().is_empty() {
        return Err(Error::Incomplete);
    }
    let raw: Raw = serde_json::from_str(text).map_err(|e| {
        if e.is_eof() {
            Error::Incomplete
        } else {
            Error::Malformed(e.to_string())
        }
    })?;
    if raw.broker_marker.is_some() {
        // A broker's compat entry (ours or another's): dialling it would loop back to a broker.
        return Err(Error::NotALockfile);
    }
    let pid = pid_of(&raw.pid)
        .ok_or_else(|| Error::Malformed("\"pid\" must be a positive integer".into()))?;
    let auth_token = match raw.auth_token {
        serde_json::Value::Null => None,
        serde_json::Value::String(s) if (10..=500).contains(&s.len()) => Some(Token::new(s)),
        serde_json::Value::String(_) => {
            return Err(Error::Malformed(
                "\"authToken\" must be 10..500 chars".into(),
            ))
        }
        _ => return Err(Error::Malformed("\"authToken\" must be a string".into())),
    };
    if let Some(t) = raw.transport.as_deref() {
        if t != "ws" {
            return Err(Error::Malformed(format!(
                "transport {t:?} is not supported (only \"ws\")"
            )));
        }
    }
    let mut workspace_folders = raw.workspace_folders.unwrap_or_default();
    if workspace_folders.len() > 1024 {
        return Err(Error::Malformed("more than 1024 workspaceFolders".into()));
    }
    // A Windows editor seen from WSL: its folders as this side sees them (one WSL cannot
    // reach, another machine's share, stays as written and matches no cwd here).
    let wsl = (raw.running_in_windows && !cfg!(windows)).then(|| crate::sys::wsl::here().clone());
    if let Some(w) = &wsl {
        for f in &mut workspace_folders {
            if let Some(mapped) = w.to_linux(f) {
                *f = mapped;
            }
        }
    }
    Ok(Lockfile {
        path: path.to_path_buf(),
        family,
        port,
        pid,
        workspace_folders,
        ide_name: raw.ide_name.unwrap_or_else(|| "unknown".into()),
        auth_token,
        wsl,
    })
}

/// A lockfile's `"pid"`: a positive integer that names a process (it fits `pid_t`).
pub(crate) fn pid_of(v: &serde_json::Value) -> Option<u32> {
    v.as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0 && i32::try_from(*p).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn p(name: &str) -> PathBuf {
        PathBuf::from("/x").join(name)
    }

    #[test]
    fn port_comes_from_the_name() {
        assert_eq!(port_from_name(&p("12345.lock")).unwrap(), 12345);
        for bad in ["0.lock", "70000.lock", "abc.lock", "+80.lock"] {
            assert!(
                matches!(port_from_name(&p(bad)), Err(Error::BadPort)),
                "{bad}"
            );
        }
        for other in ["80.txt", "80.lock.tmp.1.2"] {
            assert!(
                matches!(port_from_name(&p(other)), Err(Error::NotALockfile)),
                "{other}"
            );
        }
    }

    #[test]
    fn parses_both_writers() {
        let me = std::process::id();
        let pi = format!(
            r#"{{"pid":{me},"workspaceFolders":["/a"],"ideName":"Neovim","transport":"ws","authToken":"0123456789abcdef"}}"#
        );
        let l = parse(&pi, &p("1.lock"), Family::Pi, 1).unwrap();
        assert_eq!(l.workspace_folders, vec!["/a".to_string()]);
        assert_eq!(l.ide_name, "Neovim");
        let minimal = format!(r#"{{"pid":{me},"authToken":"0123456789abcdef"}}"#);
        let l = parse(&minimal, &p("1.lock"), Family::Claude, 1).unwrap();
        assert_eq!(l.ide_name, "unknown");
        assert!(l.workspace_folders.is_empty());
        assert!(l
            .auth_token
            .is_some_and(|t| t.expose() == "0123456789abcdef"));
    }

    #[test]
    fn an_emacs_lockfile_without_a_token_is_accepted_as_tokenless() {
        // claude-code-ide.el's shape (manzaltu/claude-code-ide.el at 1de17bb).
        let me = std::process::id();
        let emacs = format!(
            r#"{{"pid":{me},"workspaceFolders":["/home/u/proj"],"ideName":"Emacs","transport":"ws"}}"#
        );
        let l = parse(&emacs, &p("1.lock"), Family::Claude, 1).unwrap();
        assert_eq!(l.ide_name, "Emacs");
        assert_eq!(l.workspace_folders, vec!["/home/u/proj".to_string()]);
        assert!(l.auth_token.is_none());
        let null = format!(r#"{{"pid":{me},"authToken":null}}"#);
        assert!(parse(&null, &p("1.lock"), Family::Claude, 1)
            .unwrap()
            .auth_token
            .is_none());
    }

    #[test]
    fn rejects_bad_shapes() {
        for bad in [
            r#"{"pid":"12","authToken":"0123456789abcdef"}"#,
            r#"{"pid":-1,"authToken":"0123456789abcdef"}"#,
            r#"{"pid":0,"authToken":"0123456789abcdef"}"#,
            r#"{"pid":2147483648,"authToken":"0123456789abcdef"}"#,
            r#"{"pid":1.5,"authToken":"0123456789abcdef"}"#,
            r#"{"pid":12,"authToken":5}"#,
            r#"{"pid":12,"authToken":"short"}"#,
            r#"{"pid":12,"authToken":""}"#,
            r#"{"pid":12,"authToken":["0123456789abcdef"]}"#,
            r#"{"pid":12,"authToken":"0123456789abcdef","workspaceFolders":"/a"}"#,
            r#"{"pid":12,"authToken":"0123456789abcdef","transport":"sse"}"#,
            r#"[1,2,3]"#,
            r#"not json"#,
        ] {
            let e = parse(bad, &p("1.lock"), Family::Pi, 1).unwrap_err();
            assert!(matches!(e, Error::Malformed(_)), "{bad}: {e:?}");
        }
        // A token of the wrong length is told apart from one of the wrong type.
        let short = parse(
            r#"{"pid":12,"authToken":"short"}"#,
            &p("1.lock"),
            Family::Pi,
            1,
        );
        assert!(
            matches!(&short, Err(Error::Malformed(m)) if m.contains("10..500")),
            "{short:?}"
        );
        for half in ["", "  \n", r#"{"pid":12,"auth"#] {
            let e = parse(half, &p("1.lock"), Family::Pi, 1).unwrap_err();
            assert!(e.is_transient(), "{half}: {e:?}");
        }
    }

    #[test]
    fn a_brokers_own_virtual_lockfile_is_not_an_editor() {
        let me = std::process::id();
        let text = format!(
            r#"{{"pid":{me},"authToken":"0123456789abcdef","piIdeBroker":{{"editor":"x"}}}}"#
        );
        assert!(matches!(
            parse(&text, &p("1.lock"), Family::Pi, 1),
            Err(Error::NotALockfile)
        ));
    }

    #[test]
    fn malformed_errors_never_echo_the_token() {
        let text = r#"{"pid":"x","authToken":"TOPSECRET-TOKEN-123"}"#;
        let e = parse(text, &p("1.lock"), Family::Pi, 1).unwrap_err();
        assert!(!e.to_string().contains("TOPSECRET"));
    }

    #[cfg(unix)] // POSIX paths, FIFOs or child processes
    #[test]
    fn a_recycled_pid_is_recognised() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("4242.lock");
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        std::fs::write(
            &path,
            format!(r#"{{"pid":{},"authToken":"0123456789abcdef"}}"#, child.id()),
        )
        .unwrap();
        // Written an hour before the process started: its pid was recycled.
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(hour_ago)
            .unwrap();
        let r = read(&path, Family::Pi);
        child.kill().unwrap();
        let _ = child.wait();
        if crate::platform::process::start_unix(std::process::id()).is_some() {
            assert!(matches!(r, Err(Error::RecycledPid(_))), "{r:?}");
        } else {
            // Without start times (the signal-only process facts) it cannot be told.
            assert!(r.is_ok(), "{r:?}");
        }
        // The same file written after the process started is fine.
        let me = std::process::id();
        std::fs::write(
            &path,
            format!(r#"{{"pid":{me},"authToken":"0123456789abcdef"}}"#),
        )
        .unwrap();
        let lock = read(&path, Family::Pi).expect("a fresh lockfile of a live process");
        assert_eq!((lock.pid, lock.family), (me, Family::Pi));
        assert_eq!(lock.path, path);
    }

    #[test]
    fn pid_liveness() {
        assert!(crate::platform::process::alive(std::process::id()));
        assert!(!crate::platform::process::alive(0));
        assert!(!crate::platform::process::alive(u32::MAX));
    }

    /// A lockfile of exactly 64 KiB (a long folder list) is read; one byte more is refused
    /// unread, with its size.
    #[test]
    fn a_lockfile_is_read_up_to_64_kib_and_refused_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let body = |len: usize| {
            let head =
                format!(r#"{{"pid":{me},"authToken":"0123456789abcdef","ideName":"Neovim"}}"#);
            // JSON whitespace before the closing brace pads it to `len` bytes.
            format!(
                "{}{}}}",
                &head[..head.len() - 1],
                " ".repeat(len - head.len())
            )
        };
        let at_limit = dir.path().join("4242.lock");
        std::fs::write(&at_limit, body(65_536)).unwrap();
        let lock = read(&at_limit, Family::Pi).unwrap();
        assert_eq!((lock.pid, lock.ide_name.as_str()), (me, "Neovim"));
        let over = dir.path().join("4243.lock");
        std::fs::write(&over, body(65_537)).unwrap();
        assert!(matches!(
            read(&over, Family::Pi),
            Err(Error::TooLarge(65_537))
        ));
    }

    /// A FIFO named like a lockfile is refused at once: opening it must not wait for a writer
    /// (the watcher's thread would hang on it forever).
    #[cfg(unix)] // POSIX paths, FIFOs or child processes
    #[test]
    fn a_fifo_lockfile_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("4244.lock");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(matches!(read(&fifo, Family::Pi), Err(Error::NotRegular)));
        });
        let refused = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("opening the FIFO blocked");
        assert!(refused, "a FIFO is not a regular file");
    }

    /// A symlink named like a lockfile is refused, never followed, even to a valid lockfile.
    #[cfg(unix)] // Unix file modes, symlinks or sockets
    #[test]
    fn a_symlinked_lockfile_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        let real = dir.path().join("4245.lock");
        std::fs::write(
            &real,
            format!(r#"{{"pid":{me},"authToken":"0123456789abcdef"}}"#),
        )
        .unwrap();
        assert!(read(&real, Family::Pi).is_ok());
        let link = dir.path().join("4246.lock");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(matches!(read(&link, Family::Pi), Err(Error::Symlink)));
    }

    /// The size refused is the file's own, however large (read from its metadata, not from
    /// what was read), and a lockfile that is not UTF-8 is malformed, not an I/O error.
    #[test]
    fn a_huge_or_binary_lockfile_is_refused_with_its_reason() {
        let dir = tempfile::tempdir().unwrap();
        let huge = dir.path().join("4247.lock");
        std::fs::write(&huge, vec![b' '; 1 << 20]).unwrap();
        assert!(matches!(
            read(&huge, Family::Pi),
            Err(Error::TooLarge(1_048_576))
        ));
        let binary = dir.path().join("4248.lock");
        std::fs::write(&binary, b"{\"pid\":1,\"ideName\":\"\xff\xfe\"}").unwrap();
        let r = read(&binary, Family::Pi);
        assert!(
            matches!(&r, Err(Error::Malformed(m)) if m.contains("UTF-8")),
            "{r:?}"
        );
    }

    /// An editor writes its lockfile as it starts: a file written up to a second before its
    /// process's start time (start times are whole seconds) belongs to it; one written
    /// earlier than that names a recycled pid.
    #[test]
    fn a_lockfile_written_within_a_second_of_the_start_is_the_processs() {
        let me = std::process::id();
        let Some(started) = crate::platform::process::start_unix(me) else {
            return; // without start times (signal-only process facts) it cannot be told
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("4249.lock");
        std::fs::write(
            &path,
            format!(r#"{{"pid":{me},"authToken":"0123456789abcdef"}}"#),
        )
        .unwrap();
        let at = |secs: i64| {
            let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs.unsigned_abs());
            let f = std::fs::File::options().write(true).open(&path).unwrap();
            f.set_modified(t).unwrap();
        };
        for (written, ok) in [(started, true), (started - 1, true), (started - 2, false)] {
            at(written);
            let r = read(&path, Family::Pi);
            assert_eq!(
                r.is_ok(),
                ok,
                "written {}s before the start: {r:?}",
                started - written
            );
            if !ok {
                assert!(matches!(r, Err(Error::RecycledPid(p)) if p == me), "{r:?}");
            }
        }
    }

    /// A lockfile of ours at `dir/<port>.lock` naming `pid`, mode 0600.
    #[cfg(unix)]
    fn write_lockfile(dir: &Path, port: u16, pid: u32) -> PathBuf {
        let path = dir.join(format!("{port}.lock"));
        std::fs::write(
            &path,
            format!(r#"{{"pid":{pid},"authToken":"0123456789abcdef"}}"#),
        )
        .unwrap();
        crate::platform::user::set_mode(&path, 0o600).unwrap();
        path
    }

    /// The lockfile at `path` (for `port`) as parsed, and a connection to its port with the
    /// local port it is from: what the dial's own look at the listener gets.
    #[cfg(target_os = "linux")]
    fn dialled(path: &Path, port: u16) -> (Lockfile, std::net::TcpStream, u16) {
        let lock = parse(
            &std::fs::read_to_string(path).unwrap(),
            path,
            Family::Pi,
            port,
        )
        .unwrap();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let from = client.local_addr().unwrap().port();
        (lock, client, from)
    }

    /// A lockfile that others, or a group not the user's own, may write is refused, with its
    /// mode and the fix; one only we may write (whoever may read it) is taken, and so is one
    /// only our own primary group may also write (`umask 002`: Node writes 0664 there).
    #[cfg(unix)]
    #[test]
    fn a_lockfile_others_may_write_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_lockfile(dir.path(), 4250, std::process::id());
        let ours = rustix::process::getegid().as_raw();
        std::os::unix::fs::chown(&path, None, Some(ours)).unwrap();
        let mut refused = vec![0o602, 0o622, 0o666];
        if rustix::process::getuid().is_root() {
            // A shared group (another gid): its members could write the file.
            std::os::unix::fs::chown(&path, None, Some(65534)).unwrap();
            refused.extend([0o620, 0o660]);
        }
        for mode in refused {
            crate::platform::user::set_mode(&path, mode).unwrap();
            let r = read(&path, Family::Pi);
            assert!(
                matches!(&r, Err(Error::OthersMayWrite { mode: m, .. }) if *m == mode),
                "mode {mode:o}: {r:?}"
            );
            let said = r.unwrap_err().to_string();
            assert!(said.contains(&format!("mode 0{mode:o}")), "{said}");
            assert!(
                said.contains(&format!("chmod 600 {}", path.display())),
                "{said}"
            );
        }
        std::os::unix::fs::chown(&path, None, Some(ours)).unwrap();
        for mode in [0o600, 0o644, 0o400, 0o640, 0o664, 0o620] {
            crate::platform::user::set_mode(&path, mode).unwrap();
            let r = read(&path, Family::Pi);
            assert!(r.is_ok(), "mode {mode:o}: {r:?}");
        }
    }

    /// A live pid of another user is not our editor: refused, naming whose it is (where the
    /// process facts tell; the signal-only ones cannot, and take it as before).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_lockfile_naming_another_users_process_is_refused() {
        use crate::platform::process::other_uid;
        let test = "a_lockfile_naming_another_users_process_is_refused";
        let Some(nobody) = other_uid::sleeper(test) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let path = write_lockfile(dir.path(), 4251, nobody.pid());
        let r = read(&path, Family::Pi);
        if crate::platform::process::real_uid(std::process::id()).is_none() {
            assert!(r.is_ok(), "uids unknown here: {r:?}");
            return;
        }
        assert!(
            matches!(r, Err(Error::ForeignPid { pid, uid })
                if pid == nobody.pid() && uid == other_uid::NOBODY),
            "{r:?}"
        );
        let said = r.unwrap_err().to_string();
        assert!(
            said.contains(&format!(
                "pid {} belongs to uid 65534, not you",
                nobody.pid()
            )),
            "{said}"
        );
        assert!(Error::ForeignPid { pid: 1, uid: 2 }.is_foreign());
        // Our own process, named in the same file: taken.
        write_lockfile(dir.path(), 4251, std::process::id());
        assert!(read(&path, Family::Pi).is_ok());
    }

    /// A lockfile of ours, naming our live pid, whose port another user listens on: refused
    /// (the token would go to them), and at the dial too, by the connection's own end. Our
    /// own listener on it, or none, is fine.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_lockfile_whose_port_another_user_listens_on_is_refused() {
        use crate::platform::process::other_uid;
        let test = "a_lockfile_whose_port_another_user_listens_on_is_refused";
        let dir = tempfile::tempdir().unwrap();
        let me = std::process::id();
        // Ours: taken.
        let ours = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = ours.local_addr().unwrap().port();
        let path = write_lockfile(dir.path(), port, me);
        assert!(read(&path, Family::Pi).is_ok());
        drop(ours);
        // Nobody's listener: refused.
        let Some((_theirs, port)) = other_uid::listener(test) else {
            return;
        };
        let path = write_lockfile(dir.path(), port, me);
        let r = read(&path, Family::Pi);
        assert!(
            matches!(r, Err(Error::ForeignListener { port: p, uid })
                if p == port && uid == other_uid::NOBODY),
            "{r:?}"
        );
        let said = r.unwrap_err().to_string();
        assert!(
            said.contains(&format!(
                "port {port} is listened on by uid 65534, not you: the lockfile's editor is not \
                 yours; the token was not sent"
            )),
            "{said}"
        );
        // The dial's own look: the end of a connection to it is theirs.
        let (lock, _client, from) = dialled(&path, port);
        assert!(matches!(
            check_port(&lock, Some(from)),
            Err(Error::ForeignListener { uid: 65534, .. })
        ));
    }

    /// A listener of another user that accepted us and closed itself: no listener is left
    /// to see, but the end of our connection is still theirs, and the dial's look says so.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_end_of_a_connection_is_whose_its_listener_was_even_once_that_is_gone() {
        use crate::platform::process::other_uid;
        let test = "the_end_of_a_connection_is_whose_its_listener_was_even_once_that_is_gone";
        let Some((mut theirs, port)) = other_uid::accept_once(test) else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let path = write_lockfile(dir.path(), port, std::process::id());
        let (lock, client, from) = dialled(&path, port);
        assert_eq!(theirs.next_line().as_deref(), Some("accepted"));
        assert!(check_port(&lock, None).is_ok(), "no listener is left");
        let r = check_port(&lock, Some(from));
        assert!(
            matches!(r, Err(Error::ForeignListener { port: p, uid: 65534 }) if p == port),
            "{r:?}"
        );
        drop(client);
        assert_eq!(theirs.next_line().as_deref(), Some("received"));
    }

    /// Up to 1,024 workspace folders are taken; one more is a malformed lockfile.
    #[test]
    fn at_most_1024_workspace_folders() {
        let me = std::process::id();
        let with = |n: usize| {
            let folders: Vec<String> = (0..n).map(|i| format!("/w/{i}")).collect();
            let text = serde_json::json!({"pid": me, "authToken": "0123456789abcdef", "workspaceFolders": folders});
            parse(&text.to_string(), &p("1.lock"), Family::Pi, 1)
        };
        assert_eq!(with(1024).unwrap().workspace_folders.len(), 1024);
        assert!(matches!(with(1025), Err(Error::Malformed(_))));
    }
}
