//! `status`: the JSON the daemon answers on `GET /v1/status` (built from the registry) and
//! the table the CLI prints from it. The JSON field names are a contract: add, never rename.

use crate::editor::{Editor, LinkState};
use crate::family::Family;
use crate::registry::Registry;
use crate::session::{Door, Session};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The status document (`GET /v1/status`): what the daemon serialises and the CLI reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The daemon itself.
    pub broker: BrokerStatus,
    /// Every editor with a validated lockfile, by id.
    pub editors: Vec<EditorStatus>,
    /// Every connected session, by id.
    pub sessions: Vec<SessionStatus>,
    /// Sticky targets, by session key.
    #[serde(default)]
    pub sticky: Vec<StickyStatus>,
    /// Files in the lock dirs that are not usable lockfiles, and why.
    #[serde(default)]
    pub lockfiles_rejected: Vec<RejectedLockfile>,
    /// The gemini door's discovery files (Gemini CLI reads them), one per editor.
    #[serde(default)]
    pub gemini_files: Vec<GeminiFile>,
}

/// A discovery file the gemini door published.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GeminiFile {
    /// The file.
    pub path: PathBuf,
    /// The editor it stands for.
    pub editor: String,
}

/// A file the broker refused as a lockfile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RejectedLockfile {
    /// The file.
    pub path: PathBuf,
    /// Why, in words (e.g. "names pid 123, which is not running (stale lockfile)").
    pub reason: String,
    /// Unix seconds since it was refused for that reason.
    pub since: u64,
}

/// The daemon's own line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrokerStatus {
    /// Its pid.
    pub pid: u32,
    /// Its version.
    pub version: String,
    /// Its socket.
    pub socket: PathBuf,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// Other uids allowed on the socket (`allow_uids`).
    #[serde(default)]
    pub allow_uids: Vec<u32>,
}

/// One editor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EditorStatus {
    /// Its id (stable for its process and its successors).
    pub id: String,
    /// `ideName` from its lockfile.
    pub ide_name: String,
    /// Its family.
    pub family: Family,
    /// Its lockfile.
    pub lockfile: PathBuf,
    /// The port it listens on.
    pub port: u16,
    /// Its pid.
    pub pid: u32,
    /// Workspace folders as written.
    pub workspace_folders: Vec<String>,
    /// Link state.
    pub state: LinkState,
    /// Round trip of the last ping, in ms.
    pub rtt_ms: Option<f64>,
    /// Unix seconds since the link is up.
    pub connected_since: Option<u64>,
    /// How many successions its id has seen.
    pub restarts: u32,
    /// The port of the editor it succeeded.
    #[serde(default)]
    pub previous_port: Option<u16>,
    /// The pid of the editor it succeeded.
    #[serde(default)]
    pub previous_pid: Option<u32>,
    /// The names in its `tools/list`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Sessions attached to it.
    pub sessions: usize,
    /// True when its lockfile has no token (Emacs's claude-code-ide.el): dialled without the
    /// auth header.
    #[serde(default)]
    pub no_token: bool,
    /// Why it is in its state when the state alone does not say (`taken`: who holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
}

/// One session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// Broker-assigned id.
    pub id: u64,
    /// The door it came through.
    pub door: Door,
    /// Its cwd as given.
    pub cwd: String,
    /// Its sticky key.
    pub key: Option<String>,
    /// The attached editor.
    pub editor: Option<String>,
    /// Unix seconds since it connected.
    pub since: u64,
    /// The dialect it speaks.
    pub dialect: Family,
    /// True when its dialect differs from its editor's family.
    #[serde(default)]
    pub bridged: bool,
    /// The `[[remote]]` it runs on, if elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// Its cwd on this machine (a remote session's cwd mapped), as routing uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cwd: Option<String>,
    /// Calls waiting for the editor: diffs first, then oldest first.
    #[serde(default)]
    pub in_flight: Vec<InFlight>,
    /// What the client says it is (name, version, protocol revision), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<crate::version::ClientInfo>,
}

/// One call waiting for an editor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// The JSON-RPC method.
    pub method: String,
    /// The tool, for `tools/call`.
    pub tool: Option<String>,
    /// Seconds it has waited.
    pub age_s: u64,
}

