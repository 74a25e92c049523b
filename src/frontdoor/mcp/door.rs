//! What the stdio door adds to a session's traffic: its own tools (`list_editors`,
//! `editor_context`), the answers it rewrites, and the requests in flight it answers itself
//! when the broker goes away.

use crate::protocol::{era, handshake, jsonrpc};
use serde_json::{json, Value};
use std::collections::HashMap;

pub(super) const OWN_TOOLS: [&str; 2] = ["list_editors", "editor_context"];

pub(super) fn own_tools() -> Vec<Value> {
    vec![
        json!({
            "name": "list_editors",
            "description": "List the editors that have this working directory open (best match first), with their id, name, family, workspace folders and link state.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
        }),
        json!({
            "name": "editor_context",
            "description": "What the user is looking at in the editor: its name, the current file's absolute path, the 1-based cursor line, and the selected lines with their text.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
        }),
    ]
}

/// What to do with the broker's answer to a request we sent.
pub(super) enum Intercept {
    /// The client's `tools/list`: add our tools.
    ToolsList,
    /// Our `broker/editors` for the client's `list_editors` call (the client's id).
    ListEditors(Value),
    /// Our `broker/editors` for the client's `editor_context` call (the client's id).
    Context(Value),
    /// Our own refresh of the attached editor's name.
    Refresh,
    /// Our own request whose answer nobody needs (our `initialize`).
    Ignore,
}

/// State kept between messages.
#[derive(Default)]
pub(super) struct Door {
    /// Requests whose answers we transform, by the id sent to the broker (as JSON text).
    pub(super) intercepts: HashMap<String, Intercept>,
    /// Counter for our own ids.
    pub(super) next: u64,
    /// The latest `selection_changed` params.
    pub(super) selection: Option<Value>,
    /// The attached editor's `broker/editors` entry.
    pub(super) editor: Option<Value>,
    /// Client requests sent to the broker and not answered yet: the id sent (as JSON text) →
    /// the client's id and, for `openDiff`, its tab name.
    pub(super) inflight: HashMap<String, (Value, Option<String>)>,
    /// Ids sent (as JSON text) of requests of the 2026-07-28 era: their answers carry
    /// `resultType` (and a list's cache hints: `true`).
    pub(super) modern: HashMap<String, bool>,
    /// The client has sent a 2026-07-28 request.
    pub(super) speaks_modern: bool,
    /// The client has sent `initialize` (the 2025 era's handshake).
    pub(super) speaks_legacy: bool,
}

impl Door {
    /// The broker went away: every request in flight gets its answer now (a diff
    /// `DIFF_REJECTED` with its own tab name, never an error; the rest an error that says so).
    /// Our own requests are forgotten.
    pub(super) fn fail_in_flight(&mut self) -> Vec<String> {
        self.intercepts.clear();
        let modern = std::mem::take(&mut self.modern);
        self.inflight
            .drain()
            .map(|(sent, (id, tab))| match tab {
                Some(tab) => {
                    let answer = jsonrpc::result(
                        &id,
                        jsonrpc::diff_undelivered(&tab, "pi-ide-broker restarted"),
                    );
                    match modern.get(&sent) {
                        Some(list) => era::modernize(&answer, *list),
                        None => answer,
                    }
                }
                None => jsonrpc::error(
                    &id,
                    jsonrpc::SERVER_ERROR,
                    "pi-ide-broker restarted while this request was in flight; retry it",
                ),
            })
            .collect()
    }

    /// A request line that could not be sent after all (it is queued for the next link).
    pub(super) fn forget_sent(&mut self, line: &str) {
        if let Ok(jsonrpc::Incoming::Request { id, .. }) = jsonrpc::classify(line) {
            self.inflight.remove(&id.to_string());
            self.modern.remove(&id.to_string());
        }
    }

    /// The broker answered `id`: no longer in flight; how to treat the answer, if it is ours.
    pub(super) fn answered(&mut self, id: &Value) -> Option<Intercept> {
        let key = id.to_string();
        self.inflight.remove(&key);
        self.intercepts.remove(&key)
    }

    pub(super) fn internal_id(&mut self) -> Value {
        self.next += 1;
        json!(format!("pi-ide-broker-stdio:{}", self.next))
    }
}

pub(super) enum Out {
    Broker(String),
    Client(String),
    /// For the client at once, even before a 2025-era client is initialized (a modern
    /// request's progress: that era has no handshake to wait for).
    ClientNow(String),
    /// The client sent `notifications/initialized`: held notifications may go out.
    ClientReady,
}

/// True for a JSON-RPC response (it has an id and no method).
pub(super) fn is_response(text: &str) -> bool {
    matches!(
        jsonrpc::classify(text),
        Ok(jsonrpc::Incoming::Response { .. })
    )
}

