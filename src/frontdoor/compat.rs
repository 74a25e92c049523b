//! The compat door: a virtual lockfile and a loopback listener per editor, for pi-ide.
//!
//! For every live editor, a virtual lockfile `<port>.lock` in the broker's own lock dir and a
//! loopback WebSocket listener on that port, so the unmodified pi-ide extension (with
//! `PI_IDE_LOCK_DIR` pointed here) connects through the broker.
//!
//! An entry keeps its port and token across the editor's restarts (its id is stable), is
//! withdrawn when the editor is gone for good, and every entry is removed on shutdown.
//! Leftovers of a crashed broker carry our marker and a dead pid: they are cleaned at start.
//! Files without the marker are never touched.
//!
//! The same entries, in Claude Code's own lock dir (`[compat] claude`): a Claude lockfile per
//! editor that writes none of its own (pi-ide.nvim…), so an unmodified `claude` lists it in
//! `/ide` and has its edits reviewed there (its `openDiff` bridged to the editor's dialect).

use super::per_editor::{self, Entry, PerEditor};
use crate::protocol::family::Family;
use crate::registry::limits::HandshakeSlot;
use crate::registry::Registry;
use crate::session::{Door, Intro};
use crate::sys::config::{expand_home, home_dir, Config, Section};
use crate::sys::secret::Token;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The compat door: virtual lockfiles + loopback listeners the unmodified pi-ide extension
/// dials, and Claude lockfiles Claude Code's own `/ide` lists.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompatConfig {
    /// Publish virtual lockfiles for pi-ide at all.
    pub enabled: bool,
    /// Where they go; point `PI_IDE_LOCK_DIR` here. `None` means `~/.pi/ide-broker`.
    pub lock_dir: Option<PathBuf>,
    /// Publish a Claude lockfile for each editor that writes none of its own (pi-ide.nvim…),
    /// so Claude Code's own `/ide` lists it.
    pub claude: bool,
    /// Where those go; `None` means the first lock dir of family `claude` (by default
    /// `$CLAUDE_CONFIG_DIR/ide`, else `~/.claude/ide`), where Claude Code looks.
    pub claude_dir: Option<PathBuf>,
}

impl Default for CompatConfig {
    fn default() -> Self {
        CompatConfig {
            enabled: true,
            lock_dir: None,
            claude: true,
            claude_dir: None,
        }
    }
}

impl Section for CompatConfig {
    const NAME: &'static str = "compat";
}

impl CompatConfig {
    /// This door's section of `config`.
    pub fn of(config: &Config) -> CompatConfig {
        config.section()
    }

    /// The compat lock dir (`compat.lock_dir`, default `~/.pi/ide-broker`).
    pub fn dir(&self) -> PathBuf {
        match &self.lock_dir {
            Some(p) => expand_home(p),
            None => home_dir().join(".pi").join("ide-broker"),
        }
    }
}

/// The field that marks a virtual lockfile as written by a pi-ide-broker (the lock dir
/// watcher skips such files, so a broker never dials itself).
pub const MARKER: &str = per_editor::MARKER;

/// What a dir of the compat door holds: virtual lockfiles for pi-ide (`PI_IDE_LOCK_DIR`), or
/// Claude lockfiles in Claude Code's own lock dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pi,
    Claude,
}

/// One dir the compat door publishes into. An entry's own part is its token.
struct Compat {
    dir: PathBuf,
    kind: Kind,
    /// For Claude lockfiles: the dirs Claude Code reads, where an editor may have its own.
    claude_code_dirs: Vec<PathBuf>,
}

impl PerEditor for Compat {
    type Door = Token;
    const WHAT: &'static str = "compat entry";

