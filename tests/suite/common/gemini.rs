//! A real Streamable-HTTP MCP client (`@modelcontextprotocol/sdk`'s `Client` with
//! `StreamableHTTPClientTransport`, as Gemini CLI makes it), run by node and driven line by line
//! (`gemini_client.mjs`). `.ci/run` installs the SDK with Gemini CLI into its cache and exports
//! `PI_IDE_BROKER_GEMINI_NODE` and `PI_IDE_BROKER_GEMINI_MODULES`; without them the tests skip
//! (unless `PI_IDE_BROKER_REQUIRE_ALL=1`, as in CI, which makes them fail).

use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Where node and the npm packages (`node_modules`) are.
#[derive(Clone, Debug)]
pub struct GeminiInstall {
    pub node: PathBuf,
    pub modules: PathBuf,
}

impl GeminiInstall {
    /// `@modelcontextprotocol/sdk` in the cache.
    pub fn sdk(&self) -> PathBuf {
        self.modules.join("@modelcontextprotocol").join("sdk")
    }

    /// Gemini CLI's entry point.
    pub fn cli(&self) -> PathBuf {
        self.modules
            .join("@google")
            .join("gemini-cli")
            .join("bundle")
            .join("gemini.js")
    }
}

/// The installed node and packages, or `None` (after saying why) when the test must be skipped.
pub fn find_gemini() -> Option<GeminiInstall> {
    let node = std::env::var_os("PI_IDE_BROKER_GEMINI_NODE").map(PathBuf::from);
    let modules = std::env::var_os("PI_IDE_BROKER_GEMINI_MODULES").map(PathBuf::from);
    match (node, modules) {
        (Some(node), Some(modules)) if node.exists() && modules.exists() => {
            Some(GeminiInstall { node, modules })
        }
        _ => {
            let msg = "node and @modelcontextprotocol/sdk not found: set PI_IDE_BROKER_GEMINI_NODE and PI_IDE_BROKER_GEMINI_MODULES (bash .ci/run does)";
            crate::common::cannot_run(msg);
            None
        }
    }
}

/// One discovery file, read.
#[derive(Clone, Debug)]
pub struct Discovery {
    pub path: PathBuf,
    pub pid: u32,
    pub port: u16,
    pub token: String,
    pub body: Value,
}

/// The discovery files in `dir` whose workspace holds `folder`.
pub fn discovery_files(dir: &Path, folder: &str) -> Vec<Discovery> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(rest) = name
            .strip_prefix("gemini-ide-server-")
            .and_then(|r| r.strip_suffix(".json"))
        else {
            continue;
        };
        let Some((pid, port)) = rest.split_once('-') else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let Ok(body) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        let holds = body["workspacePath"]
            .as_str()
            .is_some_and(|w| w.split(':').any(|f| f == folder));
        if holds {
            out.push(Discovery {
                path: e.path(),
                pid: pid.parse().unwrap_or(0),
                port: port.parse().unwrap_or(0),
                token: body["authToken"].as_str().unwrap_or_default().to_string(),
                body,
            });
        }
    }
    out
}

/// Waits until exactly one discovery file in `dir` holds `folder`.
pub async fn one_discovery(dir: &Path, folder: &str) -> Discovery {
    within("one gemini discovery file", async {
        loop {
            let mut found = discovery_files(dir, folder);
            if found.len() == 1 {
                return found.remove(0);
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
}

/// One node process running the SDK client.
pub struct McpClient {
    child: Child,
    stdin: ChildStdin,
    rx: mpsc::UnboundedReceiver<Value>,
    /// Notifications read while waiting for something else, in order.
    pub notes: Vec<Value>,
    next_tag: u64,
}

impl McpClient {
    /// Connects (initialize, then the event stream) with `token` (`None`: no header); the
    /// first record says how it went (`connected` or `connect-failed`).
    pub async fn connect(g: &GeminiInstall, port: u16, token: Option<&str>) -> (McpClient, Value) {
        let url = format!("http://127.0.0.1:{port}/mcp");
        let script =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/suite/common/gemini_client.mjs");
        let mut child = Command::new(&g.node)
            .arg(script)
            .arg(g.sdk())
            .arg(url)
            .arg(token.unwrap_or("-"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn node");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    let _ = tx.send(v);
                }
            }
        });
        let mut c = McpClient {
            child,
            stdin,
            rx,
            notes: Vec::new(),
            next_tag: 0,
        };
        let first = c
            .until("the client's first record", |v| {
                v["ev"] == "connected" || v["ev"] == "connect-failed"
            })
            .await;
        (c, first)
    }

    async fn next(&mut self) -> Value {
        within("a record from the MCP client", self.rx.recv())
            .await
            .expect("the MCP client exited")
    }

    /// Reads until `pred` holds, keeping the notifications passed on the way.
    pub async fn until(&mut self, what: &str, mut pred: impl FnMut(&Value) -> bool) -> Value {
        within(what, async {
            loop {
                let v = self.next().await;
                if pred(&v) {
                    return v;
                }
                if v["ev"] == "notification" {
                    self.notes.push(v);
                }
            }
        })
        .await
    }

    /// Waits for notification `method` (held ones first), removing it from `notes`.
    pub async fn notification(&mut self, method: &str) -> Value {
        if let Some(i) = self.notes.iter().position(|n| n["method"] == method) {
            return self.notes.remove(i)["params"].clone();
        }
        let v = self
            .until(&format!("notification {method}"), |v| {
                v["ev"] == "notification" && v["method"] == method
            })
            .await;
        v["params"].clone()
    }

    async fn send(&mut self, mut cmd: Value) -> Value {
        self.next_tag += 1;
        let tag = self.next_tag;
        cmd["tag"] = json!(tag);
        let line = format!("{cmd}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to the MCP client");
        self.until("an answer from the MCP client", |v| v["tag"] == tag)
            .await
    }

    /// `tools/list`.
    pub async fn list_tools(&mut self) -> Value {
        self.send(json!({"op": "list"})).await
    }

    /// `tools/call`.
    pub async fn call(&mut self, name: &str, args: Value) -> Value {
        self.send(json!({"op": "call", "name": name, "args": args}))
            .await
    }

    /// Kills the process, as a Gemini CLI that exits (it never sends DELETE).
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Ends the session (DELETE) and the process.
    pub async fn close(mut self) {
        let _ = self.stdin.write_all(b"{\"op\":\"close\"}\n").await;
        let _ = within("MCP client exit", self.child.wait()).await;
    }
}

/// Sends one raw HTTP/1.1 request to `port` and returns the status code.
pub async fn raw_status(port: u16, request: &str) -> u16 {
    use tokio::io::AsyncReadExt;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut buf = vec![0u8; 4096];
    let n = within("an HTTP answer", s.read(&mut buf))
        .await
        .expect("read");
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// A raw `initialize` POST with these extra header lines.
pub fn initialize_request(port: u16, host: &str, extra: &str) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let _ = port;
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n{extra}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}
