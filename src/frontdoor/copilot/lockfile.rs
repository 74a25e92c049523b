//! Copilot CLI's lockfiles as the copilot door writes them: `<uuid>.lock`, in place, 0600.
//!
//! Copilot CLI reads every `*.lock` in its ide dir (`{socketPath, scheme, headers, pid,
//! timestamp, workspaceFolders, ideName}`, extra fields allowed) and treats a rename of the
//! file it is connected through as a disconnect, so a lockfile is rewritten in place (open,
//! truncate, write), never replaced. Ours carry the broker's marker: a dead broker's are
//! removed at start, a file without it is never touched.

use crate::frontdoor::per_editor::{self, MARKER};
use crate::registry::Registry;
use crate::sys::secret::Token;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// What the lockfile of one editor says, besides what the registry knows of the editor.
pub(super) struct Published<'a> {
    /// The socket Copilot CLI dials.
    pub socket: &'a Path,
    /// The nonce it must present (`Authorization: Nonce <nonce>`).
    pub nonce: &'a Token,
    /// When the entry was first written (ms since the epoch; unchanged on rewrites).
    pub timestamp: u64,
    /// Folders listed besides the editor's own: the cwds of Copilot CLIs in subfolders
    /// (`subfolders`).
    pub extra: &'a [String],
}

/// A fresh lockfile name, `<uuid>.lock` (a random version-4 UUID, as Copilot Chat names its).
pub(super) fn fresh_name() -> std::io::Result<String> {
    Ok(format!("{}.lock", super::editor::uuid()?))
}

/// True for a name Copilot CLI reads as a lockfile.
pub(super) fn is_lock_name(name: &str) -> bool {
    name.ends_with(".lock")
}

/// The lockfile's JSON for editor `id` as it is now, or `None` when the editor is gone.
pub(super) fn body(reg: &Registry, id: &str, p: &Published) -> Option<Value> {
    let editor = reg.editor(id)?;
    let lock = editor.lockfile();
    let mut folders = per_editor::folders(&editor, &lock);
    for f in p.extra {
        if !folders.contains(f) {
            folders.push(f.clone());
        }
    }
    let name = if lock.ide_name.is_empty() {
        "Editor"
    } else {
        lock.ide_name.as_str()
    };
    Some(shape(p, &folders, name, id, json!(editor.family)))
}

/// The lockfile's JSON from its parts.
fn shape(p: &Published, folders: &[String], ide_name: &str, id: &str, family: Value) -> Value {
    json!({
        "socketPath": p.socket.display().to_string(),
        "scheme": if cfg!(windows) { "pipe" } else { "unix" },
        "headers": {"Authorization": format!("Nonce {}", p.nonce.expose())},
        "pid": std::process::id(),
        "timestamp": p.timestamp,
        "workspaceFolders": folders,
        "ideName": format!("{ide_name} (via pi-ide-broker)"),
        MARKER: {"pid": std::process::id(), "editor": id, "family": family},
    })
}

/// Writes `body` to `path` in place (created 0600 when missing; never through a symlink).
pub(super) fn write_in_place(path: &Path, body: &Value) -> std::io::Result<()> {
    crate::platform::user::write_private_in_place(path, body.to_string().as_bytes())
}

/// Removes the lockfiles in `dir` a broker that died left (ours by marker, its pid dead), and
/// their sockets.
pub(super) fn clean_leftovers(dir: &Path) {
    let sockets: Vec<PathBuf> = list(dir)
        .into_iter()
        .filter_map(|(_, v)| v)
        .filter(|v| !alive(v))
        .filter_map(|v| v.get("socketPath")?.as_str().map(PathBuf::from))
        .collect();
    per_editor::clean_leftovers(dir, is_lock_name, broker_pid);
    for s in sockets {
        let _ = std::fs::remove_file(s);
    }
}

/// The pid of the broker that wrote `v` (its marker's; 0 when it names none).
pub(super) fn broker_pid(v: &Value) -> u32 {
    let pid = v[MARKER].get("pid").and_then(Value::as_u64).unwrap_or(0);
    u32::try_from(pid).unwrap_or(0)
}