    /// Mints a token, writes the lockfile and starts accepting. A port whose `<port>.lock` is
    /// there already (some other program's, never overwritten) is traded for another.
    fn publish(
        &self,
        reg: &Arc<Registry>,
        id: &str,
        mut listener: TcpListener,
        stop: CancellationToken,
    ) -> std::io::Result<Entry<Token>> {
        let mut tries = 0;
        let (port, path) = loop {
            let port = listener.local_addr()?.port();
            let path = self.dir.join(format!("{port}.lock"));
            if std::fs::symlink_metadata(&path).is_err() {
                break (port, path);
            }
            tries += 1;
            if tries > 8 {
                return Err(std::io::Error::other("every port tried has a lockfile"));
            }
            listener = per_editor::loopback_listener()?;
        };
        let token = Token::generate()?;
        self.write_entry(reg, id, &path, &token)?;
        reg.tracker.spawn(accept_loop(
            reg.clone(),
            id.to_string(),
            listener,
            token.clone(),
            stop.clone(),
        ));
        Ok(Entry {
            port,
            files: vec![path],
            stop,
            door: token,
        })
    }

    /// A successor: same port and token; folders, name and pid refreshed.
    fn refresh(&self, reg: &Registry, id: &str, entry: &mut Entry<Token>) -> std::io::Result<()> {
        match entry.files.first() {
            Some(path) => self.write_entry(reg, id, path, &entry.door),
            None => Ok(()),
        }
    }

    /// Claude lockfiles only for editors without one of their own: not an editor found in a
    /// dir Claude Code reads, nor one whose process wrote a lockfile there (a VS Code with
    /// both pi-ide and Claude Code, a Neovim with both plugins). Every editor for pi-ide.
    fn wants(&self, reg: &Registry, id: &str) -> bool {
        if self.kind == Kind::Pi {
            return true;
        }
        let Some(editor) = reg.editor(id) else {
            return true; // lost, its successor awaited: the entry stays as it is
        };
        let me = editor.lockfile();
        !reg.editors().iter().any(|e| {
            let l = e.lockfile();
            let same = e.id == id
                || (l.pid != 0 && l.pid == me.pid && l.wsl.is_some() == me.wsl.is_some());
            same && (l.path.parent()).is_some_and(|d| self.claude_code_dirs.iter().any(|c| c == d))
        })
    }
}

impl Compat {
    /// Writes (atomically, 0600, not flushed to disk) the lockfile for editor `id`: for pi-ide
    /// the broker's pid and the editor's name; for Claude Code the editor's pid (Claude Code,
    /// in an IDE's terminal, lists only its ancestors'; it deletes a file whose pid is dead)
    /// and a name that says it goes through the broker. The marker holds the broker's pid.
    fn write_entry(
        &self,
        reg: &Registry,
        id: &str,
        path: &Path,
        token: &Token,
    ) -> std::io::Result<()> {
        let Some(editor) = reg.editor(id) else {
            return Ok(());
        };
        let lock = editor.lockfile();
        let broker = std::process::id();
        let (pid, name) = match self.kind {
            Kind::Pi => (broker, lock.ide_name.clone()),
            Kind::Claude => (lock.pid, format!("{} (via pi-ide-broker)", lock.ide_name)),
        };
        let body = json!({
            "pid": pid,
            "workspaceFolders": per_editor::folders(&editor, &lock),
            "ideName": name,
            "transport": "ws",
            "authToken": token.expose(),
            MARKER: {"editor": id, "family": editor.family, "pid": broker},
        });
        crate::registry::state::write_atomic_unsynced(path, body.to_string().as_bytes())
    }
}

/// Claude Code's lock dir, where Claude lockfiles go: `compat.claude_dir`, else the first lock
/// dir of family `claude` (by default `$CLAUDE_CONFIG_DIR/ide`, else `~/.claude/ide`); none
/// when the lock dirs configured have no Claude one.
fn claude_dir(config: &Config) -> Option<PathBuf> {
    if let Some(p) = &CompatConfig::of(config).claude_dir {
        return Some(expand_home(p));
    }
    (config.lock_dirs().into_iter())
        .find(|d| d.family == Family::Claude)
        .map(|d| d.path)
}