/// One sticky target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StickyStatus {
    /// The session key.
    pub key: String,
    /// The editor id.
    pub editor: String,
    /// Unix seconds when it was set.
    pub since: u64,
}

/// The full status document.
pub fn status(reg: &Registry) -> Status {
    let all_sessions = reg.sessions();
    let all_editors = reg.editors();
    let mut editors: Vec<EditorStatus> = all_editors
        .iter()
        .map(|e| editor_status(e, &all_sessions))
        .collect();
    editors.sort_by(|a, b| a.id.cmp(&b.id));
    let mut sessions: Vec<SessionStatus> = all_sessions
        .iter()
        .map(|s| session_status(reg, s, &all_editors))
        .collect();
    sessions.sort_by_key(|s| s.id);
    let sticky = reg
        .state
        .all_sticky()
        .into_iter()
        .map(|(key, t)| StickyStatus {
            key,
            editor: t.editor,
            since: t.since,
        })
        .collect();
    Status {
        broker: BrokerStatus {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            socket: reg.socket.clone(),
            uptime_s: reg.started_at.elapsed().map(|d| d.as_secs()).unwrap_or(0),
            allow_uids: reg.config().allow_uids.clone(),
        },
        editors,
        sessions,
        sticky,
        lockfiles_rejected: reg
            .rejected_lockfiles()
            .into_iter()
            .map(|(path, reason, since)| RejectedLockfile {
                path,
                reason,
                since,
            })
            .collect(),
        gemini_files: gemini_files(reg),
    }
}

/// One editor's entry: its lockfile, its link, and how many of `sessions` are on it.
fn editor_status(e: &Editor, sessions: &[Arc<Session>]) -> EditorStatus {
    let l = e.lockfile();
    let link = e.link_info();
    EditorStatus {
        id: e.id.clone(),
        ide_name: l.ide_name.clone(),
        family: e.family,
        lockfile: l.path.clone(),
        port: l.port,
        pid: l.pid,
        workspace_folders: l.workspace_folders.clone(),
        state: link.state,
        rtt_ms: link
            .rtt
            .map(|d| (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0),
        connected_since: link.connected_since.map(unix),
        restarts: e.restarts,
        previous_port: e.previous_port,
        previous_pid: e.previous_pid,
        tools: e.tool_names().unwrap_or_default(),
        sessions: sessions
            .iter()
            .filter(|s| s.editor_id().as_deref() == Some(e.id.as_str()))
            .count(),
        no_token: l.auth_token.is_none(),
        state_reason: matches!(link.state, LinkState::Taken | LinkState::Ready)
            .then_some(link.reason)
            .flatten(),
    }
}

/// One session's entry, with its calls in flight on any of `editors` (diffs first, then the
/// oldest first).
fn session_status(reg: &Registry, s: &Session, editors: &[Arc<Editor>]) -> SessionStatus {
    let mut in_flight: Vec<(bool, InFlight)> = Vec::new();
    for e in editors {
        for c in e.calls_of(s.id) {
            in_flight.push((
                c.diff,
                InFlight {
                    method: c.method,
                    tool: c.tool,
                    age_s: c.age.as_secs(),
                },
            ));
        }
    }
    in_flight.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.age_s.cmp(&a.1.age_s)));
    let editor = s.editor_id();
    let bridged = editor
        .as_deref()
        .and_then(|id| reg.editor(id).map(|e| e.family != s.dialect))
        .unwrap_or(false);
    SessionStatus {
        id: s.id,
        door: s.door,
        cwd: s.cwd_raw.clone(),
        key: s.key.clone(),
        editor: editor.map(|e| e.to_string()),
        since: unix(s.since),
        dialect: s.dialect,
        bridged,
        remote: s.remote.as_ref().map(|(n, _)| n.clone()),
        host_cwd: s.remote.as_ref().map(|_| s.cwd.display().to_string()),
        in_flight: in_flight.into_iter().map(|(_, v)| v).collect(),
        client: s.client.clone(),
    }
}

