//! The real GitHub Copilot CLI (`@github/copilot`, pinned in `.ci/npm/copilot`; `.ci/run`
//! exports its native binary as `PI_IDE_BROKER_COPILOT`) in a pty (`script`), offline:
//! `COPILOT_OFFLINE` with a fake OpenAI-compatible `/chat/completions` on 127.0.0.1, a temp
//! `COPILOT_HOME` whose `ide` dir is the broker's copilot door's, its folder trusted there.

use crate::common::broker::TestBroker;
use crate::common::fake_model::{FakeModel, Reply};
use crate::common::FakeEditor;
use pi_ide_broker::sys::config::Config;
use pi_ide_broker::testkit::eventually;
use pi_ide_broker::testkit::fake_editor::Options;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// The pinned Copilot CLI's native binary, or `None` (said) to skip.
fn find_copilot() -> Option<PathBuf> {
    match std::env::var_os("PI_IDE_BROKER_COPILOT").filter(|p| !p.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(
                p.exists(),
                "PI_IDE_BROKER_COPILOT={} is not there",
                p.display()
            );
            Some(p)
        }
        None => {
            crate::common::cannot_run(
                "copilot::real: set PI_IDE_BROKER_COPILOT (bash .ci/run installs the pinned Copilot CLI)",
            );
            None
        }
    }
}

/// One interactive Copilot CLI in a pty; what it drew is kept, its cursor queries answered.
struct CopilotTui {
    /// Where Copilot CLI writes its logs (`$COPILOT_HOME/logs`), shown when a wait fails.
    logs: PathBuf,
    child: tokio::process::Child,
    keys: mpsc::UnboundedSender<Vec<u8>>,
    screen: Arc<Mutex<String>>,
}