/// The dirs Claude Code reads lockfiles from: [`claude_dir`], and inside WSL the Windows
/// user's `.claude/ide` too (Claude Code in WSL lists Windows editors).
fn claude_code_dirs(config: &Config) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = claude_dir(config).into_iter().collect();
    if let Some(win) = crate::sys::wsl::windows_home() {
        dirs.push(win.join(".claude").join("ide"));
    }
    dirs
}

/// Runs the compat door until the broker stops, then removes every entry: pi-ide's virtual
/// lockfiles in `pi` and Claude lockfiles in `claude`, each when given.
pub async fn run(reg: Arc<Registry>, pi: Option<PathBuf>, claude: Option<PathBuf>) {
    let claude_code_dirs = claude_code_dirs(&reg.config());
    let pi = pi.filter(|dir| match crate::platform::local::secure_dir(dir) {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(error = %e, "compat door disabled");
            false
        }
    });
    let claude = claude.filter(|dir| match claude_dir_ready(dir) {
        Ok(ready) => ready,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "no Claude lockfiles");
            false
        }
    });
    let door = |dir: Option<PathBuf>, kind| {
        let reg = reg.clone();
        let claude_code_dirs = claude_code_dirs.clone();
        async move {
            if let Some(dir) = dir {
                clean_leftovers(&dir);
                let door = Compat {
                    dir,
                    kind,
                    claude_code_dirs,
                };
                per_editor::run(reg, door).await;
            }
        }
    };
    tokio::join!(door(pi, Kind::Pi), door(claude, Kind::Claude));
}

/// Claude Code's lock dir, ready for Claude lockfiles: taken when it is there (ours, not
/// writable by others; never chmodded: it is Claude Code's), made (0700) when only its parent
/// is (Claude Code has a home here), and `false` when neither is: a HOME that never had
/// Claude gets no `~/.claude` (as the lock dir watcher promises).
fn claude_dir_ready(dir: &Path) -> Result<bool, String> {
    match std::fs::metadata(dir) {
        Ok(meta) => per_editor::check_private_dir(dir, &meta).map(|()| true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !dir.parent().is_some_and(Path::is_dir) {
                tracing::info!(dir = %dir.display(), "no Claude Code home here: no Claude lockfiles");
                return Ok(false);
            }
            crate::platform::local::secure_dir(dir).map_err(|e| e.to_string())?;
            Ok(true)
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Removes lockfiles left by a broker that died: ours by marker, with a dead pid (the
/// marker's; the file's own in a pi-ide entry written before the marker held one).
fn clean_leftovers(dir: &Path) {
    per_editor::clean_leftovers(dir, is_lock_name, |v| {
        v[MARKER]
            .get("pid")
            .or_else(|| v.get("pid"))
            .and_then(Value::as_u64)
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0)
    });
}

/// True for a lockfile's name (`<digits>.lock`).
fn is_lock_name(name: &str) -> bool {
    name.strip_suffix(".lock")
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

async fn accept_loop(
    reg: Arc<Registry>,
    id: String,
    listener: TcpListener,
    token: Token,
    stop: CancellationToken,
) {
    let token = Arc::new(token);
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => r,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "compat accept failed; retrying in 100 ms");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let in_handshake = reg.limits.handshake("compat").await;
        let _ = stream.set_nodelay(true);
        reg.clone().tracker.spawn(connection(
            reg.clone(),
            id.clone(),
            stream,
            token.clone(),
            in_handshake,
        ));
    }
}

/// One compat connection: the upgrade (hyper), then the session on the socket it hands back.
async fn connection(
    reg: Arc<Registry>,
    id: String,
    stream: TcpStream,
    token: Arc<Token>,
    in_handshake: HandshakeSlot,
) {
    // The handshake place is held until the upgrade is done (or the connection ends); a
    // connection that holds it too long, or whose place a newer one took, is closed.
    let closer = in_handshake.closer();
    let heard = in_handshake.heard();
    let place = Arc::new(std::sync::Mutex::new(Some(in_handshake)));
    let cancel = reg.cancel.clone();
    let editor = id.clone();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let answer = match check_upgrade(&req, &token) {
            Err(refused) => refused,
            Ok((key, family, mcp)) => match reg.limits.session("compat") {
                None => refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "too many sessions (max_sessions)",
                ),
                Some(session_place) => {
                    let on_upgrade = hyper::upgrade::on(&mut req);
                    let (reg, id, place) = (reg.clone(), editor.clone(), place.clone());
                    reg.clone().tracker.spawn(async move {
                        let up = on_upgrade.await;
                        crate::platform::sync::lock(&place).take();
                        match up {
                            Ok(up) => {
                                let intro = intro(&reg, id, family);
                                super::run_upgraded::<TcpStream>(
                                    reg,
                                    up,
                                    super::Upgraded::Session(intro),
                                )
                                .await;
                            }
                            Err(e) => tracing::debug!(error = %e, "compat upgrade failed"),
                        }
                        drop(session_place);
                    });
                    super::switching_protocols(&key, mcp)
                }
            },
        };
        async move { Ok::<_, Infallible>(answer) }
    });
    let conn = super::serve_http(stream, &heard, svc);
    tokio::select! {
        // pi-ide probes the port with a bare connect-and-close: not worth a warning.
        r = conn => if let Err(e) = r { tracing::debug!(editor = %id, error = %e, "compat handshake not completed") },
        why = closer => tracing::debug!(editor = %id, reason = why, "compat connection closed in its handshake"),
        _ = cancel.cancelled() => {}
    }
}

