//! The copilot family: Copilot CLI's IDE protocol per editor; Copilot Chat's server as one (`editor`).
//!
//! The door: GitHub Copilot CLI's IDE protocol, one lockfile and socket per editor.
//! For every live editor, a Unix socket (0600) in the broker's private `copilot/` dir beside
//! its own socket (on Windows an owner-only named pipe), and a Copilot lockfile `<uuid>.lock`
//! in Copilot CLI's ide dir (`$COPILOT_HOME/ide`, default `~/.copilot/ide`, once that home
//! exists) naming it, with a fresh nonce, the editor's folders and `"<ideName> (via
//! pi-ide-broker)"`; Copilot CLI's `/ide` lists it and a CLI whose cwd is one of those folders
//! connects by itself. The socket serves MCP over Streamable HTTP (`http`), each MCP session a
//! broker session pinned to the editor (`session`), its tools mapped onto the editor's
//! (`tools`).
//!
//! A lockfile is rewritten in place when its editor changes (Copilot CLI reads a rename as a
//! disconnect), removed as soon as the editor goes or restarts (a CLI then shows the
//! connection lost and waits, rather than clinging to a dead one; a successor, same id, gets a
//! fresh lockfile, socket and nonce, which a waiting CLI connects to) and when the broker stops; a dead broker's (marked, `lockfile`) are swept at
//! start. Files without the marker are never touched.
//!
//! Its editor side (`editor`): VS Code's Copilot Chat extension serves Copilot CLI's protocol;
//! the broker links each such server as an editor every session can use.

mod config;
mod door;
pub mod editor;
mod http;
mod lockfile;
mod session;
mod subfolders;
mod tools;

pub use config::{editor_lock_dir, socket_dir, CopilotConfig};
pub use door::{CopilotDoor, DOOR_ID};

use crate::editor::Editor;
use crate::registry::{EditorEvent, Registry};
use crate::sys::secret::Token;
use http::Endpoint;
use lockfile::Published;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use tokio_util::sync::CancellationToken;

/// One editor's published endpoint.
struct Entry {
    /// The editor handle it was published for: a successor (a restart of the same editor,
    /// with the same id) is a new handle, and gets a fresh endpoint.
    editor: Weak<Editor>,
    lock: PathBuf,
    socket: PathBuf,
    nonce: Token,
    timestamp: u64,
    /// The cwds of Copilot CLIs in subfolders of the editor's, listed too (`subfolders`).
    extra: Vec<String>,
    stop: CancellationToken,
}

