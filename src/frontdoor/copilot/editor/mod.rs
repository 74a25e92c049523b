//! Copilot Chat's VS Code server as an editor: the copilot family's editor side.
//!
//! VS Code's Copilot Chat extension (microsoft/vscode-copilot-chat,
//! `src/extension/chatSessions/copilotcli/vscode-node/`) writes `<uuid>.lock` in
//! `~/.copilot/ide` (`$XDG_STATE_HOME/.copilot/ide`) for Copilot CLI and serves MCP over
//! Streamable HTTP on a Unix socket: `get_selection`, `get_diagnostics`, `open_diff`
//! (Accept/Reject), `close_diff`, and `selection_changed` pushes. The broker watches those dirs
//! (`CopilotConfig::editor_dirs`), reads each lockfile as hostile (`found`; the copilot
//! door's own, which carry the broker's marker, are never linked), links to the server as one
//! more MCP client with its own session (`client`), and puts an adapter in front of it
//! (`adapter`): a loopback WebSocket listener speaking the Claude-family editor protocol,
//! announced by a Claude-family lockfile in the broker's private lock dir
//! (`copilot::editor_lock_dir`, 0700), which the lock dir watcher admits like any
//! editor's. Everything past admission (links, routing, diffs, sessions of every door) is the
//! core's, unchanged. When Copilot Chat's lockfile goes, or its pid dies, the adapter and its
//! lockfile go.

mod adapter;
mod client;
mod found;
mod map;

use crate::frontdoor::plugin::{AgentDoor, Check, DoorTask, Level};
use crate::registry::lifecycle::watch::LockEvent;
use crate::registry::Registry;
use crate::sys::config::{Config, LockDirConfig};
use adapter::Adapter;
use client::Upstream;
use found::{Found, Skip};
use notify::{RecursiveMode, Watcher as _};
use serde_json::json;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How often dirs that do not exist yet are looked for.
const MISSING_DIR_POLL: Duration = Duration::from_secs(1);
/// The broker's `initialize` with a server must be done within this long.
const LINK_WITHIN: Duration = Duration::from_secs(5);

/// The copilot family's editor side as the daemon sees it (`frontdoor::plugin`): its
/// switch is `[copilot] editors`.
pub struct CopilotEditors;

impl AgentDoor for CopilotEditors {
    fn name(&self) -> &'static str {
        "copilot-editors"
    }

    fn enabled(&self, config: &Config) -> bool {
        super::CopilotConfig::of(config).editors
    }

    fn run(&self, reg: Arc<Registry>) -> DoorTask {
        Box::pin(run(reg))
    }

    /// The private dir its adapters' Claude-family lockfiles go to, watched as the user's are.
    fn lock_dirs(&self, config: &Config) -> Vec<LockDirConfig> {
        vec![LockDirConfig {
            path: super::editor_lock_dir(config),
            family: crate::protocol::family::Family::Claude,
        }]
    }

    fn status(&self, reg: &Registry) -> serde_json::Map<String, serde_json::Value> {
        let linked: Vec<ChatEditor> = reg
            .editors()
            .iter()
            .filter(|e| is_adapter(reg, e))
            .filter_map(|e| ChatEditor::of(e))
            .collect();
        let mut m = serde_json::Map::new();
        m.insert(
            STATUS_KEY.into(),
            serde_json::to_value(linked).unwrap_or_default(),
        );
        m
    }

    fn status_text(&self, doors: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
        let linked: Vec<ChatEditor> =
            serde_json::from_value(doors.get(STATUS_KEY)?.clone()).ok()?;
        (!linked.is_empty()).then(|| render(&linked))
    }

    fn doctor(
        &self,
        config: &Config,
        _doors: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Vec<Check> {
        let section = super::CopilotConfig::of(config);
        if !section.editors {
            let off = "Copilot Chat's VS Code servers are not linked ([copilot] editors = false)";
            return vec![Check::new("copilot-editors", Level::Ok, off)];
        }
        let dirs: Vec<String> = section
            .editor_dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        let msg = format!(
            "Copilot Chat's VS Code servers are linked as editors (from {})",
            dirs.join(", ")
        );
        vec![Check::new("copilot-editors", Level::Ok, msg)]
    }
}

/// The status member of the editor side: the Copilot Chat servers linked as editors.
const STATUS_KEY: &str = "copilot_chat_editors";

/// A Copilot Chat VS Code server linked as an editor (`copilot_chat_editors` in the status
/// document): which editor it is, and the lockfile and socket it was found by.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatEditor {
    /// The editor's id (a row of the editors' table).
    pub editor: String,
    /// Copilot Chat's own lockfile (written by VS Code, not by the broker).
    pub lockfile: PathBuf,
    /// The socket its server listens on.
    pub socket: PathBuf,
}