pub(super) fn from_client(door: &mut Door, line: &str) -> Vec<Out> {
    let (id, method, msg) = match jsonrpc::classify(line) {
        Ok(jsonrpc::Incoming::Request { id, method, msg }) => (id, method, msg),
        Ok(jsonrpc::Incoming::Notification { method, .. })
            if method == "notifications/initialized" =>
        {
            return vec![Out::Broker(line.to_string()), Out::ClientReady];
        }
        Ok(jsonrpc::Incoming::Notification { .. }) | Ok(jsonrpc::Incoming::Response { .. }) => {
            return vec![Out::Broker(line.to_string())];
        }
        Err(r) => return vec![Out::Client(jsonrpc::rejection(&r))],
    };
    // What belongs to the broker itself in the modern era is answered here.
    let modern = match era::of(&msg) {
        era::Era::Unsupported(v) => return vec![Out::Client(era::unsupported(&id, &v))],
        era::Era::Modern => true,
        era::Era::Legacy => false,
    };
    if method == "server/discover" {
        return vec![Out::Client(era::discover(
            &id,
            "pi-ide-broker",
            INSTRUCTIONS,
        ))];
    }
    if modern {
        if era::REMOVED.contains(&method.as_str()) {
            return vec![Out::Client(era::removed(&id, &method))];
        }
        door.speaks_modern = true;
    }
    if !modern {
        return route_request(door, id, method, msg, line);
    }
    let list = method == "tools/list";
    let outs = route_request(door, id.clone(), method, msg, line);
    // The id it went to the broker under (the client's, or our own for the door's tools):
    // its answer is made a modern one.
    let sent: Vec<String> = door
        .inflight
        .iter()
        .filter(|(_, (client, _))| *client == id)
        .map(|(sent, _)| sent.clone())
        .collect();
    for s in sent {
        door.modern.insert(s, list);
    }
    outs.into_iter()
        .map(|o| match o {
            Out::Client(t) => Out::Client(era::modernize(&t, false)),
            o => o,
        })
        .collect()
}

/// What the door's tools are for, said in `initialize` and `server/discover`.
const INSTRUCTIONS: &str = "Tools of the editor that has this working directory open (diffs, diagnostics, open files), plus list_editors and editor_context.";

/// A client request of either era, past the broker's own: answered here (`initialize`) or sent
/// to the broker, remembered until answered.
fn route_request(
    door: &mut Door,
    id: Value,
    method: String,
    msg: serde_json::Map<String, Value>,
    line: &str,
) -> Vec<Out> {
    let tab = jsonrpc::diff_tab(&msg);
    match method.as_str() {
        handshake::INITIALIZE => {
            door.speaks_legacy = true;
            let asked = handshake::InitializeParams::read(msg.get("params"));
            let version = asked.protocol_version.as_deref();
            let mut answer = handshake::InitializeResult::broker(
                version.unwrap_or(handshake::PROTOCOL_VERSION),
                true,
            );
            answer.instructions = Some(INSTRUCTIONS.to_string());
            vec![Out::Client(jsonrpc::result(&id, answer.to_value()))]
        }
        "tools/list" => {
            door.intercepts.insert(id.to_string(), Intercept::ToolsList);
            door.inflight.insert(id.to_string(), (id, None));
            vec![Out::Broker(line.to_string())]
        }
        "tools/call" => match jsonrpc::tool_name(&msg) {
            Some("list_editors") => {
                let iid = door.internal_id();
                door.inflight.insert(iid.to_string(), (id.clone(), None));
                door.intercepts
                    .insert(iid.to_string(), Intercept::ListEditors(id));
                vec![Out::Broker(jsonrpc::request(
                    &iid,
                    jsonrpc::broker::EDITORS,
                    json!({}),
                ))]
            }
            Some("editor_context") => {
                let iid = door.internal_id();
                door.inflight.insert(iid.to_string(), (id.clone(), None));
                door.intercepts
                    .insert(iid.to_string(), Intercept::Context(id));
                vec![Out::Broker(jsonrpc::request(
                    &iid,
                    jsonrpc::broker::EDITORS,
                    json!({}),
                ))]
            }
            _ => {
                door.inflight.insert(id.to_string(), (id, tab));
                vec![Out::Broker(line.to_string())]
            }
        },
        _ => {
            door.inflight.insert(id.to_string(), (id, None));
            vec![Out::Broker(line.to_string())]
        }
    }
}

pub(super) fn text_result(id: &Value, text: String) -> String {
    jsonrpc::result(id, json!({"content": [{"type": "text", "text": text}]}))
}

pub(super) fn from_broker(door: &mut Door, text: &str) -> Vec<Out> {
    let outs = from_broker_any_era(door, text);
    // A 2025-era client's frames are classified once, as before.
    if door.modern.is_empty() {
        return outs;
    }
    let modern = match jsonrpc::classify(text) {
        Ok(jsonrpc::Incoming::Response { id, .. }) => door.modern.remove(&id.to_string()),
        _ => None,
    };
    match modern {
        Some(list) => outs
            .into_iter()
            .map(|o| match o {
                Out::Client(t) => Out::Client(era::modernize(&t, list)),
                o => o,
            })
            .collect(),
        None => outs,
    }
}