/// What a compat session starts with: pinned to editor `id`, speaking `family`'s tools.
fn intro(reg: &Registry, id: String, family: Family) -> Intro {
    let cwd = reg
        .editor(&id)
        .and_then(|e| e.folders.first().map(|f| f.display().to_string()))
        .unwrap_or_else(|| "/".into());
    Intro {
        door: Door::Compat,
        cwd,
        key: None,
        editor: Some(id),
        inherit: None,
        pinned: true,
        remote: None,
        family,
        client: None,
        realm: None,
    }
}

/// A refused upgrade, worded as the editors word theirs; the connection closes after it.
fn refuse(status: StatusCode, reason: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(format!(
        "Bad WebSocket upgrade request: {reason}"
    ))));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// Refuses browsers (any `Origin`), then checks the token (constant time) from either header
/// before the upgrade, like the editors do. The key, the family the header names, and
/// whether subprotocol `mcp` was offered.
#[allow(clippy::result_large_err)] // the refusal is the response itself
fn check_upgrade(
    req: &Request<Incoming>,
    token: &Token,
) -> Result<(String, Family, bool), Response<Full<Bytes>>> {
    let h = req.headers();
    if h.contains_key(header::ORIGIN) {
        tracing::warn!("refused a compat connection carrying an Origin header (browser?)");
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "requests with an Origin header are refused",
        ));
    }
    if req.method() != hyper::Method::GET {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "a WebSocket upgrade is a GET",
        ));
    }
    let key = super::websocket_key(h).map_err(|e| refuse(StatusCode::BAD_REQUEST, e))?;
    let (presented, family) = match (
        h.get(Family::Pi.auth_header()),
        h.get(Family::Claude.auth_header()),
    ) {
        (Some(v), _) => (v, Family::Pi),
        (None, Some(v)) => (v, Family::Claude),
        (None, None) => {
            tracing::info!("refused a compat connection without an auth header");
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "Missing authentication header",
            ));
        }
    };
    if !token.matches(presented.as_bytes()) {
        tracing::info!("refused a compat connection with a wrong token");
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "Invalid authentication token",
        ));
    }
    let mcp = super::offers_mcp(
        h.get(header::SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok()),
    );
    Ok((key, family, mcp))
}

/// The compat door as the daemon and `doctor` see it (`frontdoor::plugin`).
pub struct CompatDoor;