/// The discovery files of this broker's gemini door (ours by marker).
fn gemini_files(reg: &Registry) -> Vec<GeminiFile> {
    let config = reg.config();
    if !config.gemini.enabled {
        return Vec::new();
    }
    let dir = config.gemini_dir();
    crate::frontdoor::gemini::list_files(&dir)
        .into_iter()
        .filter_map(|(name, editor)| {
            Some(GeminiFile {
                path: dir.join(name),
                editor: editor?,
            })
        })
        .collect()
}

/// What changed between two status documents, one line per change a person cares about
/// (editors appearing, going, changing state; sessions connecting, attaching, leaving; calls
/// in flight): what `status --watch` prints when its output is not a terminal.
pub fn changes(prev: &Status, next: &Status) -> Vec<String> {
    let mut out = editor_changes(prev, next);
    out.extend(session_changes(prev, next));
    if prev.lockfiles_rejected.len() != next.lockfiles_rejected.len() {
        let n = next.lockfiles_rejected.len();
        out.push(format!(
            "{n} lockfile{} ignored — run `pi-ide-broker doctor`",
            if n == 1 { "" } else { "s" }
        ));
    }
    out
}

/// Editors that appeared, changed state or port, or went.
fn editor_changes(prev: &Status, next: &Status) -> Vec<String> {
    let state = |s: &LinkState| json_name(s);
    let mut out = Vec::new();
    for e in &next.editors {
        match prev.editors.iter().find(|p| p.id == e.id) {
            None => out.push(format!(
                "editor {} appeared: {} {} (pid {}, port {}), {}",
                e.id,
                e.ide_name,
                e.workspace_folders.join(", "),
                e.pid,
                e.port,
                state(&e.state)
            )),
            Some(p) if p.state != e.state || p.port != e.port => out.push(format!(
                "editor {} {} → {} (port {})",
                e.id,
                state(&p.state),
                state(&e.state),
                e.port
            )),
            Some(_) => {}
        }
    }
    for p in &prev.editors {
        if !next.editors.iter().any(|e| e.id == p.id) {
            out.push(format!("editor {} gone", p.id));
        }
    }
    out
}

/// Sessions that connected, were attached, detached or moved, changed their calls in flight,
/// or closed.
fn session_changes(prev: &Status, next: &Status) -> Vec<String> {
    let mut out = Vec::new();
    for s in &next.sessions {
        let before = prev.sessions.iter().find(|p| p.id == s.id);
        if before.is_none() {
            let door = json_name(&s.door);
            out.push(format!(
                "session {} connected ({door}, cwd {})",
                s.id, s.cwd
            ));
        }
        match (
            before.and_then(|p| p.editor.as_deref()),
            s.editor.as_deref(),
        ) {
            (None, Some(e)) => out.push(format!("session {} attached to {e}", s.id)),
            (Some(_), None) => out.push(format!("session {} detached", s.id)),
            (Some(a), Some(b)) if a != b => out.push(format!("session {} moved to {b}", s.id)),
            _ => {}
        }
        let (was, now) = (before.map_or(0, |p| p.in_flight.len()), s.in_flight.len());
        if was != now {
            let plural = if now == 1 { "" } else { "s" };
            out.push(format!("session {}: {now} call{plural} in flight", s.id));
        }
    }
    for p in &prev.sessions {
        if !next.sessions.iter().any(|s| s.id == p.id) {
            out.push(format!("session {} closed", p.id));
        }
    }
    out
}

/// "3m12s"-style age.
fn age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map(T::to_string).unwrap_or_else(|| "-".into())
}

fn json_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

