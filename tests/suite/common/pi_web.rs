//! pi-web (`@agegr/pi-web`): the browser UI that hosts one pi session per chat in one Node
//! process, driven through its HTTP API only, offline against the fake model. `.ci/run`
//! installs it into its cache and exports `PI_IDE_BROKER_PI_WEB` (its `bin/pi-web.js`); without
//! it the pi-web tests skip (unless `PI_IDE_BROKER_REQUIRE_ALL=1`, as in CI).

use crate::common::pi::extension_dir;
use crate::common::process::Proc;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tokio::process::Command;

/// Where pi-web, the pi it ships and a node for both are.
#[derive(Clone, Debug)]
pub struct PiWebInstall {
    pub node: PathBuf,
    /// `bin/pi-web.js`.
    pub web: PathBuf,
    /// The pi CLI pi-web depends on (for `pi install`, as a user of that pi runs it).
    pub pi_cli: PathBuf,
}

/// The installed pi-web, or `None` (after saying why) when the test must be skipped.
pub fn find_pi_web() -> Option<PiWebInstall> {
    let node = std::env::var_os("PI_IDE_BROKER_PI_NODE").map(PathBuf::from);
    let web = std::env::var_os("PI_IDE_BROKER_PI_WEB").map(PathBuf::from);
    let found = match (node, web) {
        (Some(node), Some(web)) if node.exists() && web.exists() => {
            bundled_pi(&web).map(|pi_cli| PiWebInstall { node, web, pi_cli })
        }
        _ => None,
    };
    if found.is_none() {
        let msg = "pi-web not found: set PI_IDE_BROKER_PI_NODE and PI_IDE_BROKER_PI_WEB (bin/pi-web.js of @agegr/pi-web, next to its @earendil-works/pi-coding-agent; bash .ci/run does)";
        crate::common::cannot_run(msg);
    }
    found
}

