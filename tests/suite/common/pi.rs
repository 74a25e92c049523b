//! The real pi CLI in RPC mode (`pi --mode rpc`), with this repo's extension loaded (`-e`),
//! offline against a fake model. `.ci/run` installs pi and node 22 into a cache and exports
//! `PI_IDE_BROKER_PI_NODE` and `PI_IDE_BROKER_PI_CLI`; without them the pi tests skip (unless
//! `PI_IDE_BROKER_REQUIRE_ALL=1`, as in CI, which makes a missing pi a failure).

use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Where the pi CLI and its node are.
#[derive(Clone, Debug)]
pub struct PiInstall {
    pub node: PathBuf,
    pub cli: PathBuf,
}

/// The installed pi, or `None` (after saying why) when the test must be skipped.
pub fn find_pi() -> Option<PiInstall> {
    let node = std::env::var_os("PI_IDE_BROKER_PI_NODE").map(PathBuf::from);
    let cli = std::env::var_os("PI_IDE_BROKER_PI_CLI").map(PathBuf::from);
    match (node, cli) {
        (Some(node), Some(cli)) if node.exists() && cli.exists() => {
            let ext = extension_dir();
            if !ext.join("node_modules").join("ws").exists() {
                panic!(
                    "the extension's dependencies are missing: run `npm ci` in {}",
                    ext.display()
                );
            }
            Some(PiInstall { node, cli })
        }
        _ => {
            super::cannot_run("pi CLI not found: set PI_IDE_BROKER_PI_NODE and PI_IDE_BROKER_PI_CLI (bash .ci/run does)");
            None
        }
    }
}

/// `extensions/pi` in this repo.
pub fn extension_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("extensions")
        .join("pi")
}

/// `PATH` with pi's node first, so pi's own `npm` and `git` children run under it.
pub fn path_with_node(install: &PiInstall) -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> = install
        .node
        .parent()
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    if let Some(p) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(dirs).unwrap_or_default()
}

/// Runs one pi package command (`install`, `remove`, `list`) in `home`; (success, output).
pub async fn pi_cli(install: &PiInstall, home: &Path, args: &[&str]) -> (bool, String) {
    // npm fetches from its registry: minutes, not seconds, on a slow day.
    let what = format!("pi {}", args.join(" "));
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(300),
        Command::new(&install.node)
            .arg(&install.cli)
            .args(args)
            .current_dir(home)
            .env("HOME", home)
            .env("PI_CODING_AGENT_DIR", home.join(".pi").join("agent"))
            .env("PATH", path_with_node(install))
            .env("npm_config_update_notifier", "false")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("timed out after 300 s waiting for {what}"))
    .expect("run pi");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// One pi process.
pub struct Pi {
    pub child: Child,
    stdin: ChildStdin,
    rx: mpsc::UnboundedReceiver<(Value, tokio::time::Instant)>,
    /// Every record pi wrote on stdout, in order.
    pub log: Vec<Value>,
    /// When each record of `log` was read from pi's stdout (a task reads it as it comes).
    pub log_at: Vec<tokio::time::Instant>,
    next_id: u64,
    /// Print an abbreviated transcript to stderr (`PI_TRANSCRIPT=1`).
    transcript: bool,
}

/// A home for pi: agent dir with the fake model configured.
pub fn pi_home(root: &Path, models_json: &str) -> PathBuf {
    let home = root.join("pi-home");
    let agent = home.join(".pi").join("agent");
    std::fs::create_dir_all(&agent).expect("mkdir agent");
    std::fs::write(agent.join("models.json"), models_json).expect("models.json");
    std::fs::write(
        agent.join("settings.json"),
        json!({"defaultProvider": "fake", "defaultModel": "fake-model"}).to_string(),
    )
    .expect("settings.json");
    home
}

impl Pi {
    /// Starts `pi --mode rpc` in `cwd` with the extension, talking to the broker on `socket`.
    pub async fn start(
        install: &PiInstall,
        home: &Path,
        cwd: &Path,
        socket: &Path,
        args: &[&str],
    ) -> Pi {
        let env = [
            ("PI_IDE_BROKER_SOCKET", socket.as_os_str()),
            ("PI_IDE_BROKER_NO_SPAWN", std::ffi::OsStr::new("1")),
            (
                "PI_IDE_BROKER_BIN",
                std::ffi::OsStr::new("/nonexistent/pi-ide-broker"),
            ),
        ];
        Self::start_with(install, home, cwd, &env, args).await
    }

    /// Starts pi with these broker-related environment variables.
    pub async fn start_with(
        install: &PiInstall,
        home: &Path,
        cwd: &Path,
        env: &[(&str, &std::ffi::OsStr)],
        args: &[&str],
    ) -> Pi {
        let mut all: Vec<std::ffi::OsString> = vec!["-e".into(), extension_dir().into()];
        all.extend(args.iter().map(|a| a.into()));
        Self::launch(install, home, cwd, env, &all)
    }

    /// Starts pi with the extension in `ext` (a modified copy) instead of this repo's.
    pub async fn start_with_extension(
        install: &PiInstall,
        home: &Path,
        cwd: &Path,
        env: &[(&str, &std::ffi::OsStr)],
        ext: &Path,
    ) -> Pi {
        Self::launch(install, home, cwd, env, &["-e".into(), ext.into()])
    }