/// The table a person reads at a glance; `now` is unix seconds (a parameter for snapshot tests).
pub fn render(status: &Status, now: u64) -> String {
    let mut out = String::new();
    let b = &status.broker;
    let _ = writeln!(
        out,
        "pi-ide-broker {} · pid {} · up {} · socket {}",
        b.version,
        b.pid,
        age(b.uptime_s),
        b.socket.display()
    );
    if status.editors.is_empty() {
        out.push_str("\nNo editors found. Start an editor with pi-ide or Claude Code integration; its lockfile appears in ~/.pi/ide or ~/.claude/ide.\n");
    } else {
        out.push_str(&editor_table(status, now));
    }
    let loose: Vec<&SessionStatus> = status
        .sessions
        .iter()
        .filter(|x| x.editor.is_none())
        .collect();
    if !loose.is_empty() {
        out.push_str("\nUnattached sessions:\n");
        for sess in loose {
            out.push_str(&session_line(sess, now));
        }
    }
    if !status.gemini_files.is_empty() {
        out.push_str("\nGemini CLI discovery files:\n");
        for f in &status.gemini_files {
            let _ = writeln!(out, "  {} → {}", f.editor, f.path.display());
        }
    }
    match status.lockfiles_rejected.len() {
        0 => {}
        1 => out.push_str("\n1 lockfile ignored — run `pi-ide-broker doctor`\n"),
        n => {
            let _ = writeln!(out, "\n{n} lockfiles ignored — run `pi-ide-broker doctor`");
        }
    }
    out
}

/// The editors as a table, each row followed by its notes and its sessions' lines.
fn editor_table(status: &Status, now: u64) -> String {
    const HEADER: [&str; 10] = [
        "EDITOR",
        "FAMILY",
        "PORT",
        "PID",
        "STATE",
        "RTT",
        "UP",
        "RESTARTS",
        "SESSIONS",
        "WORKSPACE",
    ];
    let rows: Vec<[String; 10]> = status.editors.iter().map(|e| editor_row(e, now)).collect();
    let mut widths: Vec<usize> = HEADER.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ", w = widths[i]);
            }
        }
        l.trim_end().to_string()
    };
    let mut out = String::from("\n");
    out.push_str(&line(&HEADER.map(String::from)));
    out.push('\n');
    for (r, e) in rows.iter().zip(&status.editors) {
        out.push_str(&line(r));
        out.push('\n');
        out.push_str(&editor_notes(e));
        for sess in status
            .sessions
            .iter()
            .filter(|x| x.editor.as_deref() == Some(e.id.as_str()))
        {
            out.push_str(&session_line(sess, now));
        }
    }
    out
}

/// One editor's cells, in the table's column order.
fn editor_row(e: &EditorStatus, now: u64) -> [String; 10] {
    let ws = e.workspace_folders.join(", ");
    [
        e.id.clone(),
        e.family.to_string(),
        e.port.to_string(),
        e.pid.to_string(),
        json_name(&e.state),
        e.rtt_ms
            .map(|r| format!("{r:.1}ms"))
            .unwrap_or_else(|| "-".into()),
        e.connected_since
            .map(|t| age(now.saturating_sub(t)))
            .unwrap_or_else(|| "-".into()),
        e.restarts.to_string(),
        e.sessions.to_string(),
        if ws.is_empty() { "-".into() } else { ws },
    ]
}

/// The lines under an editor's row that say what its columns cannot.
fn editor_notes(e: &EditorStatus) -> String {
    let mut l = String::new();
    if e.no_token {
        l.push_str("  · no token: its lockfile has none, so it is dialled without one\n");
    }
    if let Some(r) = &e.state_reason {
        let _ = writeln!(l, "  · {}: {r}", json_name(&e.state));
    }
    l
}

