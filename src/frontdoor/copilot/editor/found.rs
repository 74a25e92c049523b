//! A lockfile Copilot Chat's VS Code server wrote, read and validated as an editor lockfile
//! is (`editor::lockfile`): never through a symlink, the user's own, closed to others,
//! bounded, its pid alive and the user's. A file carrying the broker's marker is the copilot
//! door's own and is never linked.

use crate::frontdoor::per_editor::MARKER;
use crate::sys::secret::Token;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The largest lockfile read; Copilot Chat's are a few hundred bytes.
const MAX_BYTES: u64 = 64 * 1024;
/// At most this many headers are sent as the lockfile gives them.
const MAX_HEADERS: usize = 16;

/// A Copilot Chat server, as its lockfile announces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Found {
    /// The lockfile.
    pub path: PathBuf,
    /// The Unix socket it serves MCP on.
    pub socket: PathBuf,
    /// The headers to send on every request, as written (their values are secrets).
    pub headers: Vec<(String, Token)>,
    /// The VS Code extension host's pid (alive when read).
    pub pid: u32,
    /// Its workspace folders.
    pub folders: Vec<String>,
    /// `ideName` ("Visual Studio Code").
    pub ide_name: String,
}

/// Why a file is not linked.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Skip {
    /// The broker's own lockfile (the copilot door's), or not a `*.lock`: silently not ours.
    Ours,
    /// Half written, or gone: looked at again on its next event.
    Transient,
    /// Refused, and why (logged once per file and reason).
    Bad(String),
}

/// The JSON shape (`lockFile.ts`'s `LockFileInfo`); extra fields are allowed, as Copilot CLI
/// allows them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    socket_path: String,
    scheme: String,
    headers: BTreeMap<String, String>,
    pid: serde_json::Value,
    #[serde(default)]
    workspace_folders: Vec<String>,
    #[serde(default)]
    ide_name: Option<String>,
}

/// True for a name Copilot Chat gives its lockfiles.
pub(super) fn is_lock_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".lock"))
}

/// Reads and validates `path`.
pub(super) fn read(path: &Path) -> Result<Found, Skip> {
    if !is_lock_name(path) {
        return Err(Skip::Ours);
    }
    use crate::platform::Error as E;
    let own = crate::platform::user::open_own_regular(path).map_err(|e| match e {
        E::Gone => Skip::Transient,
        E::Symlink => Skip::Bad("is a symlink (refused, never followed)".into()),
        E::NotRegular => Skip::Bad("is not a regular file".into()),
        E::ForeignOwner(uid) => Skip::Bad(format!("is owned by uid {uid}, not by you")),
        other => Skip::Bad(format!("cannot be read: {other}")),
    })?;
    let open_to = if own.group_is_ours { 0o002 } else { 0o022 };
    if let Some(mode) = own.mode.filter(|m| m & open_to != 0) {
        return Err(Skip::Bad(format!(
            "is writable by group or others (mode {mode:04o}): another user could point the broker at a socket of theirs"
        )));
    }
    if own.size > MAX_BYTES {
        return Err(Skip::Bad(format!("is over {MAX_BYTES} bytes")));
    }
    let mut text = String::new();
    own.file
        .take(MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| Skip::Bad(format!("cannot be read: {e}")))?;
    let found = parse(&text, path)?;
    if !crate::platform::process::alive(found.pid) {
        return Err(Skip::Bad(format!(
            "names pid {}, which is not running (stale lockfile)",
            found.pid
        )));
    }
    if let Some(uid) = crate::platform::process::real_uid(found.pid)
        .filter(|uid| *uid != crate::platform::user::uid())
    {
        return Err(Skip::Bad(format!(
            "names pid {}, a process of uid {uid}, not yours",
            found.pid
        )));
    }
    Ok(found)
}

/// Parses lockfile text (no file-system or pid checks).
pub(super) fn parse(text: &str, path: &Path) -> Result<Found, Skip> {
    if text.trim().is_empty() {
        return Err(Skip::Transient);
    }
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        if e.is_eof() {
            Skip::Transient
        } else {
            Skip::Bad(format!("is not JSON: {e}"))
        }
    })?;
    if v.get(MARKER).is_some() {
        return Err(Skip::Ours);
    }
    let raw: Raw = serde_json::from_value(v)
        .map_err(|e| Skip::Bad(format!("is not a Copilot lockfile: {e}")))?;
    if raw.scheme != "unix" {
        return Err(Skip::Bad(format!(
            "scheme {:?} is not supported (only \"unix\")",
            raw.scheme
        )));
    }
    let socket = PathBuf::from(&raw.socket_path);
    if !socket.is_absolute() {
        return Err(Skip::Bad("socketPath must be an absolute path".into()));
    }
    let pid = crate::registry::lifecycle::lockfile::pid_of(&raw.pid)
        .ok_or_else(|| Skip::Bad("\"pid\" must be a positive integer".into()))?;
    Ok(Found {
        path: path.to_path_buf(),
        socket,
        headers: headers(raw.headers)?,
        pid,
        folders: folders(raw.workspace_folders)?,
        ide_name: raw
            .ide_name
            .filter(|n| !n.is_empty() && n.len() <= 200)
            .unwrap_or_else(|| "Visual Studio Code".into()),
    })
}