    /// Starts pi with only the extensions its settings name (a package `pi install`ed).
    pub async fn start_installed(
        install: &PiInstall,
        home: &Path,
        cwd: &Path,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Pi {
        Self::launch(install, home, cwd, env, &[])
    }

    fn launch(
        install: &PiInstall,
        home: &Path,
        cwd: &Path,
        env: &[(&str, &std::ffi::OsStr)],
        args: &[std::ffi::OsString],
    ) -> Pi {
        let mut cmd = Command::new(&install.node);
        cmd.arg(&install.cli)
            .args([
                "--mode",
                "rpc",
                "--provider",
                "fake",
                "--model",
                "fake-model",
            ])
            .args(args)
            .current_dir(cwd)
            .env("HOME", home)
            .env("PI_CODING_AGENT_DIR", home.join(".pi").join("agent"))
            .env("PI_OFFLINE", "1")
            .env_remove("XDG_RUNTIME_DIR")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("spawn pi");
        let stdin = child.stdin.take().expect("stdin");
        let (tx, rx) = mpsc::unbounded_channel();
        if let Some(out) = child.stdout.take() {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(out).split(b'\n');
                while let Ok(Some(l)) = lines.next_segment().await {
                    if let Ok(v) = serde_json::from_slice::<Value>(&l) {
                        let _ = tx.send((v, tokio::time::Instant::now()));
                    }
                }
            });
        }
        if let Some(err) = child.stderr.take() {
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(l)) = lines.next_line().await {
                    eprintln!("[pi stderr] {l}");
                }
            });
        }
        Pi {
            child,
            stdin,
            rx,
            log: Vec::new(),
            log_at: Vec::new(),
            next_id: 1,
            transcript: std::env::var("PI_TRANSCRIPT").is_ok_and(|v| v == "1"),
        }
    }

    /// Sends one RPC command and waits for its response.
    pub async fn command(&mut self, kind: &str, mut fields: Value) -> Value {
        let id = format!("t{}", self.next_id);
        self.next_id += 1;
        fields["id"] = json!(id);
        fields["type"] = json!(kind);
        let line = format!("{fields}\n");
        if self.transcript {
            eprintln!("→ {}", abbreviate(&fields));
        }
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write pi stdin");
        let from = self.log.len();
        self.until(&format!("response to {kind}"), from, |v| {
            v["type"] == "response" && v["id"] == id.as_str()
        })
        .await
    }

    /// Writes one raw record (e.g. an `extension_ui_response`).
    pub async fn send_raw(&mut self, record: Value) {
        if self.transcript {
            eprintln!("→ {}", abbreviate(&record));
        }
        let line = format!("{record}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write pi stdin");
    }

    /// Index of the next record: pass it to [`Pi::until`] to look only at what comes after.
    pub fn mark(&self) -> usize {
        self.log.len()
    }

    /// The first record at or after `from` matching `pred` (bounded wait).
    pub async fn until(&mut self, what: &str, from: usize, pred: impl Fn(&Value) -> bool) -> Value {
        self.until_within(what, from, pi_ide_broker::testkit::WAIT, pred)
            .await
    }

    /// [`Pi::until`] with its own bound, for what waits on more than pi and the broker.
    pub async fn until_within(
        &mut self,
        what: &str,
        from: usize,
        bound: std::time::Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        if let Some(v) = self.log[from.min(self.log.len())..]
            .iter()
            .find(|v| pred(v))
        {
            return v.clone();
        }
        let transcript = self.transcript;
        let (rx, log, log_at) = (&mut self.rx, &mut self.log, &mut self.log_at);
        let seen = tokio::time::timeout(bound, async {
            loop {
                let Some((v, at)) = rx.recv().await else {
                    panic!("pi exited before {what}");
                };
                if transcript {
                    eprintln!("← {}", abbreviate(&v));
                }
                log.push(v.clone());
                log_at.push(at);
                if pred(&v) {
                    return v;
                }
            }
        })
        .await;
        seen.unwrap_or_else(|_| panic!("timed out after {bound:?} waiting for {what}"))
    }

    /// A `notify` toast containing `text`, at or after `from`.
    pub async fn toast(&mut self, from: usize, text: &str) -> Value {
        let t = text.to_string();
        self.until(&format!("toast {text:?}"), from, move |v| {
            v["type"] == "extension_ui_request"
                && v["method"] == "notify"
                && v["message"].as_str().is_some_and(|m| m.contains(&t))
        })
        .await
    }

    /// Sends a prompt and waits until pi has settled.
    pub async fn prompt(&mut self, text: &str) {
        self.prompt_within(text, pi_ide_broker::testkit::WAIT).await;
    }

    /// [`Pi::prompt`] for a turn that waits on a person's review in a real editor (a browser
    /// driven by playwright): 60 s, since a busy two-core machine stretches the review far
    /// past the broker's 10 s steps.
    pub async fn prompt_reviewed(&mut self, text: &str) {
        self.prompt_within(text, std::time::Duration::from_secs(60))
            .await;
    }

    async fn prompt_within(&mut self, text: &str, bound: std::time::Duration) {
        let from = self.mark();
        let r = self.command("prompt", json!({"message": text})).await;
        assert_eq!(r["success"], true, "{r}");
        self.until_within("agent_settled", from, bound, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    }

    /// Tool results seen since `from`: (tool name, is_error, text).
    pub fn tool_results(&self, from: usize) -> Vec<(String, bool, String)> {
        self.log[from..]
            .iter()
            .filter(|v| v["type"] == "tool_execution_end")
            .map(|v| {
                let text = v["result"]["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n");
                (
                    v["toolName"].as_str().unwrap_or_default().to_string(),
                    v["isError"].as_bool().unwrap_or(false),
                    text,
                )
            })
            .collect()
    }

    /// Closes stdin (pi's orderly shutdown) and waits for the exit.
    pub async fn quit(mut self) {
        let _ = self.stdin.shutdown().await;
        drop(self.stdin);
        let _ = within("pi exit", self.child.wait()).await;
    }
}

/// One line per record for the transcript: type, and the fields a reader needs.
fn abbreviate(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > 240 {
        let mut cut = 240;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}
