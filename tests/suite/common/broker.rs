//! The daemon under test: started in-process on a throwaway dir, stopped on drop; its status
//! read back, and the waits on it.

use super::{FakeEditor, Options};
use pi_ide_broker::broker::Handle;
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::sys::config::{Config, LockDirConfig};
use pi_ide_broker::testkit::within;
use serde_json::Value;
use std::path::PathBuf;
use tokio_util::sync::CancellationToken;

/// A broker running in this process.
pub struct TestBroker {
    pub dir: tempfile::TempDir,
    pub pi_dir: PathBuf,
    pub claude_dir: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    pub handle: Handle,
    shutdown: CancellationToken,
    join: Option<tokio::task::JoinHandle<()>>,
}

/// A config for a test broker rooted at `root`.
pub fn test_config(root: &std::path::Path) -> Config {
    let mut c = Config {
        lock_dirs: Some(vec![
            LockDirConfig {
                path: root.join("pi-ide"),
                family: Family::Pi,
            },
            LockDirConfig {
                path: root.join("claude-ide"),
                family: Family::Claude,
            },
        ]),
        socket: Some(root.join("run").join("sock")),
        state_dir: Some(root.join("state")),
        ..Config::default()
    };
    // The broker's notion of the user's home: never the real one.
    c.home = Some(root.join("home"));
    c.edit_section(|s: &mut pi_ide_broker::frontdoor::compat::CompatConfig| {
        s.lock_dir = Some(root.join("compat"))
    });
    c.edit_section(|s: &mut pi_ide_broker::frontdoor::gemini::GeminiConfig| {
        s.dir = Some(root.join("gemini"))
    });
    c.edit_section(|s: &mut pi_ide_broker::frontdoor::gemini::GeminiConfig| {
        s.qwen_dir = Some(root.join("qwen-ide"))
    });
    c.edit_section(|s: &mut pi_ide_broker::frontdoor::codex::CodexConfig| {
        s.socket = Some(root.join("codex-ipc").join("ipc.sock"))
    });
    c.edit_section(|s: &mut pi_ide_broker::frontdoor::copilot::CopilotConfig| {
        s.dir = Some(root.join("copilot-ide"));
        s.editor_dirs = Some(vec![root.join("copilot-ide")]);
    });
    c.backoff.initial_ms = 50;
    c.backoff.max_ms = 1000;
    c
}

/// How long a claim of this process's may stay held by a child forked before it execs.
const CLAIM_HELD_BY_A_FORK: std::time::Duration = std::time::Duration::from_secs(2);