/// The headers to send: valid names and values only, none the broker sets itself.
fn headers(raw: BTreeMap<String, String>) -> Result<Vec<(String, Token)>, Skip> {
    if raw.len() > MAX_HEADERS {
        return Err(Skip::Bad(format!("has more than {MAX_HEADERS} headers")));
    }
    let reserved = [
        "host",
        "content-type",
        "content-length",
        "accept",
        "transfer-encoding",
        "connection",
        "mcp-session-id",
        "x-copilot-session-id",
    ];
    let mut out = Vec::new();
    for (k, v) in raw {
        let name = k.to_ascii_lowercase();
        if hyper::header::HeaderName::from_bytes(name.as_bytes()).is_err()
            || hyper::header::HeaderValue::from_str(&v).is_err()
        {
            // The value is never shown: it may be the nonce.
            return Err(Skip::Bad(format!("header {name:?} is not a valid header")));
        }
        if reserved.contains(&name.as_str()) {
            return Err(Skip::Bad(format!("header {name:?} is the broker's to set")));
        }
        out.push((name, Token::new(v)));
    }
    Ok(out)
}

fn folders(raw: Vec<String>) -> Result<Vec<String>, Skip> {
    if raw.len() > 1024 {
        return Err(Skip::Bad("has more than 1024 workspaceFolders".into()));
    }
    Ok(raw
        .into_iter()
        .filter(|f| Path::new(f).is_absolute())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> PathBuf {
        PathBuf::from("/x/a.lock")
    }

    #[cfg(unix)] // Its folders are Unix paths ("/w"), not absolute on Windows.
    #[test]
    fn copilot_chats_shape_is_read_and_the_nonce_kept_secret() {
        let text = r#"{"socketPath": "/tmp/mcp-1/mcp.sock", "scheme": "unix",
            "headers": {"Authorization": "Nonce 11111111-2222-4333-8444-555555555555"},
            "pid": 42, "ideName": "Visual Studio Code", "timestamp": 1,
            "workspaceFolders": ["/w", "relative"], "isTrusted": true, "extra": 1}"#;
        let f = parse(text, &p()).unwrap();
        assert_eq!(f.socket, PathBuf::from("/tmp/mcp-1/mcp.sock"));
        assert_eq!(f.pid, 42);
        assert_eq!(f.folders, vec!["/w".to_string()]);
        assert_eq!(f.ide_name, "Visual Studio Code");
        assert_eq!(f.headers.len(), 1);
        assert_eq!(f.headers[0].0, "authorization");
        assert!(
            !format!("{f:?}").contains("11111111"),
            "the nonce never prints"
        );
    }

    #[test]
    fn the_brokers_own_and_bad_shapes_are_skipped() {
        let ours = format!(
            r#"{{"socketPath":"/s","scheme":"unix","headers":{{}},"pid":1,"{MARKER}":{{}}}}"#
        );
        assert_eq!(parse(&ours, &p()), Err(Skip::Ours));
        assert_eq!(parse("", &p()), Err(Skip::Transient));
        assert_eq!(parse("{\"socketPath\":", &p()), Err(Skip::Transient));
        for bad in [
            "garbage",
            "[1]",
            r#"{"socketPath":"/s","scheme":"pipe","headers":{},"pid":1}"#,
            r#"{"socketPath":"rel.sock","scheme":"unix","headers":{},"pid":1}"#,
            r#"{"socketPath":"/s","scheme":"unix","headers":{},"pid":0}"#,
            r#"{"socketPath":"/s","scheme":"unix","headers":{},"pid":"1"}"#,
            r#"{"socketPath":"/s","scheme":"unix","pid":1}"#,
            r#"{"socketPath":"/s","scheme":"unix","headers":{"Host":"evil"},"pid":1}"#,
            r#"{"socketPath":"/s","scheme":"unix","headers":{"a b":"x"},"pid":1}"#,
            r#"{"socketPath":"/s","scheme":"unix","headers":{"x":"a\nb"},"pid":1}"#,
        ] {
            assert!(matches!(parse(bad, &p()), Err(Skip::Bad(_))), "{bad}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_dead_pid_a_symlink_and_an_open_mode_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let body = |pid: u32| {
            format!(r#"{{"socketPath":"/s","scheme":"unix","headers":{{}},"pid":{pid}}}"#)
        };
        let dead = dir.path().join("dead.lock");
        std::fs::write(&dead, body(i32::MAX as u32 - 1)).unwrap();
        assert!(matches!(read(&dead), Err(Skip::Bad(w)) if w.contains("not running")));
        let live = dir.path().join("live.lock");
        std::fs::write(&live, body(std::process::id())).unwrap();
        std::fs::set_permissions(&live, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&live).unwrap().pid, std::process::id());
        std::fs::set_permissions(&live, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(matches!(read(&live), Err(Skip::Bad(w)) if w.contains("writable")));
        let link = dir.path().join("link.lock");
        std::os::unix::fs::symlink(&dead, &link).unwrap();
        assert!(matches!(read(&link), Err(Skip::Bad(w)) if w.contains("symlink")));
        assert_eq!(read(&dir.path().join("x.txt")), Err(Skip::Ours));
    }
}