/// pi-web's own pi CLI: hoisted next to it by npm, or nested inside it.
fn bundled_pi(web: &Path) -> Option<PathBuf> {
    let pkg = web.parent()?.parent()?;
    let rel = Path::new("@earendil-works/pi-coding-agent/dist/cli.js");
    [
        pkg.join("node_modules").join(rel),
        pkg.parent()?.parent()?.join(rel),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// A home whose pi agent dir has the fake model and the extension installed the way the
/// README tells a user (`pi install <extension dir>`, with pi-web's own pi).
pub async fn web_home(install: &PiWebInstall, home: &Path) {
    let agent = home.join(".pi").join("agent");
    let out = pi_ide_broker::testkit::within_start(
        "pi install of the extension",
        Command::new(&install.node)
            .arg(&install.pi_cli)
            .arg("install")
            .arg(extension_dir())
            .env("HOME", home)
            .env("PI_CODING_AGENT_DIR", &agent)
            .env("PI_OFFLINE", "1")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("run pi install");
    assert!(
        out.status.success(),
        "pi install failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let settings: Value =
        serde_json::from_slice(&std::fs::read(agent.join("settings.json")).expect("settings"))
            .expect("settings.json is JSON");
    assert!(
        settings["packages"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "pi install left no package entry: {settings}"
    );
}

/// One pi-web server (its own process group: it runs `next start` as a child).
pub struct PiWeb {
    proc: Proc,
    pub port: u16,
}

impl PiWeb {
    /// Starts pi-web on a free loopback port (`-p 0`; it prints the one it got), with chats
    /// shut down after `idle_ms` idle (0: never), the extension talking to `socket`.
    pub async fn start(install: &PiWebInstall, home: &Path, socket: &Path, idle_ms: u64) -> PiWeb {
        let mut cmd = Command::new(&install.node);
        cmd.arg(&install.web)
            .args(["--no-open", "-H", "127.0.0.1", "-p", "0"])
            .current_dir(home)
            .env("HOME", home)
            .env("PI_CODING_AGENT_DIR", home.join(".pi").join("agent"))
            .env("PI_OFFLINE", "1")
            .env("PI_WEB_SKIP_VERSION_CHECK", "1")
            .env("NEXT_TELEMETRY_DISABLED", "1")
            .env("PI_WEB_IDLE_TIMEOUT_MS", idle_ms.to_string())
            .env("PI_IDE_BROKER_SOCKET", socket)
            .env("PI_IDE_BROKER_NO_SPAWN", "1")
            .env("PI_IDE_BROKER_BIN", "/nonexistent/pi-ide-broker")
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("PI_WEB_PASSWORD")
            .env_remove("PORT")
            .process_group(0);
        let mut proc = Proc::spawn(&mut cmd);
        let local = proc.wait_line(&["Local:", "http://127.0.0.1:"]).await;
        let port = local
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("no port in {local:?}"));
        proc.wait_line(&["Ready"]).await;
        PiWeb { proc, port }
    }

    /// `method path` with a JSON body (or none); the status and the JSON answer.
    pub async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        within(
            &format!("pi-web {method} {path}"),
            self.request(method, path, body),
        )
        .await
    }

    async fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .expect("connect to pi-web");
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .expect("http handshake");
        tokio::spawn(conn);
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", format!("127.0.0.1:{}", self.port))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .expect("request");
        let resp = send.send_request(req).await.expect("pi-web answer");
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }

    /// A new chat on `cwd` whose first message is `message` (pi-web's `POST /api/agent/new`);
    /// its session id.
    pub async fn new_chat(&self, cwd: &Path, message: &str) -> String {
        let body = json!({"cwd": cwd.display().to_string(), "type": "prompt", "message": message,
                          "provider": "fake", "modelId": "fake-model"});
        // A new chat loads a whole pi session in pi-web's process (its resources, the extension
        // compiled on the fly): beside compiles on a loaded 2-core machine that took over 10 s
        // (three soak failures at once), so it gets the bound of a program's start.
        let (status, r) = pi_ide_broker::testkit::within_start(
            "pi-web POST /api/agent/new",
            self.request("POST", "/api/agent/new", Some(&body)),
        )
        .await;
        assert!(
            status == 200 && r["success"] == true,
            "new chat: {status} {r}"
        );
        r["sessionId"].as_str().expect("sessionId").to_string()
    }

    /// One command to a chat (`POST /api/agent/<id>`): its `data`.
    pub async fn command(&self, id: &str, cmd: Value) -> Value {
        let (status, r) = self
            .call("POST", &format!("/api/agent/{id}"), Some(&cmd))
            .await;
        assert!(status == 200 && r["success"] == true, "{cmd}: {status} {r}");
        r["data"].clone()
    }

    /// Sends a message in a chat (pi-web reopens a chat it shut down).
    pub async fn send(&self, id: &str, message: &str) {
        self.command(id, json!({"type": "prompt", "message": message}))
            .await;
    }

    /// Waits until the chat's run is over (pi-web has no event for "idle" on its plain HTTP
    /// API, so its state is polled, bounded).
    pub async fn wait_idle(&self, id: &str) {
        within(&format!("chat {id} to go idle"), async {
            loop {
                let (_, r) = self.request("GET", &format!("/api/agent/{id}"), None).await;
                let st = &r["state"];
                if r["running"] == false
                    || (st["isPromptRunning"] == false && st["isStreaming"] == false)
                {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        })
        .await
    }

    /// True while pi-web holds the chat's session in memory.
    pub async fn running(&self, id: &str) -> bool {
        self.call("GET", &format!("/api/agent/{id}"), None).await.1["running"] == true
    }

    /// The entry id of the chat's first user message (what pi-web's "fork" takes).
    pub async fn first_user_entry(&self, id: &str) -> String {
        let (status, r) = self.call("GET", &format!("/api/sessions/{id}"), None).await;
        assert_eq!(status, 200, "{r}");
        let ctx = &r["context"];
        let at = ctx["messages"]
            .as_array()
            .and_then(|m| m.iter().position(|m| m["role"] == "user"))
            .unwrap_or_else(|| panic!("no user message in {r}"));
        ctx["entryIds"][at]
            .as_str()
            .unwrap_or_else(|| panic!("no entry id for message {at}: {r}"))
            .to_string()
    }
}

impl Drop for PiWeb {
    fn drop(&mut self) {
        // The whole group: pi-web's own process and the `next start` it runs.
        if let Some(pid) = self
            .proc
            .child
            .id()
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}
