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

use super::per_editor::{self, Entry, PerEditor};
use crate::protocol::family::Family;
use crate::registry::limits::HandshakeSlot;
use crate::registry::Registry;
use crate::session::{Door, Intro};
use crate::sys::secret::Token;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The field that marks a virtual lockfile as written by a pi-ide-broker (the lock dir
/// watcher skips such files, so a broker never dials itself).
pub const MARKER: &str = per_editor::MARKER;

/// The compat door's part of an entry: nothing beyond the common one (the token is in the
/// file, and read back from it on a refresh).
struct Compat {
    dir: PathBuf,
}

impl PerEditor for Compat {
    type Door = ();
    const WHAT: &'static str = "compat entry";

    /// Mints a token, writes the virtual lockfile and starts accepting.
    fn publish(
        &self,
        reg: &Arc<Registry>,
        id: &str,
        listener: TcpListener,
        stop: CancellationToken,
    ) -> std::io::Result<Entry<()>> {
        let port = listener.local_addr()?.port();
        let token = Token::generate()?;
        let path = self.dir.join(format!("{port}.lock"));
        write_entry(reg, id, &path, Some(&token))?;
        reg.tracker.spawn(accept_loop(
            reg.clone(),
            id.to_string(),
            listener,
            token,
            stop.clone(),
        ));
        Ok(Entry {
            port,
            files: vec![path],
            stop,
            door: (),
        })
    }

    /// A successor: same port and token; folders and name refreshed.
    fn refresh(&self, reg: &Registry, id: &str, entry: &mut Entry<()>) -> std::io::Result<()> {
        match entry.files.first() {
            Some(path) => write_entry(reg, id, path, None),
            None => Ok(()),
        }
    }
}

/// Runs the compat door until the broker stops, then removes every entry.
pub async fn run(reg: Arc<Registry>, dir: PathBuf) {
    if let Err(e) = crate::platform::local::secure_dir(&dir) {
        tracing::error!(error = %e, "compat door disabled");
        return;
    }
    clean_leftovers(&dir);
    per_editor::run(reg, Compat { dir }).await;
}

/// Removes virtual lockfiles left by a broker that died: ours by marker, with a dead pid.
fn clean_leftovers(dir: &Path) {
    per_editor::clean_leftovers(
        dir,
        |name| name.ends_with(".lock"),
        |v| {
            v.get("pid")
                .and_then(Value::as_u64)
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or(0)
        },
    );
}

/// Writes (atomically, 0600, not flushed to disk) the virtual lockfile for editor `id`.
/// `token` is `None` when refreshing: the token already in the file is kept.
fn write_entry(
    reg: &Registry,
    id: &str,
    path: &Path,
    token: Option<&Token>,
) -> std::io::Result<()> {
    let Some(editor) = reg.editor(id) else {
        return Ok(());
    };
    let lock = editor.lockfile();
    let token = match token {
        Some(t) => t.expose().to_string(),
        None => {
            let old: Value = serde_json::from_str(&std::fs::read_to_string(path)?)
                .map_err(std::io::Error::other)?;
            old.get("authToken")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        }
    };
    let body = json!({
        "pid": std::process::id(),
        "workspaceFolders": per_editor::folders(&editor, &lock),
        "ideName": lock.ide_name,
        "transport": "ws",
        "authToken": token,
        MARKER: {"editor": id, "family": editor.family},
    });
    crate::registry::state::write_atomic_unsynced(path, body.to_string().as_bytes())
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
            Ok((key, dialect, mcp)) => match reg.limits.session("compat") {
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
                                let intro = intro(&reg, id, dialect);
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

/// What a compat session starts with: pinned to editor `id`, in the client's dialect.
fn intro(reg: &Registry, id: String, dialect: Family) -> Intro {
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
        dialect,
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
/// before the upgrade, like the editors do. The key, the dialect the header names, and
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

    fn enabled(&self, config: &crate::sys::config::Config) -> bool {
        config.compat.enabled
    }

    fn run(&self, reg: Arc<Registry>) -> super::plugin::DoorTask {
        let dir = reg.config().compat_dir();
        if reg.config().lock_dirs().iter().any(|d| d.path == dir) {
            tracing::warn!(dir = %dir.display(), "the compat dir is also watched as a lock dir (is PI_IDE_LOCK_DIR exported to the broker or your editors?); set it for pi only, e.g. `PI_IDE_LOCK_DIR=~/.pi/ide-broker pi`");
        }
        Box::pin(run(reg, dir))
    }

    fn doctor(
        &self,
        config: &crate::sys::config::Config,
        _doors: Option<&serde_json::Map<String, Value>>,
    ) -> Vec<super::plugin::Check> {
        use super::plugin::{Check, Level};
        if !config.compat.enabled {
            let off = "the compat door is off ([compat] enabled = false)";
            return vec![Check::new("compat", Level::Ok, off)];
        }
        let dir = config.compat_dir();
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
}