fn alive(v: &Value) -> bool {
    let pid = broker_pid(v);
    pid == std::process::id() || crate::platform::process::alive(pid)
}

/// The lockfiles in `dir` (for `status` and `doctor`): name, and the JSON when it carries our
/// marker (`None` for a file some other program wrote).
pub(super) fn list(dir: &Path) -> Vec<(String, Option<Value>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Option<Value>)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            if !is_lock_name(&name) {
                return None;
            }
            let ours = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .filter(|v| v.get(MARKER).is_some());
            Some((name, ours))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lockfile_has_the_fields_copilot_cli_requires_and_our_marker() {
        let nonce = Token::generate().unwrap();
        let p = Published {
            socket: Path::new("/run/x/copilot/a.sock"),
            nonce: &nonce,
            timestamp: 1234,
            extra: &[],
        };
        let v = shape(&p, &["/w/one".into()], "Neovim", "e1", json!("pi"));
        assert_eq!(v["socketPath"], "/run/x/copilot/a.sock");
        assert_eq!(v["scheme"], if cfg!(windows) { "pipe" } else { "unix" });
        assert_eq!(
            v["headers"]["Authorization"],
            format!("Nonce {}", nonce.expose())
        );
        assert_eq!(v["pid"], std::process::id());
        assert_eq!(v["timestamp"], 1234);
        assert_eq!(v["workspaceFolders"], json!(["/w/one"]));
        assert_eq!(v["ideName"], "Neovim (via pi-ide-broker)");
        assert_eq!(v[MARKER]["pid"], std::process::id());
        assert_eq!(v[MARKER]["editor"], "e1");
        assert!(v.get("isTrusted").is_none(), "trust is never granted");
    }

    #[test]
    fn names_are_uuids_and_lockfiles_are_written_in_place() {
        let n = fresh_name().unwrap();
        assert_eq!(n.len(), 36 + 5, "{n}");
        assert_eq!(&n[14..15], "4");
        assert!(is_lock_name(&n));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(&n);
        write_in_place(&path, &json!({"a": 1})).unwrap();
        #[cfg(unix)]
        let ino = {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let m = std::fs::metadata(&path).unwrap();
            assert_eq!(m.permissions().mode() & 0o777, 0o600);
            m.ino()
        };
        write_in_place(&path, &json!({"a": 2})).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&path).unwrap();
            assert_eq!(m.ino(), ino, "the same file: not renamed over");
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), r#"{"a":2}"#);
    }

    #[test]
    fn a_dead_brokers_lockfiles_go_and_others_stay() {
        let dir = tempfile::tempdir().unwrap();
        let foreign = dir.path().join("f.lock");
        std::fs::write(&foreign, r#"{"pid":1,"socketPath":"/x"}"#).unwrap();
        let sock = dir.path().join("dead.sock");
        std::fs::write(&sock, "").unwrap();
        let dead = dir.path().join("d.lock");
        let body = json!({"socketPath": sock.display().to_string(), MARKER: {"pid": u32::MAX - 1}});
        std::fs::write(&dead, body.to_string()).unwrap();
        let live = dir.path().join("l.lock");
        std::fs::write(
            &live,
            json!({MARKER: {"pid": std::process::id()}}).to_string(),
        )
        .unwrap();
        clean_leftovers(dir.path());
        assert!(
            foreign.exists(),
            "a file without our marker is never touched"
        );
        assert!(!dead.exists() && !sock.exists(), "a dead broker's files go");
        assert!(live.exists(), "a live broker's file stays");
    }

    /// A symlink planted where a lockfile goes (Copilot's ide dir is the user's, but a link
    /// there may point anywhere) is refused, never written through: its target is untouched.
    #[cfg(unix)]
    #[test]
    fn a_lockfile_is_never_written_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let path = dir.path().join("a.lock");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert!(write_in_place(&path, &json!({"x": 1})).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }
}
