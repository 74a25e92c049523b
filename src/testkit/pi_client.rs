//! A client that behaves like the published pi-ide extension.
//!
//! It finds candidates by scanning a lock dir (cwd prefix match, pid alive, port listening),
//! connects with `x-pi-ide-authorization`, sends `initialize` only, uses UUID string ids, calls
//! `getDiagnostics` before each turn, and wraps writes in `openDiff` + `close_tab`.

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::path::Path;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// One lockfile as pi-ide reads it.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// From the file name.
    pub port: u16,
    /// `pid`.
    pub pid: u32,
    /// `authToken`.
    pub token: String,
    /// `ideName`.
    pub ide_name: String,
    /// `workspaceFolders`.
    pub folders: Vec<String>,
}

/// `findCandidateLockfiles`: every lockfile in `dir` matching `cwd` by plain string prefix,
/// whose pid is alive and whose port accepts a TCP connect.
pub async fn find_candidates(dir: &Path, cwd: &str) -> Vec<Candidate> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(stem) = name.strip_suffix(".lock") else {
            continue;
        };
        let Ok(port) = stem.parse::<u16>() else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let (Some(pid), Some(token)) = (v["pid"].as_u64(), v["authToken"].as_str()) else {
            continue;
        };
        let folders: Vec<String> = v["workspaceFolders"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|f| f.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let slash = |s: &str| {
            if s.ends_with('/') {
                s.to_string()
            } else {
                format!("{s}/")
            }
        };
        let c = slash(cwd);
        if !folders
            .iter()
            .any(|f| c == slash(f) || c.starts_with(&slash(f)))
        {
            continue;
        }
        if !crate::platform::process::alive(pid as u32) {
            continue;
        }
        if TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            continue;
        }
        out.push(Candidate {
            port,
            pid: pid as u32,
            token: token.to_string(),
            ide_name: v["ideName"].as_str().unwrap_or("unknown").to_string(),
            folders,
        });
    }
    out
}

/// A connected pi-ide-like client.
pub struct PiClient {
    ws: WebSocketStream<TcpStream>,
    /// The latest `selection_changed` params.
    pub selection: Option<Value>,
    /// Notifications other than `selection_changed` (pi-ide drops them; kept for tests).
    pub dropped: Vec<Value>,
}

/// A UUID-v4-shaped random id, as pi-ide mints.
pub fn uuid() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

impl PiClient {
    /// Connects with the given header name (pi-ide uses `x-pi-ide-authorization`).
    pub async fn connect_with(
        port: u16,
        header: &str,
        token: &str,
        origin: Option<&str>,
    ) -> Result<PiClient, String> {
        let stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let mut req = format!("ws://127.0.0.1:{port}/")
            .into_client_request()
            .map_err(|e| e.to_string())?;
        let v = HeaderValue::from_str(token).map_err(|e| e.to_string())?;
        req.headers_mut().insert(
            tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(header.as_bytes())
                .map_err(|e| e.to_string())?,
            v,
        );
        if let Some(o) = origin {
            req.headers_mut().insert(
                "origin",
                HeaderValue::from_str(o).map_err(|e| e.to_string())?,
            );
        }
        let (ws, _) = tokio_tungstenite::client_async(req, stream)
            .await
            .map_err(|e| match e {
                tokio_tungstenite::tungstenite::Error::Http(r) => {
                    format!("Unexpected server response: {}", r.status().as_u16())
                }
                e => e.to_string(),
            })?;
        let mut c = PiClient {
            ws,
            selection: None,
            dropped: Vec::new(),
        };
        let init = c.call("initialize", json!({"protocolVersion": "2024-11-05", "capabilities": {}, "clientInfo": {"name": "pi-ide", "version": "0.1.0"}})).await?;
        if init.get("result").is_none() {
            return Err(format!("initialize failed: {init}"));
        }
        Ok(c)
    }

    /// Connects like pi-ide.
    pub async fn connect(c: &Candidate) -> Result<PiClient, String> {
        Self::connect_with(c.port, "x-pi-ide-authorization", &c.token, None).await
    }

