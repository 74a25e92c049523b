//! `status`: the JSON the daemon answers on `GET /v1/status` (built from the registry) and
//! the table the CLI prints from it. The JSON field names are a contract: add, never rename.

use crate::registry::Registry;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The full status document.
pub fn status(reg: &Registry) -> Value {
    let all_sessions = reg.sessions();
    let mut editors: Vec<Value> = reg
        .editors()
        .iter()
        .map(|e| {
            let l = e.lockfile();
            let link = e.link_info();
            let tools = e.tool_names().unwrap_or_default();
            let sessions = all_sessions
                .iter()
                .filter(|s| s.editor_id().as_deref() == Some(e.id.as_str()))
                .count();
            json!({
                "id": e.id,
                "ide_name": l.ide_name,
                "family": e.family,
                "lockfile": l.path,
                "port": l.port,
                "pid": l.pid,
                "workspace_folders": l.workspace_folders,
                "state": link.state,
                "rtt_ms": link.rtt.map(|d| (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0),
                "connected_since": link.connected_since.map(unix),
                "restarts": e.restarts,
                "previous_port": e.previous_port,
                "previous_pid": e.previous_pid,
                "tools": tools,
                "sessions": sessions,
            })
        })
        .collect();
    editors.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    let mut sessions: Vec<Value> = all_sessions
        .iter()
        .map(|s| {
            let mut in_flight: Vec<(bool, Value)> = Vec::new();
            for e in reg.editors() {
                for (diff, method, tool, age) in e.calls_of(s.id) {
                    in_flight.push((
                        diff,
                        json!({"method": method, "tool": tool, "age_s": age.as_secs()}),
                    ));
                }
            }
            // Pending diffs first, then oldest first.
            in_flight.sort_by(|a, b| {
                b.0.cmp(&a.0)
                    .then(b.1["age_s"].as_u64().cmp(&a.1["age_s"].as_u64()))
            });
            let editor = s.editor_id();
            let bridged = editor
                .as_deref()
                .and_then(|id| reg.editor(id).map(|e| e.family != s.dialect))
                .unwrap_or(false);
            json!({
                "id": s.id,
                "door": s.door,
                "cwd": s.cwd_raw,
                "key": s.key,
                "editor": editor,
                "since": unix(s.since),
                "dialect": s.dialect,
                "bridged": bridged,
                "in_flight": in_flight.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
            })
        })
        .collect();
    sessions.sort_by_key(|s| s["id"].as_u64());
    let sticky: Vec<Value> = reg
        .state
        .all_sticky()
        .into_iter()
        .map(|(key, t)| json!({"key": key, "editor": t.editor, "since": t.since}))
        .collect();
    json!({
        "broker": {
            "pid": std::process::id(),
            "version": env!("CARGO_PKG_VERSION"),
            "socket": reg.socket,
            "uptime_s": reg.started_at.elapsed().map(|d| d.as_secs()).unwrap_or(0),
        },
        "editors": editors,
        "sessions": sessions,
        "sticky": sticky,
    })
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

fn s(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(x) => x.clone(),
        other => other.to_string(),
    }
}

/// The table a person reads at a glance; `now` is unix seconds (a parameter for snapshot tests).
pub fn render(status: &Value, now: u64) -> String {
    let mut out = String::new();
    let b = &status["broker"];
    let _ = writeln!(
        out,
        "pi-ide-broker {} · pid {} · up {} · socket {}",
        s(&b["version"]),
        s(&b["pid"]),
        age(b["uptime_s"].as_u64().unwrap_or(0)),
        s(&b["socket"])
    );
    let empty = Vec::new();
    let editors = status["editors"].as_array().unwrap_or(&empty);
    let sessions = status["sessions"].as_array().unwrap_or(&empty);
    if editors.is_empty() {
        out.push_str("\nNo editors found. Start an editor with pi-ide or Claude Code integration; its lockfile appears in ~/.pi/ide or ~/.claude/ide.\n");
    } else {
        let rows: Vec<[String; 10]> = editors
            .iter()
            .map(|e| {
                let up = e["connected_since"]
                    .as_u64()
                    .map(|t| age(now.saturating_sub(t)))
                    .unwrap_or_else(|| "-".into());
                let rtt = e["rtt_ms"]
                    .as_f64()
                    .map(|r| format!("{r:.1}ms"))
                    .unwrap_or_else(|| "-".into());
                let ws = e["workspace_folders"]
                    .as_array()
                    .map(|a| a.iter().map(s).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default();
                [
                    s(&e["id"]),
                    s(&e["family"]),
                    s(&e["port"]),
                    s(&e["pid"]),
                    s(&e["state"]),
                    rtt,
                    up,
                    s(&e["restarts"]),
                    s(&e["sessions"]),
                    if ws.is_empty() { "-".into() } else { ws },
                ]
            })
            .collect();
        let header = [
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
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
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
        out.push('\n');
        out.push_str(&line(&header.map(String::from)));
        out.push('\n');
        for (r, e) in rows.iter().zip(editors) {
            out.push_str(&line(r));
            out.push('\n');
            for sess in sessions.iter().filter(|x| x["editor"] == e["id"]) {
                out.push_str(&session_line(sess, now));
            }
        }
    }
    let loose: Vec<&Value> = sessions.iter().filter(|x| x["editor"].is_null()).collect();
    if !loose.is_empty() {
        out.push_str("\nUnattached sessions:\n");
        for sess in loose {
            out.push_str(&session_line(sess, now));
        }
    }
    out
}

fn session_line(sess: &Value, now: u64) -> String {
    let mut l = format!(
        "  └ session {} · {} · {} · cwd {}",
        s(&sess["id"]),
        s(&sess["door"]),
        s(&sess["dialect"]),
        s(&sess["cwd"])
    );
    if !sess["key"].is_null() {
        let _ = write!(l, " · key {}", s(&sess["key"]));
    }
    if let Some(since) = sess["since"].as_u64() {
        let _ = write!(l, " · for {}", age(now.saturating_sub(since)));
    }
    if let Some(f) = sess["in_flight"].as_array().filter(|f| !f.is_empty()) {
        let items: Vec<String> = f
            .iter()
            .map(|p| {
                let name = if p["tool"].is_null() {
                    s(&p["method"])
                } else {
                    s(&p["tool"])
                };
                format!("{name} ({})", age(p["age_s"].as_u64().unwrap_or(0)))
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

    #[test]
    fn table_snapshot() {
        let status = json!({
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
                {"id": 3, "door": "native", "dialect": "pi", "cwd": "/home/u/proj/src", "key": "999", "editor": "neovim-3fa2c1",
                 "since": 1100, "in_flight": [{"method": "tools/call", "tool": "openDiff", "age_s": 12}]},
                {"id": 4, "door": "compat", "dialect": "pi", "cwd": "/tmp", "key": null, "editor": null, "since": 1190, "in_flight": []}
            ],
            "sticky": []
        });
        let expected = "\
pi-ide-broker 0.1.0 · pid 42 · up 3m12s · socket /run/user/1000/pi-ide-broker/sock

EDITOR         FAMILY  PORT   PID   STATE    RTT    UP     RESTARTS  SESSIONS  WORKSPACE
neovim-3fa2c1  pi      41234  5678  ready    0.4ms  3m20s  1         1         /home/u/proj
  └ session 3 · native · pi · cwd /home/u/proj/src · key 999 · for 1m40s · in flight: openDiff (12s)
code-00aa11    claude  5      77    backoff  -      -      0         0         -

Unattached sessions:
  └ session 4 · compat · pi · cwd /tmp · for 10s
";
        assert_eq!(render(&status, 1200), expected);
    }

    #[test]
    fn empty_status_says_what_to_do() {
        let status = json!({"broker": {"pid": 1, "version": "0.1.0", "socket": "/s", "uptime_s": 5}, "editors": [], "sessions": []});
        let t = render(&status, 0);
        assert!(t.contains("No editors found"), "{t}");
    }
}