impl Entry {
    fn published(&self) -> Published<'_> {
        Published {
            socket: &self.socket,
            nonce: &self.nonce,
            timestamp: self.timestamp,
            extra: &self.extra,
        }
    }

    /// Whether it still stands for the live editor `id` (the same handle, not gone, not a
    /// successor).
    fn current(&self, reg: &Registry, id: &str) -> bool {
        reg.editor(id)
            .is_some_and(|e| Weak::ptr_eq(&self.editor, &Arc::downgrade(&e)))
    }

    /// Stops its listener and sessions, removes its lockfile and socket.
    fn withdraw(&self) {
        self.stop.cancel();
        let _ = std::fs::remove_file(&self.lock);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Runs the copilot door until the broker stops: `dir` is Copilot CLI's ide dir, `sockets`
/// the broker's private dir for the door's sockets.
pub async fn run(reg: Arc<Registry>, dir: PathBuf, sockets: PathBuf) {
    if let Err(e) = crate::platform::local::secure_dir(&sockets) {
        tracing::error!(dir = %sockets.display(), error = %e, "copilot door disabled");
        return;
    }
    if !wait_for_home(&dir, &reg.cancel).await {
        return;
    }
    if let Err(e) = crate::platform::local::secure_dir(&dir) {
        tracing::error!(dir = %dir.display(), error = %e, "copilot door disabled");
        return;
    }
    lockfile::clean_leftovers(&dir);
    let mut events = reg.subscribe_editors();
    let mut changes = reg.subscribe_changes();
    let mut entries: HashMap<String, Entry> = HashMap::new();
    let mut finder = subfolders::Finder::start(&dir, reg.cancel.child_token());
    loop {
        let ev = tokio::select! {
            _ = reg.cancel.cancelled() => break,
            ev = events.recv() => match ev { Some(e) => e, None => break },
            Ok(()) = changes.changed() => {
                withdraw_stale(&reg, &mut entries);
                continue;
            }
            wakes = finder.next() => {
                if wakes.iter().any(|w| concerns(w, &entries)) {
                    list_subfolders(&reg, &mut entries, &mut finder);
                }
                continue;
            }
        };
        match ev {
            EditorEvent::Ready(id) => {
                withdraw_stale(&reg, &mut entries);
                // Copilot CLI reads a Copilot Chat server's own lockfile: no second one.
                if reg
                    .editor(&id)
                    .is_some_and(|e| editor::is_adapter(&reg, &e))
                {
                    continue;
                }
                if let Some(e) = entries.get(&id) {
                    if let Err(err) = write(&reg, &id, e) {
                        tracing::warn!(editor = %id, error = %err, "cannot rewrite the copilot lockfile");
                    }
                    continue;
                }
                match publish(&reg, &id, &dir, &sockets).await {
                    Ok(e) => {
                        tracing::info!(editor = %id, file = %e.lock.display(), "copilot lockfile published");
                        entries.insert(id, e);
                    }
                    Err(err) => {
                        tracing::warn!(editor = %id, error = %err, "cannot publish a copilot lockfile")
                    }
                }
            }
            EditorEvent::Gone(id) => {
                if let Some(e) = entries.remove(&id) {
                    tracing::info!(editor = %id, file = %e.lock.display(), "copilot lockfile withdrawn");
                    e.withdraw();
                }
            }
        }
    }
    for e in entries.values() {
        e.withdraw();
    }
}

/// How often a Copilot home that does not exist yet is looked for (one `stat`).
const HOME_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// Copilot CLI's home for ide dir `dir` (`$COPILOT_HOME` or `~/.copilot`): its parent.
pub(crate) fn home_of(dir: &Path) -> &Path {
    dir.parent().unwrap_or(Path::new("/"))
}

/// Waits until Copilot CLI's home (`dir`'s parent) exists, looked for every [`HOME_POLL`]
/// (one `stat`): the door never creates it (a user who never ran Copilot CLI gets no
/// `~/.copilot`), only the `ide` dir inside it. False when `cancel` fires first.
async fn wait_for_home(dir: &Path, cancel: &CancellationToken) -> bool {
    if home_of(dir).is_dir() {
        return true;
    }
    let (tick, mut ticks) = tokio::sync::mpsc::channel(1);
    let stop = cancel.child_token();
    let _stop_ticking = stop.clone().drop_guard();
    tokio::spawn(async move {
        let mut poll = tokio::time::interval(HOME_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = poll.tick() => if tick.send(()).await.is_err() { return },
            }
        }
    });
    home_appears(dir, cancel, &mut ticks).await
}

/// [`wait_for_home`]'s loop: looks for the home at each of `ticks`.
async fn home_appears(
    dir: &Path,
    cancel: &CancellationToken,
    ticks: &mut tokio::sync::mpsc::Receiver<()>,
) -> bool {
    let home = home_of(dir);
    tracing::info!(home = %home.display(), "copilot door: no Copilot CLI home (Copilot CLI never ran here); publishing once it exists");
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return false,
            t = ticks.recv() => {
                if t.is_none() {
                    return false;
                }
                if home.is_dir() {
                    tracing::info!(home = %home.display(), "copilot door: Copilot CLI's home appeared; publishing");
                    return true;
                }
            }
        }
    }
}

/// Withdraws the entries whose editor went (at once, not after its grace period) or was
/// succeeded: Copilot CLI only notices a lockfile removed (rewritten in place, it clings to
/// its MCP session on a server that no longer knows it), so it shows the connection lost and
/// connects afresh to the successor's new lockfile, socket and nonce.
fn withdraw_stale(reg: &Registry, entries: &mut HashMap<String, Entry>) {
    entries.retain(|id, e| {
        let keep = e.current(reg, id);
        if !keep {
            tracing::info!(editor = %id, file = %e.lock.display(), "copilot lockfile withdrawn (editor gone or restarted)");
            e.withdraw();
        }
        keep
    });
}

