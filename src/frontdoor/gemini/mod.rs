//! The gemini door: Gemini CLI's and Qwen Code's IDE companion protocol, per editor.
//!
//! Gemini CLI's IDE companion protocol for every live editor. Per editor, a discovery file
//! `gemini-ide-server-<EDITOR_PID>-<PORT>.json` in `os.tmpdir()/gemini/ide` (named with the
//! editor's own pid, so a CLI started in that editor's terminal prefers it) and a loopback MCP
//! endpoint over Streamable HTTP on that port (`gemini_http`), whose every MCP session is a
//! broker session pinned to the editor (`gemini_session`).
//!
//! One endpoint per editor rather than one for all: Gemini CLI sends no cwd, so the file it
//! picks (by workspace and pid) is the only routing signal there is.
//!
//! As the compat door: an entry keeps its port and token across the editor's restarts (the
//! file is renamed for the successor's pid), is withdrawn when the editor is gone for good,
//! every entry is removed on shutdown, and a dead broker's leftovers (marked) are cleaned at
//! start. Files without the marker are never touched.

mod config;
mod door;
mod http;
mod qwen;
mod session;

pub use config::GeminiConfig;
pub use door::{GeminiDoor, DOOR_ID};

use super::per_editor::{self, Entry, PerEditor};
use crate::registry::Registry;
use crate::sys::secret::Token;
use http::Endpoint;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// The field that marks a discovery file as written by a pi-ide-broker.
pub const MARKER: &str = per_editor::MARKER;

/// The file name prefix Gemini CLI looks for.
pub const FILE_PREFIX: &str = "gemini-ide-server-";

/// The gemini door as a [`PerEditor`]: where it writes (Gemini CLI's dir, and Qwen Code's
/// when that is on). An entry's files are its gemini file, then its Qwen Code lock file.
struct Gemini {
    gemini: PathBuf,
    qwen: Option<PathBuf>,
}

impl PerEditor for Gemini {
    /// The endpoint's token, written again on every refresh.
    type Door = Token;
    const WHAT: &'static str = "gemini discovery file";

    /// Mints a token, writes the discovery files and starts serving.
    fn publish(
        &self,
        reg: &Arc<Registry>,
        id: &str,
        listener: tokio::net::TcpListener,
        stop: CancellationToken,
    ) -> std::io::Result<Entry<Token>> {
        let port = listener.local_addr()?.port();
        let token = Token::generate()?;
        let endpoint = Arc::new(Endpoint::new(
            reg.clone(),
            id.to_string(),
            port,
            token.clone(),
            stop.clone(),
        ));
        let mut entry = Entry {
            port,
            files: Vec::new(),
            stop,
            door: token,
        };
        if let Err(e) = self.refresh(reg, id, &mut entry) {
            entry.stop.cancel();
            return Err(e);
        }
        if entry.files.is_empty() {
            entry.stop.cancel();
            return Err(std::io::Error::other("the editor is gone"));
        }
        reg.tracker.spawn(http::accept_loop(endpoint, listener));
        Ok(entry)
    }

    /// Writes the entry's files for editor `id` as it is now (a successor's pid renames the
    /// gemini file), and the Qwen Code lock file beside it.
    fn refresh(&self, reg: &Registry, id: &str, e: &mut Entry<Token>) -> std::io::Result<()> {
        let Some(body) = discovery_body(reg, id, e.port, &e.door) else {
            return Ok(());
        };
        let path = self.gemini.join(file_name(editor_pid(reg, id), e.port));
        crate::registry::state::write_atomic_unsynced(&path, body.to_string().as_bytes())?;
        match e.files.first_mut() {
            Some(old) if *old != path => {
                let _ = std::fs::remove_file(&*old);
                *old = path;
            }
            Some(_) => {}
            None => e.files.push(path),
        }
        if let Some(q) = &self.qwen {
            let lock = qwen::write(q, e.port, &body)?;
            e.files.truncate(1);
            e.files.push(lock);
        }
        Ok(())
    }
}

/// Runs the gemini door until the broker stops, then removes every discovery file. With
/// `qwen_dir`, each editor gets a Qwen Code lock file there too.
pub async fn run(reg: Arc<Registry>, dir: PathBuf, qwen_dir: Option<PathBuf>) {
    if let Err(e) = secure_dirs(&dir) {
        tracing::error!(dir = %dir.display(), error = %e, "gemini door disabled");
        return;
    }
    clean_leftovers(&dir, is_gemini_name);
    // Qwen Code's dir is made only where Qwen Code has a home already (`~/.qwen`): a HOME that
    // never had it gets none.
    let qwen = qwen_dir
        .filter(|q| q.parent().is_some_and(Path::is_dir))
        .filter(|q| match crate::platform::local::secure_dir(q) {
            Ok(()) => {
                clean_leftovers(q, qwen::is_lock_name);
                true
            }
            Err(e) => {
                tracing::warn!(dir = %q.display(), error = %e, "Qwen Code lock files disabled");
                false
            }
        });
    per_editor::run(reg, Gemini { gemini: dir, qwen }).await;
}