impl CopilotTui {
    fn start(copilot: &Path, env: &[(&str, String)], cwd: &Path, logs: PathBuf) -> CopilotTui {
        let line = format!("stty cols 160 rows 50; exec {}", copilot.display());
        let mut cmd = tokio::process::Command::new("script");
        cmd.args(["-qfec", &line, "/dev/null"])
            .current_dir(cwd)
            .env("TERM", "xterm-256color")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .env_remove("GH_TOKEN")
            .env_remove("GITHUB_TOKEN")
            .env_remove("COPILOT_GITHUB_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn script");
        let mut stdin = child.stdin.take().expect("stdin");
        let (keys, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(k) = rx.recv().await {
                if stdin.write_all(&k).await.is_err() {
                    break;
                }
            }
        });
        let screen = Arc::new(Mutex::new(String::new()));
        for mut out in [
            Box::new(child.stdout.take().expect("stdout"))
                as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let (screen, keys) = (screen.clone(), keys.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n) = out.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]);
                    if text.contains("\x1b[6n") {
                        let _ = keys.send(b"\x1b[1;1R".to_vec());
                    }
                    screen.lock().expect("screen").push_str(&text);
                }
            });
        }
        CopilotTui {
            logs,
            child,
            keys,
            screen,
        }
    }

    /// Forgets what was drawn so far: a later [`CopilotTui::wait_for`] sees only what comes
    /// after (a line such as "Connected to" shown again).
    fn forget(&self) {
        self.screen.lock().expect("screen").clear();
    }

    /// Whether the screen has shown `text` (escapes and spaces left out).
    fn shown(&self, text: &str) -> bool {
        let plain: String = crate::codex::real::strip_escapes(&self.screen.lock().expect("screen"))
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        plain.contains(&text.replace(' ', ""))
    }

    /// Waits (60 s at most) until the screen has shown `text` (a byte stream with no event to
    /// await: read every 50 ms).
    async fn wait_for(&self, text: &str) {
        let shown = tokio::time::timeout(Duration::from_secs(60), async {
            while !self.shown(text) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        if shown.is_err() {
            let s = crate::codex::real::strip_escapes(&self.screen.lock().expect("screen"));
            let log = self.log();
            panic!(
                "Copilot CLI never showed {text:?}; its screen ends:\n{}\nits log ends:\n{}",
                tail(&s, 4000),
                tail(&log, 6000)
            );
        }
    }

    /// What Copilot CLI logged so far.
    fn log(&self) -> String {
        std::fs::read_dir(&self.logs)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect()
    }

    /// Waits (60 s at most) until Copilot CLI has logged `text` `n` times (what it does not
    /// draw, such as its first connect to the IDE; its log file read every 50 ms).
    async fn wait_log(&self, text: &str, n: usize) {
        let logged = tokio::time::timeout(Duration::from_secs(60), async {
            while self.log().matches(text).count() < n {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        if logged.is_err() {
            let s = crate::codex::real::strip_escapes(&self.screen.lock().expect("screen"));
            panic!(
                "Copilot CLI never logged {text:?} {n} times; its screen ends:\n{}\nits log ends:\n{}",
                tail(&s, 4000),
                tail(&self.log(), 6000)
            );
        }
    }

    /// Types `text`, waits until it shows, then presses Enter.
    async fn type_line(&self, text: &str) {
        // One write: drawn at once, so no hint line lands between its characters.
        let _ = self.keys.send(text.as_bytes().to_vec());
        self.wait_for(text).await;
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let _ = self.keys.send(b"\r".to_vec());
    }

    async fn quit(mut self) {
        let _ = self.child.kill().await;
    }
}

fn tail(s: &str, n: usize) -> &str {
    let mut at = s.len().saturating_sub(n);
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}

/// Issue 65's first acceptance steps with the real Copilot CLI: started in the folder of an
/// editor the broker links, it connects to the broker's lockfile by itself, shows the
/// editor's selection in its footer; an edit accepted in the editor is written, one rejected
/// there is not (and the turn is cancelled); `/ide` lists the editor through the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_sees_the_selection_reviews_edits_in_the_editor_and_lists_it_in_ide() {
    let Some(copilot) = find_copilot() else {
        return;
    };
    // Copilot CLI's start loads the machine (a 200 MB binary unpacking its JavaScript): its
    // turn among the heavy tests, so the flood tests' bounds measure the broker.
    let _heavy = crate::common::machine_heavy().await;
    let b = TestBroker::start_with(|c| {
        c.copilot.enabled = true;
        let root = c
            .copilot
            .dir
            .as_ref()
            .and_then(|d| d.parent())
            .map(Path::to_path_buf);
        c.copilot.dir = root.map(|r| r.join("copilot-home").join("ide"));
    })
    .await;
    let proj = b.dir.path().join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    let proj = std::fs::canonicalize(&proj).expect("canonical proj");
    std::fs::write(proj.join("a.rs"), "fn one() {}\nfn two() {}\n").expect("write a.rs");
    let folder = proj.display().to_string();
    let (fe, _): (FakeEditor, String) = b.editor(&[&folder]).await;

    let copilot_home = b.dir.path().join("copilot-home");
    std::fs::create_dir_all(&copilot_home).expect("mkdir copilot home");
    let trusted = serde_json::json!({"trustedFolders": [folder]}).to_string();
    std::fs::write(copilot_home.join("config.json"), trusted).expect("config.json");
    let settings = r#"{"showTipsOnStartup": false}"#;
    std::fs::write(copilot_home.join("settings.json"), settings).expect("settings.json");
    let mut model = FakeModel::start().await;
    let cache = std::env::temp_dir().join("pi-ide-broker-copilot-cache");
    let env = [
        ("HOME", b.dir.path().join("home").display().to_string()),
        ("COPILOT_HOME", copilot_home.display().to_string()),
        ("COPILOT_CACHE_HOME", cache.display().to_string()),
        ("COPILOT_OFFLINE", "true".into()),
        (
            "COPILOT_PROVIDER_BASE_URL",
            format!("http://127.0.0.1:{}", model.port),
        ),
        ("COPILOT_MODEL", "fake-model".into()),
    ];
    let tui = CopilotTui::start(&copilot, &env, &proj, copilot_home.join("logs"));
    tui.wait_for("❯").await;
    // Its session came through the copilot door, its cwd the CLI's own (the socket peer's).
    b.wait_status("a copilot session in the project", |st| {
        st["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["door"] == "copilot" && s["cwd"] == folder.as_str())
    })
    .await;

    // The editor's selection, pushed on the session's event stream, is in the footer.
    fe.select(&proj.join("a.rs").display().to_string(), "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;

    // An edit the model asks for is reviewed in the editor: accepted there, Copilot CLI
    // writes it; rejected there, the file stays as it was.
    let file = proj.join("a.rs");
    for (old, new, accept) in [
        ("fn one() {}", "fn uno() {}", true),
        ("fn two() {}", "fn dos() {}", false),
    ] {
        let args =
            serde_json::json!({"path": file.display().to_string(), "old_str": old, "new_str": new});
        model.push(Reply::Tool {
            name: "edit".into(),
            args,
        });

        tui.type_line(if accept { "edit1" } else { "edit2" }).await;
        let tab = eventually("a diff in the editor", || {
            let p = fe.pending_diffs();
            (p.len() == 1).then(|| p[0].clone())
        })
        .await;
        assert!(tab.contains("a.rs"), "{tab}");
        let before = std::fs::read_to_string(&file).expect("read a.rs");
        let proposed = before.replace(old, new);
        if accept {
            assert!(fe.accept_diff(&tab, &proposed));
            eventually("Copilot CLI wrote the edit", || {
                (std::fs::read_to_string(&file).ok()? == proposed).then_some(())
            })
            .await;
            // The turn goes on with the edit's outcome (answered "ok"): the next edit waits
            // for that request, so no request of this turn takes the next scripted call.
            loop {
                let body = model.next_request().await;
                let last = body["messages"].as_array().and_then(|m| m.last()).cloned();
                if last.is_some_and(|m| m["role"] == "tool") {
                    break;
                }
            }
        } else {
            assert!(fe.reject_diff(&tab));
            tui.wait_for("The user rejected this tool call").await;
            assert_eq!(std::fs::read_to_string(&file).expect("read a.rs"), before);
        }
    }

    // `/ide` lists the editor, through the broker, on its folder, as the current one.
    tui.type_line("/ide").await;
    tui.wait_for("Select an IDE workspace to connect to:").await;
    tui.wait_for(&format!("Neovim (via pi-ide-broker): {folder} (current)"))
        .await;
    if std::env::var_os("COPILOT_TEST_DUMP").is_some() {
        let s = crate::codex::real::strip_escapes(&tui.screen.lock().expect("screen"));
        eprintln!("{}", tail(&s, 6000));
    }
    tui.quit().await;
    b.stop().await;
}

/// The copilot door on, its dir `copilot-home/ide` beside the broker's dirs (the CLI's
/// `COPILOT_HOME` below).
fn copilot_on(c: &mut Config) {
    c.copilot.enabled = true;
    let root = c
        .copilot
        .dir
        .as_ref()
        .and_then(|d| d.parent())
        .map(Path::to_path_buf);
    c.copilot.dir = root.map(|r| r.join("copilot-home").join("ide"));
}

/// A Copilot CLI in `proj` (the editor's folder) of broker dir `root`, offline against `model`,
/// `COPILOT_HOME` the door's, the folder trusted. Waits for its prompt.
async fn start_copilot(copilot: &Path, root: &Path, proj: &Path, model: &FakeModel) -> CopilotTui {
    let copilot_home = root.join("copilot-home");
    std::fs::create_dir_all(&copilot_home).expect("mkdir copilot home");
    let trusted = serde_json::json!({"trustedFolders": [proj.display().to_string()]}).to_string();
    std::fs::write(copilot_home.join("config.json"), trusted).expect("config.json");
    let settings = r#"{"showTipsOnStartup": false}"#;
    std::fs::write(copilot_home.join("settings.json"), settings).expect("settings.json");
    let cache = std::env::temp_dir().join("pi-ide-broker-copilot-cache");
    let env = [
        ("HOME", root.join("home").display().to_string()),
        ("COPILOT_HOME", copilot_home.display().to_string()),
        ("COPILOT_CACHE_HOME", cache.display().to_string()),
        ("COPILOT_OFFLINE", "true".into()),
        (
            "COPILOT_PROVIDER_BASE_URL",
            format!("http://127.0.0.1:{}", model.port),
        ),
        ("COPILOT_MODEL", "fake-model".into()),
    ];
    let tui = CopilotTui::start(copilot, &env, proj, copilot_home.join("logs"));
    tui.wait_for("❯").await;
    tui
}

/// The project folder `proj` (canonical) of broker dir `root`, with `a.rs` of two lines.
fn project(root: &Path) -> PathBuf {
    let proj = root.join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    let proj = std::fs::canonicalize(&proj).expect("canonical proj");
    std::fs::write(proj.join("a.rs"), "fn one() {}\nfn two() {}\n").expect("write a.rs");
    proj
}

/// The lockfiles in the door's dir (the names).
fn lockfiles(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.join("copilot-home").join("ide"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.ends_with(".lock"))
        .collect();
    v.sort();
    v
}

/// Waits until the door's dir holds exactly one lockfile, other than `old` if named; its name.
async fn one_lockfile(root: &Path, old: Option<&str>) -> String {
    eventually("one copilot lockfile", || {
        let l = lockfiles(root);
        (l.len() == 1 && Some(l[0].as_str()) != old).then(|| l[0].clone())
    })
    .await
}

/// Waits until broker `b` has a copilot session whose cwd is `folder`.
async fn copilot_session(b: &TestBroker, folder: &str) {
    b.wait_status("a copilot session in the project", |st| {
        st["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["door"] == "copilot" && s["cwd"] == folder)
    })
    .await;
}

/// Issue 65: an editor restart is survived. The editor goes (its lockfile removed, its process
/// dead): the Copilot CLI shows the IDE connection lost at once (no stale "connected" to an
/// editor that is not there); it comes back on the same folder (the same id, a successor):
/// the CLI connects to it again by itself and shows its selection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_loses_a_dead_editor_and_reconnects_to_its_restart() {
    let Some(copilot) = find_copilot() else {
        return;
    };
    // Copilot CLI's start loads the machine (a 200 MB binary unpacking its JavaScript): its
    // turn among the heavy tests, so the flood tests' bounds measure the broker.
    let _heavy = crate::common::machine_heavy().await;
    // A grace period longer than any wait here: the CLI must learn at once that the editor
    // went, not when the broker gives up on it, and the restart comes within it.
    let b = TestBroker::start_with(|c| {
        copilot_on(c);
        c.editor_grace_ms = 600_000;
    })
    .await;
    let proj = project(b.dir.path());
    let folder = proj.display().to_string();
    let file = proj.join("a.rs").display().to_string();
    let (fe, id) = b.editor(&[&folder]).await;
    let first = one_lockfile(b.dir.path(), None).await;
    let model = FakeModel::start().await;
    let tui = start_copilot(&copilot, b.dir.path(), &proj, &model).await;
    // Connected for good (not only the selection pushed while its handshake goes on): a lockfile
    // removed before then is a failed connect, not a lost connection.
    tui.wait_log("Connected to IDE MCP server", 1).await;
    copilot_session(&b, &folder).await;
    fe.select(&file, "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;

    tui.forget();
    fe.remove_lockfile();
    fe.crash().await;
    b.wait_editor_gone(fe.port).await;
    tui.wait_for("IDE connection lost").await;
    eventually("the lockfile withdrawn", || {
        lockfiles(b.dir.path()).is_empty().then_some(())
    })
    .await;

    // The restart: a new process on a new port, the same folder, the same id; a fresh lockfile.
    let (fe2, id2) = b.start_editor(Options::pi(&[&folder])).await;
    assert_eq!(id2, id, "a restart of the same editor keeps its id");
    let second = one_lockfile(b.dir.path(), Some(&first)).await;
    assert_ne!(second, first);
    tui.wait_for("Connected to Neovim (via pi-ide-broker)")
        .await;
    copilot_session(&b, &folder).await;
    fe2.select(&file, "fn one() {}", 0);
    tui.wait_for("@a.rs:1").await;
    tui.quit().await;
    b.stop().await;
}

/// Issue 65: a broker restart is survived. The broker stops (its lockfiles withdrawn: the CLI
/// shows the connection lost), a new one starts on the same dirs with the editor still up: it
/// publishes a fresh lockfile, the CLI connects to it by itself and the selection comes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_reconnects_after_a_broker_restart() {
    let Some(copilot) = find_copilot() else {
        return;
    };
    // Copilot CLI's start loads the machine (a 200 MB binary unpacking its JavaScript): its
    // turn among the heavy tests, so the flood tests' bounds measure the broker.
    let _heavy = crate::common::machine_heavy().await;
    let b = TestBroker::start_with(copilot_on).await;
    let proj = project(b.dir.path());
    let folder = proj.display().to_string();
    let file = proj.join("a.rs").display().to_string();
    let (fe, id) = b.editor(&[&folder]).await;
    let first = one_lockfile(b.dir.path(), None).await;
    let model = FakeModel::start().await;
    let tui = start_copilot(&copilot, b.dir.path(), &proj, &model).await;
    // Connected for good (not only the selection pushed while its handshake goes on): a lockfile
    // removed before then is a failed connect, not a lost connection.
    tui.wait_log("Connected to IDE MCP server", 1).await;
    copilot_session(&b, &folder).await;
    fe.select(&file, "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;

    tui.forget();
    let dir = b.stop_keep_dir().await;
    tui.wait_for("IDE connection lost").await;
    assert!(
        lockfiles(dir.path()).is_empty(),
        "a stopped broker leaves no lockfile"
    );

    let b = TestBroker::start_in(dir, copilot_on).await;
    let e = b.wait_editor(fe.port, "ready").await;
    assert_eq!(
        e["id"],
        id.as_str(),
        "the editor keeps its id across a broker restart"
    );
    let second = one_lockfile(b.dir.path(), Some(&first)).await;
    assert_ne!(second, first);
    tui.wait_for("Connected to Neovim (via pi-ide-broker)")
        .await;
    copilot_session(&b, &folder).await;
    fe.select(&file, "fn one() {}", 0);
    tui.wait_for("@a.rs:1").await;
    tui.quit().await;
    b.stop().await;
}

/// Issue 65 with a real editor: Neovim with pi-ide.nvim, linked by the broker; the real Copilot
/// CLI in its folder connects through the copilot door, shows the selection made in Neovim,
/// and an edit the model asks for, accepted in Neovim, is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_with_a_real_neovim_shows_its_selection_and_writes_an_accepted_edit() {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let Some(copilot) = find_copilot() else {
        return;
    };
    // Copilot CLI's start loads the machine (a 200 MB binary unpacking its JavaScript): its
    // turn among the heavy tests, so the flood tests' bounds measure the broker.
    let _heavy = crate::common::machine_heavy().await;
    let b = TestBroker::start_with(copilot_on).await;
    let proj = project(b.dir.path());
    let folder = proj.display().to_string();
    let file = proj.join("a.rs");
    let Some(ed) = NvimEditor::start(&b, Plugin::PiIde, &proj, "nvim").await else {
        return;
    };
    b.wait_editor(ed.port, "ready").await;
    one_lockfile(b.dir.path(), None).await;
    let model = FakeModel::start().await;
    let tui = start_copilot(&copilot, b.dir.path(), &proj, &model).await;
    tui.wait_log("Connected to IDE MCP server", 1).await;
    copilot_session(&b, &folder).await;
    ed.select(&file, 2).await;
    tui.wait_for("@a.rs:2").await;

    let (old, new) = ("fn one() {}", "fn uno() {}");
    let args =
        serde_json::json!({"path": file.display().to_string(), "old_str": old, "new_str": new});
    model.push(Reply::Tool {
        name: "edit".into(),
        args,
    });
    tui.type_line("edit1").await;
    ed.pending_until("the diff open in Neovim", |s| !s.is_empty())
        .await;
    let proposed = std::fs::read_to_string(&file)
        .expect("read a.rs")
        .replace(old, new);
    ed.accept(&file, "a.rs", "").await;
    eventually("Copilot CLI wrote the edit accepted in Neovim", || {
        (std::fs::read_to_string(&file).ok()? == proposed).then_some(())
    })
    .await;
    tui.quit().await;
    b.stop().await;
}