/// Whether `w` asks for a new look: one of our lockfiles opened (a Copilot CLI reading it), or
/// a Copilot CLI that was found gone.
fn concerns(w: &subfolders::Wake, entries: &HashMap<String, Entry>) -> bool {
    match w {
        subfolders::Wake::Opened(name) => entries
            .values()
            .any(|e| e.lock.file_name() == Some(name.as_os_str())),
        subfolders::Wake::Exited(_) => true,
    }
}

/// Lists in each editor's lockfile the cwds of the Copilot CLIs running in its subfolders (and
/// no others): a lockfile whose list changes is rewritten in place, which a waiting CLI reads.
fn list_subfolders(
    reg: &Registry,
    entries: &mut HashMap<String, Entry>,
    finder: &mut subfolders::Finder,
) {
    let editors: Vec<(String, Vec<String>)> = entries
        .keys()
        .filter_map(|id| {
            let e = reg.editor(id)?;
            Some((
                id.clone(),
                crate::frontdoor::per_editor::folders(&e, &e.lockfile()),
            ))
        })
        .collect();
    let mut found = finder.look(&editors);
    for (id, e) in entries.iter_mut() {
        let extra = found.remove(id).unwrap_or_default();
        if extra == e.extra {
            continue;
        }
        tracing::info!(editor = %id, subfolders = ?extra, "copilot lockfile lists the subfolders Copilot CLI runs in");
        e.extra = extra;
        if let Err(err) = write(reg, id, e) {
            tracing::warn!(editor = %id, error = %err, "cannot rewrite the copilot lockfile");
        }
    }
}

/// Binds the editor's socket, writes its lockfile and starts serving.
async fn publish(
    reg: &Arc<Registry>,
    id: &str,
    dir: &Path,
    sockets: &Path,
) -> std::io::Result<Entry> {
    let Some(editor) = reg.editor(id) else {
        return Err(std::io::Error::other("the editor is gone"));
    };
    let name = lockfile::fresh_name()?;
    let socket = endpoint_path(sockets, name.trim_end_matches(".lock"));
    let listener = crate::platform::local::bind(&socket)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let entry = Entry {
        editor: Arc::downgrade(&editor),
        lock: dir.join(&name),
        socket,
        nonce: Token::generate()?,
        timestamp: now,
        extra: Vec::new(),
        stop: reg.accepting.child_token(),
    };
    let endpoint = Endpoint::new(
        reg.clone(),
        id.to_string(),
        entry.nonce.clone(),
        entry.stop.clone(),
    );
    reg.tracker
        .spawn(http::accept_loop(Arc::new(endpoint), listener));
    if let Err(e) = write(reg, id, &entry) {
        entry.withdraw();
        return Err(e);
    }
    Ok(entry)
}

/// Where the endpoint named `stem` listens: a socket in the broker's private dir `sockets`;
/// on Windows a named pipe `\\.\pipe\pi-ide-broker-copilot-<stem>` (owner-only, as the
/// broker's own: `platform::local::bind`), which Copilot CLI dials from the lockfile's
/// `socketPath` (Node's `http.request({socketPath})` takes a pipe name there).
fn endpoint_path(sockets: &Path, stem: &str) -> PathBuf {
    if cfg!(windows) {
        PathBuf::from(format!(r"\\.\pipe\pi-ide-broker-copilot-{stem}"))
    } else {
        sockets.join(format!("{stem}.sock"))
    }
}

/// Writes (in place) the lockfile of `entry` for editor `id` as it is now.
fn write(reg: &Registry, id: &str, entry: &Entry) -> std::io::Result<()> {
    let Some(body) = lockfile::body(reg, id, &entry.published()) else {
        return Err(std::io::Error::other("the editor is gone"));
    };
    lockfile::write_in_place(&entry.lock, &body)
}