/// The discovery dir (`os.tmpdir()/gemini/ide` by default) made 0700 when missing and refused
/// when not ours, a symlink, or writable by others (another user could swap the files Gemini
/// CLI reads). Its parent is made 0700 when missing too, and when it exists only checked the
/// same way, never chmodded: it may be a dir the user configured the door into (a test's
/// temp root opened to another uid, a folder in `$HOME`), which is not the broker's to close.
fn secure_dirs(dir: &Path) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        match std::fs::symlink_metadata(parent) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                crate::platform::local::secure_dir(parent).map_err(|e| e.to_string())?;
            }
            Err(e) => return Err(format!("cannot stat {}: {e}", parent.display())),
            Ok(meta) => per_editor::check_private_dir(parent, &meta)?,
        }
    }
    crate::platform::local::secure_dir(dir).map_err(|e| e.to_string())
}

/// `gemini-ide-server-<pid>-<port>.json`.
pub fn file_name(pid: u32, port: u16) -> String {
    format!("{FILE_PREFIX}{pid}-{port}.json")
}

fn editor_pid(reg: &Registry, id: &str) -> u32 {
    reg.editor(id).map(|e| e.lockfile().pid).unwrap_or(0)
}

/// True for a name Gemini CLI reads as a discovery file.
fn is_gemini_name(name: &str) -> bool {
    name.starts_with(FILE_PREFIX) && name.ends_with(".json")
}

/// Removes discovery files (names `matches` accepts) left by a broker that died: ours by
/// marker, with a dead pid.
fn clean_leftovers(dir: &Path, matches: fn(&str) -> bool) {
    per_editor::clean_leftovers(dir, matches, |v| {
        let pid = v[MARKER].get("pid").and_then(Value::as_u64).unwrap_or(0);
        u32::try_from(pid).unwrap_or(0)
    });
}

/// The discovery file's JSON: what Gemini CLI reads, plus our marker.
fn discovery_body(reg: &Registry, id: &str, port: u16, token: &Token) -> Option<Value> {
    let editor = reg.editor(id)?;
    let lock = editor.lockfile();
    // The CLI realpaths each folder: the resolved forms are enough, the written ones kept too.
    let folders = per_editor::folders(&editor, &lock);
    let display = if lock.ide_name.is_empty() {
        "Editor".to_string()
    } else {
        lock.ide_name.clone()
    };
    Some(json!({
        "port": port,
        "workspacePath": folders.join(crate::protocol::winpath::FOLDER_LIST_DELIMITER),
        "authToken": token.expose(),
        "ideInfo": {"name": ide_slug(&display), "displayName": display},
        MARKER: {"pid": std::process::id(), "editor": id, "family": editor.family, "editorPid": lock.pid},
    }))
}

/// A short lowercase identifier for `ideInfo.name` ("Neovim" → "neovim", "VS Code" → "vscode").
fn ide_slug(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// The discovery files in `dir` (for `doctor`): name, and the editor id our marker names
/// (`None` for a file some other program wrote).
pub fn list_files(dir: &Path) -> Vec<(String, Option<String>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Option<String>)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            if !name.starts_with(FILE_PREFIX) || !name.ends_with(".json") {
                return None;
            }
            let editor = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .and_then(|v| v.get(MARKER)?.get("editor")?.as_str().map(String::from));
            Some((name, editor))
        })
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The discovery dir is made private; an existing parent the user chose is left as it is
    /// (it was chmodded to 0700, which locked another uid out of a test's opened temp root).
    #[cfg(unix)] // Unix file modes, symlinks or sockets
    #[test]
    fn the_discovery_dir_is_private_and_an_existing_parent_is_left_as_it_is() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let dir = root.path().join("ide");
        secure_dirs(&dir).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(
            mode(root.path()),
            0o711,
            "the parent is not the broker's to close"
        );
        // A missing parent is made, private.
        let deeper = root.path().join("gemini").join("ide");
        secure_dirs(&deeper).unwrap();
        assert_eq!(mode(&root.path().join("gemini")), 0o700);
        // A parent others can write to is refused.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = secure_dirs(&dir).unwrap_err();
        assert!(err.contains("writable by others"), "{err}");
    }

    #[test]
    fn names_are_what_gemini_cli_matches() {
        assert_eq!(file_name(42, 5000), "gemini-ide-server-42-5000.json");
        assert_eq!(ide_slug("VS Code"), "vscode");
        assert_eq!(ide_slug("Neovim"), "neovim");
    }

    #[test]
    fn leftovers_are_ours_only_and_only_when_their_broker_died() {
        let dir = tempfile::tempdir().unwrap();
        let foreign = dir.path().join(file_name(1, 1));
        std::fs::write(&foreign, r#"{"port":1,"authToken":"x"}"#).unwrap();
        let dead = dir.path().join(file_name(2, 2));
        std::fs::write(
            &dead,
            json!({"port": 2, MARKER: {"pid": u32::MAX - 1}}).to_string(),
        )
        .unwrap();
        let live = dir.path().join(file_name(3, 3));
        std::fs::write(
            &live,
            json!({"port": 3, MARKER: {"pid": std::process::id()}}).to_string(),
        )
        .unwrap();
        clean_leftovers(dir.path(), is_gemini_name);
        assert!(
            foreign.exists(),
            "a file without our marker is never touched"
        );
        assert!(!dead.exists(), "a dead broker's file is removed");
        assert!(live.exists(), "a live broker's file is kept");
    }
}