impl ChatEditor {
    /// What the adapter's lockfile (the broker's, in its private lock dir) says of `e`.
    fn of(e: &crate::editor::Editor) -> Option<ChatEditor> {
        let text = std::fs::read_to_string(&e.lockfile().path).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        let chat = v.get("copilotChat")?;
        Some(ChatEditor {
            editor: e.id.clone(),
            lockfile: PathBuf::from(chat.get("lockfile")?.as_str()?),
            socket: PathBuf::from(chat.get("socket")?.as_str()?),
        })
    }
}

/// The lines `status` prints of the Copilot Chat servers linked as editors.
fn render(linked: &[ChatEditor]) -> String {
    let mut out = String::from(
        "\nCopilot Chat's VS Code servers, linked as editors (every agent's sessions may use them):\n",
    );
    for c in linked {
        let _ = writeln!(
            out,
            "  {} ← {} (Copilot Chat's lockfile; its socket {})",
            c.editor,
            c.lockfile.display(),
            c.socket.display()
        );
    }
    out
}

/// True when `editor` is one of the broker's Copilot Chat adapters (the copilot door
/// publishes none for them: Copilot CLI reads Copilot Chat's own lockfile).
pub fn is_adapter(reg: &Registry, editor: &crate::editor::Editor) -> bool {
    editor
        .lockfile()
        .path
        .starts_with(super::editor_lock_dir(&reg.config()))
}

/// A fresh random UUID (version 4), as Copilot CLI names its sessions.
pub(crate) fn uuid() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(std::io::Error::other)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

/// One linked server: its adapter and the Claude-family lockfile that announces it.
struct Linked {
    adapter: Arc<Adapter>,
    lock: PathBuf,
}

impl Linked {
    /// Withdraws it: the lockfile at once (the registry retires the editor), then the
    /// session ended (`DELETE`, bounded) and the adapter stopped.
    fn withdraw(self, reg: &Registry) {
        let _ = std::fs::remove_file(&self.lock);
        let a = self.adapter;
        reg.tracker.spawn(async move {
            a.up.close().await;
            a.stop.cancel();
        });
    }
}

/// The watcher of Copilot Chat's lockfiles and the adapters it keeps.
struct Watch {
    reg: Arc<Registry>,
    dirs: Vec<PathBuf>,
    lock_dir: PathBuf,
    watched: HashSet<PathBuf>,
    linked: HashMap<PathBuf, Linked>,
    /// The last refusal per file, so a bad file is logged once.
    refused: HashMap<PathBuf, String>,
    /// Files to read again (an adapter's event stream ended: its server may be gone).
    recheck: mpsc::UnboundedSender<PathBuf>,
}

/// Runs until the broker stops, then withdraws every adapter.
pub async fn run(reg: Arc<Registry>) {
    let config = reg.config();
    let lock_dir = super::editor_lock_dir(&config);
    if let Err(e) = crate::platform::local::secure_dir(&lock_dir) {
        tracing::error!(dir = %lock_dir.display(), error = %e, "Copilot Chat editors disabled");
        return;
    }
    sweep(&lock_dir);
    let (mut watcher, mut fs_rx) = match crate::sys::fswatch::watcher() {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "Copilot Chat editors disabled: cannot watch");
            return;
        }
    };
    let (recheck, mut rechecks) = mpsc::unbounded_channel();
    let mut w = Watch {
        reg: reg.clone(),
        dirs: super::CopilotConfig::of(&config).editor_dirs(),
        lock_dir,
        watched: HashSet::new(),
        linked: HashMap::new(),
        refused: HashMap::new(),
        recheck,
    };
    w.refresh_watches(&mut watcher);
    w.scan_all().await;
    let mut rescan =
        tokio::time::interval(Duration::from_millis(config.rescan_interval_ms.max(100)));
    rescan.tick().await;
    let mut poll = tokio::time::interval(MISSING_DIR_POLL);
    loop {
        tokio::select! {
            _ = reg.cancel.cancelled() => break,
            _ = rescan.tick() => w.scan_all().await,
            _ = poll.tick() => if w.refresh_watches(&mut watcher) { w.scan_all().await },
            Some(path) = rechecks.recv() => w.check(&path).await,
            Some(res) = fs_rx.recv() => {
                let mut paths = Vec::new();
                let mut all = w.event_paths(res, &mut paths);
                while let Ok(res) = fs_rx.try_recv() {
                    all |= w.event_paths(res, &mut paths);
                }
                if all {
                    w.refresh_watches(&mut watcher);
                    w.scan_all().await;
                } else {
                    paths.sort();
                    paths.dedup();
                    for p in paths {
                        w.check(&p).await;
                    }
                }
            }
        }
    }
    for (_, l) in w.linked.drain() {
        let _ = std::fs::remove_file(&l.lock);
        l.adapter.up.close().await;
        l.adapter.stop.cancel();
    }
}