fn from_broker_any_era(door: &mut Door, text: &str) -> Vec<Out> {
    match jsonrpc::classify(text) {
        Ok(jsonrpc::Incoming::Response { id, mut msg }) => match door.answered(&id) {
            None => vec![Out::Client(text.to_string())],
            Some(Intercept::ToolsList) => {
                if let Some(Value::Array(tools)) =
                    msg.get_mut("result").and_then(|r| r.get_mut("tools"))
                {
                    tools.retain(|t| !OWN_TOOLS.contains(&t["name"].as_str().unwrap_or_default()));
                    tools.extend(own_tools());
                }
                vec![Out::Client(Value::Object(msg).to_string())]
            }
            Some(Intercept::ListEditors(client_id)) => {
                let result = msg.get("result").cloned().unwrap_or(Value::Null);
                vec![Out::Client(text_result(
                    &client_id,
                    serde_json::to_string_pretty(&result).unwrap_or_default(),
                ))]
            }
            Some(Intercept::Context(client_id)) => {
                let result = msg.get("result").cloned().unwrap_or(Value::Null);
                door.editor = attached_entry(&result);
                vec![Out::Client(text_result(
                    &client_id,
                    context_text(door, &result),
                ))]
            }
            Some(Intercept::Refresh) => {
                door.editor = attached_entry(msg.get("result").unwrap_or(&Value::Null));
                vec![]
            }
            Some(Intercept::Ignore) => vec![],
        },
        Ok(jsonrpc::Incoming::Notification { method, msg }) => match method.as_str() {
            "selection_changed" => {
                door.selection = msg.get("params").cloned();
                vec![]
            }
            // Keeps the client's request timeout from cutting a diff the user still reads. A
            // modern client has no handshake to wait for: it gets it at once.
            "notifications/progress" if door.speaks_modern => {
                vec![Out::ClientNow(text.to_string())]
            }
            "notifications/progress" => vec![Out::Client(text.to_string())],
            jsonrpc::broker::ATTACHED | jsonrpc::broker::DETACHED => {
                if method == jsonrpc::broker::DETACHED {
                    door.selection = None;
                    door.editor = None;
                }
                let iid = door.internal_id();
                door.intercepts.insert(iid.to_string(), Intercept::Refresh);
                let refresh =
                    Out::Broker(jsonrpc::request(&iid, jsonrpc::broker::EDITORS, json!({})));
                // The modern era has no free-floating change notification: a modern-only
                // client learns of new tools when its list's `ttlMs` runs out.
                if door.speaks_modern && !door.speaks_legacy {
                    return vec![refresh];
                }
                vec![
                    refresh,
                    Out::Client(jsonrpc::notification(
                        "notifications/tools/list_changed",
                        json!({}),
                    )),
                ]
            }
            _ => vec![],
        },
        Ok(jsonrpc::Incoming::Request { id, method, .. }) => vec![Out::Broker(jsonrpc::error(
            &id,
            jsonrpc::METHOD_NOT_FOUND,
            &format!(
                "Method not found: {method} (an MCP stdio client cannot answer editor requests)"
            ),
        ))],
        Err(_) => vec![],
    }
}

pub(super) fn attached_entry(editors: &Value) -> Option<Value> {
    let attached = editors.get("attached")?.as_str()?;
    editors
        .get("editors")?
        .as_array()?
        .iter()
        .find(|e| e["id"] == attached)
        .cloned()
}

/// The text of `editor_context`: plain lines an agent can read.
pub(super) fn context_text(door: &Door, editors: &Value) -> String {
    let Some(editor) = &door.editor else {
        let n = editors
            .get("editors")
            .and_then(Value::as_array)
            .map(Vec::len)
            .unwrap_or(0);
        return if n == 0 {
            "No editor is attached: no open editor has this working directory in its workspace."
                .into()
        } else {
            format!("No editor is attached: {n} editors match this working directory equally; the user must choose one (list_editors shows them).")
        };
    };
    let mut out = format!(
        "Editor: {} ({})\n",
        editor["ide_name"].as_str().unwrap_or("unknown"),
        editor["id"].as_str().unwrap_or("")
    );
    let Some(sel) = &door.selection else {
        out.push_str("No file is focused yet (the editor has not reported a cursor position).\n");
        return out;
    };
    let file = sel["filePath"].as_str().unwrap_or("");
    let start = sel["selection"]["start"]["line"].as_u64().unwrap_or(0) + 1;
    let end = sel["selection"]["end"]["line"].as_u64().unwrap_or(0) + 1;
    out.push_str(&format!("File: {file}\nCursor: line {end}\n"));
    let text = sel["text"].as_str().unwrap_or("");
    if !text.is_empty() && sel["selection"]["isEmpty"] != true {
        out.push_str(&format!("Selection: lines {start}-{end}\n{text}\n"));
    }
    out
}

#[cfg(test)]
mod tests;
