//! `status` and `status --watch`: the daemon's editors, sessions and routes as a table.
//!
//! The running daemon's editors, sessions and routes, as the table (or the change lines)
//! printed from the document `GET /v1/status` answers (`frontdoor::status`).

use super::not_running;
use crate::editor::LinkState;
use crate::frontdoor::client;
use crate::frontdoor::status::{EditorStatus, SessionStatus, Status};
use crate::sys::config::Config;
use serde::Serialize;
use std::fmt::Write as _;
use std::process::ExitCode;

/// `status`: the running daemon's editors, sessions and routes, as a table or JSON.
pub(super) async fn command(config: &Config, json: bool) -> anyhow::Result<ExitCode> {
    let socket = config.socket_to_dial();
    match client::get_json(&socket, "/v1/status").await {
        Ok(status) => {
            if json {
                println!("{}", serde_json::to_string_pretty(&status)?);
            } else {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let typed: Status =
                    serde_json::from_value(status).map_err(|e| client::ClientError::Shape {
                        path: "/v1/status".into(),
                        why: format!("{e}; `status --json` prints it as it is"),
                    })?;
                print!("{}", render(&typed, now));
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(client::ClientError::NotRunning(s)) => Ok(not_running(&s)),
        Err(e) => Err(e.into()),
    }
}

/// `status --watch`: the table redrawn on every change in a terminal (alternate screen, left
/// clean on Ctrl-C), plain lines otherwise.
pub(super) async fn watch(socket: &std::path::Path) -> anyhow::Result<ExitCode> {
    use std::io::{IsTerminal, Write};
    let tty = std::io::stdout().is_terminal();
    let mut prev: Option<Status> = None;
    if tty {
        print!("\x1b[?1049h");
    }
    let follow = client::follow_events(socket, |event| {
        let next = event.status;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut out = std::io::stdout().lock();
        if tty {
            let _ = write!(
                out,
                "\x1b[2J\x1b[H{}\n(watching; Ctrl-C to quit)\n",
                render(&next, now)
            );
        } else {
            match &prev {
                None => {
                    let ready = next
                        .editors
                        .iter()
                        .filter(|e| e.state == crate::editor::LinkState::Ready)
                        .count();
                    let _ = writeln!(
                        out,
                        "watching pi-ide-broker {} (pid {}): {} editors ({ready} ready), {} sessions",
                        next.broker.version,
                        next.broker.pid,
                        next.editors.len(),
                        next.sessions.len()
                    );
                }
                Some(p) => {
                    for l in changes(p, &next) {
                        let _ = writeln!(out, "{l}");
                    }
                }
            }
        }
        let _ = out.flush();
        prev = Some(next);
    });
    let result = tokio::select! {
        r = follow => r,
        _ = tokio::signal::ctrl_c() => Ok(()),
    };
    if tty {
        print!("\x1b[?1049l");
        let _ = std::io::stdout().flush();
    }
    match result {
        Ok(()) => {
            if !tty {
                println!("pi-ide-broker stopped");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(client::ClientError::NotRunning(s)) => Ok(not_running(&s)),
        Err(e) => Err(e.into()),
    }
}

/// What changed between two status documents, one line per change a person cares about
/// (editors appearing, going, changing state; sessions connecting, attaching, leaving; calls
/// in flight): what `status --watch` prints when its output is not a terminal.
pub(super) fn changes(prev: &Status, next: &Status) -> Vec<String> {
    let mut out = editor_changes(prev, next);
    out.extend(session_changes(prev, next));
    if prev.lockfiles_rejected.len() != next.lockfiles_rejected.len() {
        let n = next.lockfiles_rejected.len();
        out.push(format!(
            "{n} lockfile{} ignored — run `{}`",
            if n == 1 { "" } else { "s" },
            crate::cli::hint::hint("doctor")
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
            let door = s.door.clone();
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
pub(super) fn render(status: &Status, now: u64) -> String {
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
    if let Some(c) = status.connection.as_ref().filter(|c| c.realm.is_some()) {
        let _ = writeln!(
            out,
            "This connection has an agent's rights only ({}): its own sessions are shown, nothing else; {}.",
            c.why, c.hint
        );
    }
    for r in &b.remote_sockets {
        let _ = writeln!(
            out,
            "remote {} · socket {}{}",
            r.name,
            r.path.display(),
            if r.listening {
                ""
            } else {
                " (not listening: restart the broker)"
            }
        );
    }
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
    for door in crate::frontdoor::DOORS {
        out.extend(door.status_text(&status.doors));
    }
    for a in &status.agents_on_main_socket {
        let _ = writeln!(
            out,
            "\n{} connection{} on the main socket got an agent's rights only: {}; {}.",
            a.connections,
            if a.connections == 1 { "" } else { "s" },
            a.why,
            a.hint
        );
    }
    match status.lockfiles_rejected.len() {
        0 => {}
        n => {
            let s = if n == 1 { "" } else { "s" };
            let doctor = crate::cli::hint::hint("doctor");
            let _ = writeln!(out, "\n{n} lockfile{s} ignored — run `{doctor}`");
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
        sess.door.clone(),
        sess.family,
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
    for f in &sess.followers {
        let role = if f.reviewing {
            "reviews its diffs"
        } else {
            "watching"
        };
        let _ = writeln!(l, "    · followed by {} (ACP, {role})", f.client);
    }
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
                 "since": 1100, "in_flight": [{"method": "tools/call", "tool": "openDiff", "age_s": 12}],
                 "followers": [{"id": 9, "client": "Zed", "reviewing": true}]},
                {"id": 4, "door": "compat", "dialect": "pi", "cwd": "/tmp", "key": null, "editor": null, "since": 1190, "in_flight": []}
            ],
            "sticky": []
        }));
        let expected = "\
pi-ide-broker 0.1.0 · pid 42 · up 3m12s · socket /run/user/1000/pi-ide-broker/sock

EDITOR         FAMILY  PORT   PID   STATE    RTT    UP     RESTARTS  SESSIONS  WORKSPACE
neovim-3fa2c1  pi      41234  5678  ready    0.4ms  3m20s  1         1         /home/u/proj
  └ session 3 · native · pi · cwd /home/u/proj/src · key 999 · pi-ide-broker-pi 0.1.0 · for 1m40s · in flight: openDiff (12s)
    · followed by Zed (ACP, reviews its diffs)
code-00aa11    claude  5      77    backoff  -      -      0         0         -

Unattached sessions:
  └ session 4 · compat · pi · cwd /tmp · for 10s
";
        assert_eq!(render(&status, 1200), expected);
    }

    /// Each door's members of the document come back through the flattened map and are
    /// printed by their door, in the order of `frontdoor::DOORS`; an agent's document has none.
    #[test]
    fn the_doors_members_are_printed_by_their_doors() {
        let status = parse(json!({
            "broker": {"pid": 1, "version": "0.1.0", "socket": "/s", "uptime_s": 5},
            "editors": [], "sessions": [],
            "gemini_files": [{"path": "/tmp/gemini/ide/gemini-ide-server-1-2.json", "editor": "neovim-1"}],
            "codex_hub": {"socket": "/tmp/codex-ipc/ipc-1000.sock", "owner": "broker", "detail": ""}
        }));
        assert_eq!(status.doors.len(), 2, "{:?}", status.doors);
        let t = render(&status, 0);
        let gemini = t
            .find("Gemini CLI discovery files:\n  neovim-1 → /tmp/gemini/ide/gemini-ide-server-1-2.json")
            .unwrap_or_else(|| panic!("{t}"));
        let codex = t
            .find("Codex /ide: served by the broker at /tmp/codex-ipc/ipc-1000.sock")
            .unwrap_or_else(|| panic!("{t}"));
        assert!(gemini < codex, "{t}");
        let bare = parse(
            json!({"broker": {"pid": 1, "version": "0.1.0", "socket": "/s", "uptime_s": 5}, "editors": [], "sessions": []}),
        );
        let t = render(&bare, 0);
        assert!(!t.contains("Gemini") && !t.contains("Codex"), "{t}");
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