/// Removes the lockfiles a broker that stopped or died left in the private lock dir (the
/// dir is the broker's alone).
fn sweep(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(".lock") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl Watch {
    /// Watches the dirs that exist and are not watched yet; true when one was added.
    fn refresh_watches(&mut self, watcher: &mut notify::RecommendedWatcher) -> bool {
        let mut added = false;
        for d in &self.dirs {
            if self.watched.contains(d) || !d.is_dir() {
                continue;
            }
            match watcher.watch(d, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(d.clone());
                    added = true;
                }
                Err(e) => {
                    tracing::debug!(dir = %d.display(), error = %e, "cannot watch a Copilot ide dir yet")
                }
            }
        }
        // A dir removed is watched again once it is back.
        self.watched.retain(|d| d.is_dir());
        added
    }

    /// The lockfile paths of a file-system event (into `out`); true when everything must be
    /// listed again (an error, an overflow, a dir itself changed).
    fn event_paths(&self, res: notify::Result<notify::Event>, out: &mut Vec<PathBuf>) -> bool {
        use notify::event::{AccessKind, AccessMode, EventKind};
        let Ok(event) = res else { return true };
        if matches!(
            event.kind,
            EventKind::Access(AccessKind::Open(_))
                | EventKind::Access(AccessKind::Close(AccessMode::Read))
        ) {
            return false;
        }
        if event.need_rescan() {
            return true;
        }
        let mut all = false;
        for p in event.paths {
            if self.dirs.contains(&p) {
                all = true;
            } else if p.parent().is_some_and(|d| self.dirs.iter().any(|x| x == d))
                && found::is_lock_name(&p)
            {
                out.push(p);
            }
        }
        all
    }

    /// Reads every lockfile of every dir, and those linked (gone ones are withdrawn).
    async fn scan_all(&mut self) {
        let mut paths: Vec<PathBuf> = self.linked.keys().cloned().collect();
        for d in &self.dirs {
            if let Ok(entries) = std::fs::read_dir(d) {
                paths.extend(
                    entries
                        .flatten()
                        .map(|e| e.path())
                        .filter(|p| found::is_lock_name(p)),
                );
            }
        }
        paths.sort();
        paths.dedup();
        for p in paths {
            self.check(&p).await;
        }
    }

    /// Reads one lockfile and links, relinks or withdraws its server.
    async fn check(&mut self, path: &Path) {
        match found::read(path) {
            Ok(f) => {
                if self.linked.get(path).is_some_and(|l| l.adapter.found == f) {
                    return;
                }
                if let Some(l) = self.linked.remove(path) {
                    tracing::info!(file = %path.display(), "Copilot Chat lockfile changed; linking it again");
                    l.withdraw(&self.reg);
                }
                match self.link(f).await {
                    Ok(l) => {
                        self.clear(path);
                        tracing::info!(file = %path.display(), editor_lockfile = %l.lock.display(), "Copilot Chat's VS Code server linked as an editor");
                        self.linked.insert(path.to_path_buf(), l);
                    }
                    Err(why) => self.refuse(path, why),
                }
            }
            Err(Skip::Ours) => self.unlink(path, "it is the broker's own"),
            Err(Skip::Transient) if std::fs::symlink_metadata(path).is_err() => {
                self.clear(path);
                self.unlink(path, "its lockfile was removed");
            }
            Err(Skip::Transient) => {}
            Err(Skip::Bad(why)) => {
                self.unlink(path, "its lockfile is no longer valid");
                self.refuse(path, why);
            }
        }
    }

    fn unlink(&mut self, path: &Path, why: &str) {
        if let Some(l) = self.linked.remove(path) {
            tracing::info!(file = %path.display(), "Copilot Chat editor withdrawn: {why}");
            l.withdraw(&self.reg);
        }
    }

    /// One log line per file and reason; `status` and `doctor` list it as a refused lockfile.
    fn refuse(&mut self, path: &Path, why: String) {
        if self.refused.get(path) != Some(&why) {
            tracing::warn!(file = %path.display(), reason = %why, "Copilot Chat lockfile not linked");
            self.reg.apply(LockEvent::Rejected(
                path.to_path_buf(),
                format!("Copilot Chat lockfile: {why}"),
            ));
            self.refused.insert(path.to_path_buf(), why);
        }
    }

    /// A refused file is fine now, or gone.
    fn clear(&mut self, path: &Path) {
        if self.refused.remove(path).is_some() {
            self.reg.apply(LockEvent::Cleared(path.to_path_buf()));
        }
    }

    /// Links to `f`'s server, starts its adapter and writes the adapter's lockfile.
    async fn link(&self, f: Found) -> Result<Linked, String> {
        let reg = &self.reg;
        let stop = reg.cancel.child_token();
        let up = Arc::new(Upstream::new(
            f.clone(),
            reg.config().max_frame_bytes,
            reg.tracker.clone(),
            stop.clone(),
        ));
        let init = tokio::time::timeout(LINK_WITHIN, up.initialize()).await;
        let fail = |why: String| {
            stop.cancel();
            why
        };
        match init {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(fail(e)),
            Err(_) => {
                return Err(fail(format!(
                    "the server did not answer initialize within {}s",
                    LINK_WITHIN.as_secs()
                )))
            }
        }
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| fail(format!("cannot listen on loopback: {e}")))?;
        let port = listener
            .local_addr()
            .map_err(|e| fail(e.to_string()))?
            .port();
        let adapter = Arc::new(
            Adapter::new(f, up, reg.tracker.clone(), stop.clone())
                .map_err(|e| fail(e.to_string()))?,
        );
        reg.tracker.spawn(adapter.clone().accept_loop(listener));
        reg.tracker
            .spawn(follow(adapter.clone(), self.recheck.clone()));
        let lock = self.lock_dir.join(format!("{port}.lock"));
        let f = &adapter.found;
        let body = json!({
            "pid": f.pid,
            "workspaceFolders": f.folders,
            "ideName": format!("{} (Copilot Chat)", f.ide_name),
            "transport": "ws",
            "authToken": adapter.token.expose(),
            "copilotChat": {"lockfile": f.path, "socket": f.socket},
        });
        if let Err(e) =
            crate::registry::state::write_atomic_unsynced(&lock, body.to_string().as_bytes())
        {
            let _ = std::fs::remove_file(&lock);
            return Err(fail(format!("cannot write {}: {e}", lock.display())));
        }
        Ok(Linked { adapter, lock })
    }
}