impl super::plugin::AgentDoor for CompatDoor {
    fn name(&self) -> &'static str {
        "compat"
    }

    fn section(&self) -> Option<crate::sys::config::SectionCheck> {
        Some(crate::sys::config::SectionCheck::of::<CompatConfig>())
    }

    fn enabled(&self, config: &Config) -> bool {
        let c = CompatConfig::of(config);
        c.enabled || c.claude
    }

    fn run(&self, reg: Arc<Registry>) -> super::plugin::DoorTask {
        let config = reg.config();
        let compat = CompatConfig::of(&config);
        let dir = compat.enabled.then(|| compat.dir());
        if let Some(dir) = dir
            .as_ref()
            .filter(|d| config.lock_dirs().iter().any(|l| l.path == **d))
        {
            tracing::warn!(dir = %dir.display(), "the compat dir is also watched as a lock dir (is PI_IDE_LOCK_DIR exported to the broker or your editors?); set it for pi only, e.g. `PI_IDE_LOCK_DIR=~/.pi/ide-broker pi`");
        }
        let claude = compat.claude.then(|| claude_dir(&config)).flatten();
        Box::pin(run(reg, dir, claude))
    }

    fn doctor(
        &self,
        config: &Config,
        _doors: Option<&serde_json::Map<String, Value>>,
    ) -> Vec<super::plugin::Check> {
        use super::plugin::{Check, Level};
        let mut checks = if CompatConfig::of(config).enabled {
            pi_checks(config)
        } else {
            let off = "the compat door is off for pi-ide ([compat] enabled = false)";
            vec![Check::new("compat", Level::Ok, off)]
        };
        checks.push(claude_check(config));
        checks
    }
}

/// `doctor`'s look at the pi-ide side: its entries, and a `PI_IDE_LOCK_DIR` set too widely.
fn pi_checks(config: &Config) -> Vec<super::plugin::Check> {
    use super::plugin::{Check, Level};
    let dir = CompatConfig::of(config).dir();
    let entries = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
                .count()
        })
        .unwrap_or(0);
    let mut checks = vec![Check::new(
        "compat",
        Level::Ok,
        format!(
            "{} holds {entries} entr{} for the published pi-ide extension",
            dir.display(),
            if entries == 1 { "y" } else { "ies" }
        ),
    )
    .with_fix(format!(
        "for pi with pi-ide only: PI_IDE_LOCK_DIR={} pi",
        dir.display()
    ))];
    if std::env::var_os("PI_IDE_LOCK_DIR").is_some_and(|v| Path::new(&v) == dir) {
        checks.push(Check::new(
            "compat",
            Level::Warn,
            "PI_IDE_LOCK_DIR points at the compat dir in this shell: pi-ide.nvim started from here would write its lockfile there too",
        ).with_fix("set it for pi only (alias pi='PI_IDE_LOCK_DIR=… pi'), not in your shell profile"));
    }
    checks
}

/// `doctor`'s look at the Claude side: how many Claude lockfiles the broker wrote, and where.
fn claude_check(config: &Config) -> super::plugin::Check {
    use super::plugin::{Check, Level};
    if !CompatConfig::of(config).claude {
        let off = "no Claude lockfiles for editors without their own ([compat] claude = false)";
        return Check::new("compat", Level::Ok, off);
    }
    let Some(dir) = claude_dir(config) else {
        let none = "no Claude lockfiles: no lock dir of family claude is configured";
        return Check::new("compat", Level::Ok, none);
    };
    if !dir.is_dir() && !dir.parent().is_some_and(Path::is_dir) {
        let none = format!(
            "no Claude Code home here ({} is missing): no Claude lockfiles are written",
            dir.parent().unwrap_or(&dir).display()
        );
        return Check::new("compat", Level::Ok, none);
    }
    let ours = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(is_lock_name))
        .filter(|e| per_editor::read_marked(&e.path()).is_some())
        .count();
    Check::new(
        "compat",
        Level::Ok,
        format!(
            "{} holds {ours} Claude lockfile{} of the broker's, for editors without their own (Claude Code's /ide lists them)",
            dir.display(),
            if ours == 1 { "" } else { "s" }
        ),
    )
}