/// The cwd of a session's process: the peer's (`pid`, from the kernel) where readable, else
/// the editor's first folder.
pub(crate) fn cwd_of(reg: &Registry, editor: &str, pid: Option<u32>) -> String {
    #[cfg(target_os = "linux")]
    if let Some(cwd) = pid.and_then(|p| std::fs::read_link(format!("/proc/{p}/cwd")).ok()) {
        return cwd.display().to_string();
    }
    let _ = pid;
    reg.editor(editor)
        .and_then(|e| e.folders.first().map(|f| f.display().to_string()))
        .unwrap_or_else(|| "/".into())
}

/// The lockfiles this broker published in `dir` (for `status`; a dead broker's are left
/// out): path, the editor it stands for, and the folders it lists.
pub fn list_ours(dir: &Path) -> Vec<(PathBuf, String, Vec<String>)> {
    lockfile::list(dir)
        .into_iter()
        .filter_map(|(name, v)| {
            let v = v.filter(|v| lockfile::broker_pid(v) == std::process::id())?;
            let editor = v
                .get(crate::frontdoor::per_editor::MARKER)?
                .get("editor")?
                .as_str()?
                .to_string();
            let folders = v
                .get("workspaceFolders")
                .and_then(serde_json::Value::as_array)
                .map(|f| {
                    f.iter()
                        .filter_map(|x| x.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            Some((dir.join(name), editor, folders))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without Copilot CLI's home the door waits (creating nothing), looking at each tick;
    /// once the home is made it goes on at the next one. Ticks are handed in (a channel of
    /// one: a send returns once the previous tick was taken and looked at), nothing sleeps.
    #[tokio::test]
    async fn the_door_waits_for_copilots_home_and_never_creates_it() {
        let root = tempfile::tempdir().unwrap();
        let home = root.path().join("copilot-home");
        let dir = home.join("ide");
        let cancel = CancellationToken::new();
        let (tick, mut ticks) = tokio::sync::mpsc::channel(1);
        let waiting = tokio::spawn({
            let (dir, cancel) = (dir.clone(), cancel.clone());
            async move { home_appears(&dir, &cancel, &mut ticks).await }
        });
        for _ in 0..3 {
            tick.send(()).await.unwrap();
        }
        assert!(!waiting.is_finished(), "no home: the door waits");
        assert!(!home.exists(), "the home is never created");
        std::fs::create_dir(&home).unwrap();
        // The tick still queued sees it (the door may be gone before this one is taken).
        let _ = tick.send(()).await;
        let went_on = crate::testkit::within("the door goes on", waiting).await;
        assert!(matches!(went_on, Ok(true)), "{went_on:?}");
        assert!(
            !dir.exists(),
            "the ide dir is made by the door's start, not here"
        );

        let stopped = CancellationToken::new();
        stopped.cancel();
        let never = root.path().join("never");
        assert!(!wait_for_home(&never.join("ide"), &stopped).await);
        assert!(!never.exists());
        assert!(
            wait_for_home(&dir, &stopped).await,
            "a home that exists: at once"
        );
    }

    /// The door as Copilot CLI meets it, on this platform's local transport (the lib tests
    /// also run under wine): a broker in-process, an editor; its lockfile names a Unix socket
    /// (`scheme: "unix"`) or, on Windows, a named pipe (`scheme: "pipe"`, `\\.\pipe\…`),
    /// which serves `initialize` and `tools/list` over HTTP with the lockfile's nonce.
    #[cfg(feature = "testkit")]
    #[test]
    fn the_lockfile_names_an_endpoint_that_serves_mcp_over_http() {
        // Its own runtime, shut down within a bound: a failed assert leaves the broker's
        // tasks behind, which would hold a plain test runtime's drop (seen under wine).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(serves_mcp_over_http())
        }));
        rt.shutdown_timeout(std::time::Duration::from_secs(5));
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    #[cfg(feature = "testkit")]
    async fn serves_mcp_over_http() {
        use crate::testkit::fake_editor::{FakeEditor, Options};
        use crate::testkit::{eventually, within, within_start};
        use http_body_util::{BodyExt, Full};
        use hyper::body::Bytes;
        use serde_json::{json, Value};

        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let copilot_home = r.join("copilot-home");
        std::fs::create_dir_all(&copilot_home).unwrap();
        std::fs::create_dir_all(r.join("pi-ide")).unwrap();
        let mut config = crate::sys::config::Config {
            lock_dirs: Some(vec![crate::sys::config::LockDirConfig {
                path: r.join("pi-ide"),
                family: crate::protocol::family::Family::Pi,
            }]),
            socket: Some(if cfg!(windows) {
                let n = lockfile::fresh_name().unwrap();
                PathBuf::from(format!(
                    r"\\.\pipe\pi-ide-broker-test-{}",
                    n.trim_end_matches(".lock")
                ))
            } else {
                r.join("run").join("sock")
            }),
            state_dir: Some(r.join("state")),
            home: Some(r.join("home")),
            ..crate::sys::config::Config::default()
        };
        config.edit_section(|s: &mut crate::frontdoor::compat::CompatConfig| s.enabled = false);
        config.edit_section(|s: &mut crate::frontdoor::gemini::GeminiConfig| s.enabled = false);
        config.edit_section(|s: &mut crate::frontdoor::codex::CodexConfig| s.enabled = false);
        config.edit_section(|s: &mut CopilotConfig| {
            s.enabled = true;
            s.editors = false;
            s.dir = Some(copilot_home.join("ide"));
        });
        let stop = CancellationToken::new();
        // A failed assert stops the broker too (its tasks would keep the runtime up).
        let _stop = stop.clone().drop_guard();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let serving = tokio::spawn(crate::broker::serve(config, stop.clone(), move |_, _| {
            let _ = tx.send(());
        }));
        within_start("the broker ready", rx).await.unwrap();
        let folder = if cfg!(windows) { r"C:\proj" } else { "/proj" };
        let _editor = FakeEditor::start_in(&r.join("pi-ide"), Options::pi(&[folder]))
            .await
            .unwrap();
        let ide = copilot_home.join("ide");
        let lock: Value = eventually("the copilot lockfile", || {
            let e = std::fs::read_dir(&ide)
                .ok()?
                .flatten()
                .find(|e| e.file_name().to_string_lossy().ends_with(".lock"))?;
            serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()
        })
        .await;
        assert_eq!(lock["workspaceFolders"], json!([folder]), "{lock}");
        let socket = lock["socketPath"].as_str().unwrap().to_string();
        if cfg!(windows) {
            assert_eq!(lock["scheme"], "pipe", "{lock}");
            assert!(
                socket.starts_with(r"\\.\pipe\pi-ide-broker-copilot-"),
                "{lock}"
            );
        } else {
            assert_eq!(lock["scheme"], "unix", "{lock}");
        }
        let auth = lock["headers"]["Authorization"]
            .as_str()
            .unwrap()
            .to_string();

        let post = |body: Value, session: Option<String>| {
            let (socket, auth) = (socket.clone(), auth.clone());
            async move {
                let stream = crate::platform::local::connect(Path::new(&socket))
                    .await
                    .unwrap();
                let (mut send, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                        .await
                        .unwrap();
                tokio::spawn(conn);
                let mut req = hyper::Request::post("/mcp")
                    .header("host", "localhost")
                    .header("authorization", auth)
                    .header("content-type", "application/json")
                    .header("accept", "application/json, text/event-stream");
                if let Some(s) = session {
                    req = req.header("mcp-session-id", s);
                }
                let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
                let r = send.send_request(req).await.unwrap();
                let id = r
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                    .map(String::from);
                let bytes = r.into_body().collect().await.unwrap().to_bytes();
                (
                    id,
                    serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null),
                )
            }
        };
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "copilot-cli", "version": "1.0.102"}}});
        let (session, v) = within("initialize", post(init, None)).await;
        assert_eq!(v["result"]["protocolVersion"], "2025-11-25", "{v}");
        assert!(session.is_some(), "an mcp-session-id");
        let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}});
        let (_, v) = within("tools/list", post(list, session)).await;
        assert_eq!(v["result"]["tools"][0]["name"], "get_selection", "{v}");
        stop.cancel();
        within("the broker stopped", serving)
            .await
            .unwrap()
            .unwrap();
    }
}