/// Follows the server's event stream for the adapter; when it ends, the watcher reads the
/// lockfile again (the server may be gone) and, while the adapter lives, it is opened again
/// (a session the server forgot is initialized anew).
async fn follow(adapter: Arc<Adapter>, recheck: mpsc::UnboundedSender<PathBuf>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut backoff = Duration::from_millis(100);
    loop {
        let opened = std::time::Instant::now();
        let ended = {
            let events = adapter.up.events(&tx);
            tokio::pin!(events);
            loop {
                tokio::select! {
                    r = &mut events => break r,
                    Some(m) = rx.recv() => adapter.pushed(&m),
                }
            }
        };
        while let Ok(m) = rx.try_recv() {
            adapter.pushed(&m);
        }
        if adapter.stop.is_cancelled() {
            return;
        }
        let _ = recheck.send(adapter.found.path.clone());
        if opened.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(100);
        }
        tokio::select! {
            _ = adapter.stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
        if let Err(e) = ended {
            tracing::debug!(error = %e, "Copilot Chat event stream refused; initializing again");
            let _ = tokio::time::timeout(LINK_WITHIN, adapter.up.initialize()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `status` prints of a Copilot Chat server linked as an editor: the editor's id and
    /// where it comes from (Copilot Chat's lockfile and socket).
    #[test]
    fn status_lines_say_where_a_copilot_chat_editor_comes_from() {
        let doc = json!({STATUS_KEY: [{"editor": "code-1", "lockfile": "/h/.copilot/ide/x.lock",
            "socket": "/tmp/mcp-1/mcp.sock"}]});
        let t = CopilotEditors
            .status_text(doc.as_object().unwrap())
            .unwrap();
        assert_eq!(
            t,
            "\nCopilot Chat's VS Code servers, linked as editors (every agent's sessions may use them):\n  code-1 ← /h/.copilot/ide/x.lock (Copilot Chat's lockfile; its socket /tmp/mcp-1/mcp.sock)\n"
        );
        let none = json!({STATUS_KEY: []});
        assert_eq!(CopilotEditors.status_text(none.as_object().unwrap()), None);
    }
}