impl TestBroker {
    pub async fn start() -> TestBroker {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> TestBroker {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::start_in(dir, tweak).await
    }

    pub async fn start_in(dir: tempfile::TempDir, tweak: impl FnOnce(&mut Config)) -> TestBroker {
        let mut config = test_config(dir.path());
        tweak(&mut config);
        // The editors' lock dirs, as editors that ran before make them (the broker never does).
        std::fs::create_dir_all(dir.path().join("pi-ide")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("claude-ide")).expect("mkdir");
        let socket = config.socket.clone().expect("socket");
        let state_dir = config.state_dir.clone().expect("state");
        let shutdown = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stop = shutdown.clone();
        let join = tokio::spawn(async move {
            let tx = std::sync::Mutex::new(Some(tx));
            let t0 = std::time::Instant::now();
            loop {
                let r = pi_ide_broker::serve(config.clone(), stop.clone(), |_ready, handle| {
                    if let Some(tx) = tx.lock().expect("ready").take() {
                        let _ = tx.send(handle);
                    }
                })
                .await;
                match r {
                    Ok(()) => return,
                    // A broker started on the dir of one just stopped in this process: a child
                    // another test forks at that moment holds the stopped one's claim (its lock
                    // file's description) until it execs, a millisecond or so.
                    Err(pi_ide_broker::broker::Error::Socket(
                        pi_ide_broker::platform::Error::AlreadyRunning { pid, .. },
                    )) if pid == std::process::id() && t0.elapsed() < CLAIM_HELD_BY_A_FORK => {
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("serve failed: {e}"),
                }
            }
        });
        let handle = within("broker ready", rx)
            .await
            .expect("broker failed to start");
        TestBroker {
            pi_dir: dir.path().join("pi-ide"),
            claude_dir: dir.path().join("claude-ide"),
            socket,
            state_dir,
            dir,
            handle,
            shutdown,
            join: Some(join),
        }
    }

    /// GET /v1/status over the real socket.
    pub async fn status(&self) -> Value {
        within(
            "status",
            pi_ide_broker::frontdoor::client::get_json(&self.socket, "/v1/status"),
        )
        .await
        .expect("status request failed")
    }

    /// Waits (on change notifications, bounded) until `pred` holds for the status JSON.
    pub async fn wait_status(&self, what: &str, pred: impl FnMut(&Value) -> bool) -> Value {
        self.wait_status_for(pi_ide_broker::testkit::WAIT, what, pred)
            .await
    }

    /// [`TestBroker::wait_status`] with its own bound: for a change that waits on a real
    /// program's own timing (an old VS Code extension host going after a reload), where the
    /// bound of one step is wrong.
    pub async fn wait_status_for(
        &self,
        bound: std::time::Duration,
        what: &str,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Value {
        let mut changes = self.handle.registry().subscribe_changes();
        pi_ide_broker::testkit::within_for(bound, what, async {
            loop {
                let st = serde_json::to_value(pi_ide_broker::frontdoor::status::status(
                    self.handle.registry(),
                ))
                .unwrap_or(Value::Null);
                if pred(&st) {
                    return st;
                }
                let _ = changes.changed().await;
            }
        })
        .await
    }

    /// Waits until the editor on `port` is in `state`; returns its status entry.
    pub async fn wait_editor(&self, port: u16, state: &str) -> Value {
        let st = self
            .wait_status(&format!("editor on port {port} to be {state}"), |st| {
                editor_by_port(st, port).is_some_and(|e| e["state"] == state)
            })
            .await;
        editor_by_port(&st, port).cloned().unwrap_or(Value::Null)
    }

    /// Waits until no editor listens on `port` in the status.
    pub async fn wait_editor_gone(&self, port: u16) {
        self.wait_status(&format!("editor on port {port} to leave"), |st| {
            editor_by_port(st, port).is_none()
        })
        .await;
    }

    /// Starts a pi-family fake editor with its lockfile in the pi dir and waits until ready.
    pub async fn editor(&self, folders: &[&str]) -> (FakeEditor, String) {
        self.start_editor(Options::pi(folders)).await
    }

    /// Starts a fake editor with its lockfile in its family's lock dir, waits until its link
    /// is ready, and returns it with its id.
    pub async fn start_editor(&self, opts: Options) -> (FakeEditor, String) {
        let dir = match opts.family {
            Family::Pi => &self.pi_dir,
            Family::Claude => &self.claude_dir,
        };
        let fe = FakeEditor::start_in(dir, opts).await.expect("fake editor");
        let e = self.wait_editor(fe.port, "ready").await;
        let id = e["id"].as_str().unwrap_or_default().to_string();
        (fe, id)
    }

    /// Stops the broker gracefully and waits for it.
    pub async fn stop(self) {
        drop(self.stop_keep_dir().await);
    }

    /// Stops the broker gracefully, keeping its dir (to start another broker on it).
    pub async fn stop_keep_dir(mut self) -> tempfile::TempDir {
        self.shutdown.cancel();
        if let Some(j) = self.join.take() {
            within("broker stop", j)
                .await
                .expect("broker task panicked");
        }
        let empty = tempfile::tempdir().expect("tempdir");
        std::mem::replace(&mut self.dir, empty)
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn editor_by_port(st: &Value, port: u16) -> Option<&Value> {
    st["editors"].as_array()?.iter().find(|e| e["port"] == port)
}

pub fn editor_by_id<'a>(st: &'a Value, id: &str) -> Option<&'a Value> {
    st["editors"].as_array()?.iter().find(|e| e["id"] == id)
}

/// Waits until the pi-ide-like scan of compat dir `dir` finds an entry for `cwd`.
pub async fn compat_entry(
    dir: &std::path::Path,
    cwd: &str,
) -> pi_ide_broker::testkit::pi_client::Candidate {
    within("a compat entry", async {
        loop {
            if let Some(c) = pi_ide_broker::testkit::pi_client::find_candidates(dir, cwd)
                .await
                .pop()
            {
                return c;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
}