fn session_line(sess: &SessionStatus, now: u64) -> String {
    let mut l = format!(
        "  └ session {} · {} · {} · cwd {}",
        sess.id,
        json_name(&sess.door),
        sess.dialect,
        sess.cwd
    );
    if sess.key.is_some() {
        let _ = write!(l, " · key {}", opt(&sess.key));
    }
    if let Some(c) = &sess.client {
        let _ = write!(l, " · {}", c.name);
        if let Some(v) = &c.version {
            let _ = write!(l, " {v}");
        }
    }
    if let (Some(r), Some(h)) = (&sess.remote, &sess.host_cwd) {
        let _ = write!(l, " · remote {r} (here {h})");
    }
    let _ = write!(l, " · for {}", age(now.saturating_sub(sess.since)));
    if !sess.in_flight.is_empty() {
        let items: Vec<String> = sess
            .in_flight
            .iter()
            .map(|p| {
                let name = p.tool.clone().unwrap_or_else(|| p.method.clone());
                format!("{name} ({})", age(p.age_s))
            })
            .collect();
        let _ = write!(l, " · in flight: {}", items.join(", "));
    }
    l.push('\n');
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    fn parse(v: serde_json::Value) -> Status {
        serde_json::from_value(v).expect("a status document")
    }

    #[test]
    fn table_snapshot() {
        let status = parse(json!({
            "broker": {"pid": 42, "version": "0.1.0", "socket": "/run/user/1000/pi-ide-broker/sock", "uptime_s": 192},
            "editors": [
                {"id": "neovim-3fa2c1", "ide_name": "Neovim", "family": "pi", "lockfile": "/h/.pi/ide/41234.lock",
                 "port": 41234, "pid": 5678, "workspace_folders": ["/home/u/proj"], "state": "ready",
                 "rtt_ms": 0.412, "connected_since": 1000, "restarts": 1, "tools": ["openDiff"], "sessions": 1},
                {"id": "code-00aa11", "ide_name": "Visual Studio Code", "family": "claude", "lockfile": "/h/.claude/ide/5.lock",
                 "port": 5, "pid": 77, "workspace_folders": [], "state": "backoff",
                 "rtt_ms": null, "connected_since": null, "restarts": 0, "tools": [], "sessions": 0}
            ],
            "sessions": [
                {"id": 3, "door": "native", "dialect": "pi", "cwd": "/home/u/proj/src", "key": "999", "editor": "neovim-3fa2c1", "client": {"name": "pi-ide-broker-pi", "version": "0.1.0", "protocol": 1},
                 "since": 1100, "in_flight": [{"method": "tools/call", "tool": "openDiff", "age_s": 12}]},
                {"id": 4, "door": "compat", "dialect": "pi", "cwd": "/tmp", "key": null, "editor": null, "since": 1190, "in_flight": []}
            ],
            "sticky": []
        }));
        let expected = "\
pi-ide-broker 0.1.0 · pid 42 · up 3m12s · socket /run/user/1000/pi-ide-broker/sock

EDITOR         FAMILY  PORT   PID   STATE    RTT    UP     RESTARTS  SESSIONS  WORKSPACE
neovim-3fa2c1  pi      41234  5678  ready    0.4ms  3m20s  1         1         /home/u/proj
  └ session 3 · native · pi · cwd /home/u/proj/src · key 999 · pi-ide-broker-pi 0.1.0 · for 1m40s · in flight: openDiff (12s)
code-00aa11    claude  5      77    backoff  -      -      0         0         -

Unattached sessions:
  └ session 4 · compat · pi · cwd /tmp · for 10s
";
        assert_eq!(render(&status, 1200), expected);
    }

    #[test]
    fn empty_status_says_what_to_do() {
        let status = parse(
            json!({"broker": {"pid": 1, "version": "0.1.0", "socket": "/s", "uptime_s": 5}, "editors": [], "sessions": []}),
        );
        let t = render(&status, 0);
        assert!(t.contains("No editors found"), "{t}");
    }

    #[test]
    fn an_editor_without_a_token_says_so_under_its_row() {
        let status = parse(json!({
            "broker": {"pid": 1, "version": "0.1.0", "socket": "/s", "uptime_s": 5},
            "editors": [
                {"id": "emacs-1", "ide_name": "Emacs", "family": "claude", "lockfile": "/h/.claude/ide/5.lock",
                 "port": 5, "pid": 77, "workspace_folders": ["/p"], "state": "ready",
                 "rtt_ms": null, "connected_since": null, "restarts": 0, "sessions": 0, "no_token": true},
                {"id": "neovim-1", "ide_name": "Neovim", "family": "pi", "lockfile": "/h/.pi/ide/6.lock",
                 "port": 6, "pid": 78, "workspace_folders": ["/q"], "state": "ready",
                 "rtt_ms": null, "connected_since": null, "restarts": 0, "sessions": 0}
            ],
            "sessions": []
        }));
        let t = render(&status, 0);
        let lines: Vec<&str> = t.lines().collect();
        let emacs = lines.iter().position(|l| l.starts_with("emacs-1")).unwrap();
        assert!(lines[emacs + 1].contains("no token"), "{t}");
        assert_eq!(t.matches("no token").count(), 1, "{t}");
    }
}