    /// One request with a UUID id; returns the whole answer. Notifications seen meanwhile are
    /// handled as pi-ide does (selection cached, the rest dropped).
    pub async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        let id = uuid();
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.ws
            .send(Message::text(msg.to_string()))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let frame = super::within("pi client answer", self.ws.next()).await;
            let text = match frame {
                None => return Err("IDE connection closed".into()),
                Some(Err(e)) => return Err(format!("IDE connection closed: {e}")),
                Some(Ok(Message::Text(t))) => t.as_str().to_owned(),
                Some(Ok(Message::Close(_))) => return Err("IDE connection closed".into()),
                Some(Ok(_)) => continue,
            };
            let v: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            if v["id"] == json!(id) && v.get("method").is_none() {
                return Ok(v);
            }
            if v["method"] == "selection_changed" {
                self.selection = Some(v["params"].clone());
            } else {
                self.dropped.push(v);
            }
        }
    }

    /// The next message, however long it takes (`None` when the connection ends).
    pub async fn next_message(&mut self) -> Option<Value> {
        loop {
            match self.ws.next().await? {
                Ok(Message::Text(t)) => return serde_json::from_str(t.as_str()).ok(),
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Sends raw text and returns the next message that is not a notification.
    pub async fn raw(&mut self, text: &str) -> Value {
        let _ = self.ws.send(Message::text(text.to_string())).await;
        loop {
            match super::within("pi client raw answer", self.next_message()).await {
                Some(v) if v.get("method").is_none() => return v,
                Some(_) => {}
                None => return Value::Null,
            }
        }
    }

    /// A `tools/call` returning the whole answer.
    pub async fn tool(&mut self, name: &str, args: Value) -> Result<Value, String> {
        self.call("tools/call", json!({"name": name, "arguments": args}))
            .await
    }

    /// What pi-ide does before each model call: `getDiagnostics {}` and parse the map shape.
    pub async fn diagnostics(&mut self) -> Result<serde_json::Map<String, Value>, String> {
        let v = self.tool("getDiagnostics", json!({})).await?;
        let text = v["result"]["content"][0]["text"]
            .as_str()
            .ok_or_else(|| format!("no text: {v}"))?;
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => Ok(m),
            other => Err(format!(
                "not a diagnostics map (pi-ide would throw): {other:?}"
            )),
        }
    }

    /// A `write` through the editor: `openDiff`, then `close_tab` fired
    /// without waiting; returns `Ok(Some(text))` on FILE_SAVED, `Ok(None)` on anything else
    /// (a rejection), `Err` when the call threw (pi would write unreviewed).
    pub async fn write_file(
        &mut self,
        path: &str,
        content: &str,
        call_id: &str,
    ) -> Result<Option<String>, String> {
        let tab = format!("pi-write:{call_id}");
        let v = self
            .tool("openDiff", super::diff_args(path, content, &tab))
            .await?;
        if let Some(e) = v.get("error") {
            return Err(format!("IDE diff failed: {e}"));
        }
        let close = json!({"jsonrpc": "2.0", "id": uuid(), "method": "tools/call", "params": {"name": "close_tab", "arguments": {"tab_name": tab}}});
        let _ = self.ws.send(Message::text(close.to_string())).await;
        let content = &v["result"]["content"];
        if content[0]["text"] == "FILE_SAVED" {
            Ok(Some(
                content[1]["text"].as_str().unwrap_or_default().to_string(),
            ))
        } else {
            Ok(None)
        }
    }

    /// How a `write` ended, read exactly: `FILE_SAVED` with the text, `DIFF_REJECTED` with
    /// the broker's `undelivered` reason when the diff never reached the user, or the raw
    /// result of anything else (so a test cannot take an unexpected answer for a rejection).
    pub async fn write_verdict(
        &mut self,
        path: &str,
        content: &str,
        call_id: &str,
    ) -> Result<WriteVerdict, String> {
        let tab = format!("pi-write:{call_id}");
        let v = self
            .tool("openDiff", super::diff_args(path, content, &tab))
            .await?;
        let result = &v["result"];
        let text = |i: usize| result["content"][i]["text"].as_str().map(str::to_string);
        Ok(match text(0).as_deref() {
            Some("FILE_SAVED") => WriteVerdict::Saved(text(1).unwrap_or_default()),
            Some("DIFF_REJECTED") if text(1).as_deref() == Some(tab.as_str()) => {
                WriteVerdict::Rejected {
                    undelivered: result["_meta"]["pi-ide-broker/undelivered"]
                        .as_str()
                        .map(str::to_string),
                }
            }
            _ => WriteVerdict::Other(v),
        })
    }

    /// The raw answer of an `openDiff` (for tests that check the echoed tab name).
    pub async fn open_diff_raw(&mut self, path: &str, tab: &str) -> Result<Value, String> {
        self.tool("openDiff", super::diff_args(path, "new", tab))
            .await
    }

    /// Closes like pi's `session_shutdown` (close 1000).
    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// How a `write` through the editor ended ([`PiClient::write_verdict`]).
#[derive(Debug, Clone, PartialEq)]
pub enum WriteVerdict {
    /// `FILE_SAVED` with the text the user saved.
    Saved(String),
    /// `DIFF_REJECTED` echoing the tab name; `undelivered` is the broker's reason when the
    /// diff never reached the user (`_meta."pi-ide-broker/undelivered"`).
    Rejected {
        /// Why the diff could not be shown, or `None` for the user's own rejection.
        undelivered: Option<String>,
    },
    /// Any other answer, whole.
    Other(Value),
}
