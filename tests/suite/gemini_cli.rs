//! Issue 28, end to end: the real Gemini CLI (interactive, in a pty made by `script`) with IDE
//! mode on, against a fake Gemini API, reaching a fake editor through the broker's gemini door.

use crate::common::fake_gemini::{all_text, FakeGemini, Reply};
use crate::common::gemini::*;
use crate::common::tui::{strip_escapes, tail};
use crate::common::*;
use pi_ide_broker::testkit::eventually;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};

/// One interactive Gemini CLI in a pty; everything it drew is kept (`screen`).
struct GeminiTui {
    child: Child,
    stdin: ChildStdin,
    screen: Arc<Mutex<String>>,
}

impl GeminiTui {
    fn start(g: &GeminiInstall, root: &Path, project: &Path, api: u16) -> GeminiTui {
        let home = root.join("gemini-home");
        std::fs::create_dir_all(home.join(".gemini")).expect("mkdir gemini home");
        let settings = json!({
            "ide": {"enabled": true, "hasSeenNudge": true},
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
            "general": {"disableAutoUpdate": true, "disableUpdateNag": true, "enableAutoUpdate": false, "enableAutoUpdateNotification": false},
            "privacy": {"usageStatisticsEnabled": false},
            "ui": {"theme": "Default"},
        });
        std::fs::write(
            home.join(".gemini").join("settings.json"),
            settings.to_string(),
        )
        .expect("settings.json");
        let mut cmd = tui_command(&g.node, &g.cli(), "", project);
        cmd.env("GEMINI_CLI_HOME", &home)
            .env("HOME", &home)
            .env("TMPDIR", root.join("tmp"))
            .env("GEMINI_API_KEY", "fake-key")
            .env("GOOGLE_GEMINI_BASE_URL", format!("http://127.0.0.1:{api}"))
            .env("GEMINI_CLI_IDE_PID", std::process::id().to_string());
        Self::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> GeminiTui {
        let mut child = cmd.spawn().expect("spawn script");
        let stdin = child.stdin.take().expect("stdin");
        let screen = Arc::new(Mutex::new(String::new()));
        for mut out in [
            Box::new(child.stdout.take().expect("stdout"))
                as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let screen = screen.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                while let Ok(n) = out.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    screen
                        .lock()
                        .expect("screen")
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        GeminiTui {
            child,
            stdin,
            screen,
        }
    }

    fn screen(&self) -> String {
        self.screen.lock().expect("screen").clone()
    }

    /// Waits until the screen (since the start) shows `text`.
    async fn wait_for(&self, text: &str) {
        self.wait_until(text, |tui| tui.shown(text) > 0).await;
    }

    /// Types `text`, and presses Enter once the prompt shows it (Ink reads a line that comes
    /// in one piece with its Enter as a paste); again while the prompt still holds the line
    /// (a CLI on a busy machine can miss an Enter: issue 29's soak saw the line sit typed in
    /// the prompt for 30 s). An Enter on an empty prompt does nothing.
    async fn type_line(&mut self, text: &str) {
        self.type_text(text).await;
        for _ in 0..10 {
            self.stdin.write_all(b"\r").await.expect("enter");
            let taken = |tui: &Self| tui.prompt_is_empty_after(text);
            if self.holds_within(Duration::from_secs(3), taken).await {
                return;
            }
        }
    }

    /// Types `text` (no Enter) and waits until the prompt shows it.
    async fn type_text(&mut self, text: &str) {
        let before = self.shown(text);
        self.stdin.write_all(text.as_bytes()).await.expect("type");
        self.wait_until(text, |tui| tui.shown(text) > before).await;
    }

    /// Whether the prompt, empty again, was drawn after `text` last was (the line was taken).
    fn prompt_is_empty_after(&self, text: &str) -> bool {
        let screen = strip_escapes(&self.screen());
        match (screen.rfind(text), screen.rfind("Type your message")) {
            (Some(line), Some(prompt)) => prompt > line,
            _ => false,
        }
    }

    /// How many times the screen (since the start) has shown `text`.
    fn shown(&self, text: &str) -> usize {
        strip_escapes(&self.screen()).matches(text).count()
    }

    /// Waits (60 s at most) until `done` holds of the screen; shows it if not.
    async fn wait_until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        if !self.holds_within(Duration::from_secs(60), done).await {
            panic!(
                "the CLI never showed {what:?}; its screen:\n{}",
                tail(&strip_escapes(&self.screen()), 6000)
            );
        }
    }

    /// Whether `done` comes to hold of the screen within `limit` (the screen is a byte stream
    /// with no event to await: it is read every 100 ms).
    async fn holds_within(&self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let held = tokio::time::timeout(limit, async {
            while !done(self) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        held.await.is_ok()
    }

    /// Asks `/ide status` until the CLI says it is connected to the IDE, which it says only
    /// once it has listed the IDE's tools: a prompt typed before that gets its edits confirmed
    /// in the terminal, with no diff in the editor (a race the fresh-clone CI run hit with
    /// Qwen Code). A CLI that has drawn its prompt may not know its slash commands yet (Qwen
    /// Code then says "Unknown command"): that is an answer too, and the question is asked
    /// again.
    async fn wait_ide_connected(&mut self) {
        const ANSWERS: [&str; 4] = [
            "Connected to",
            "Connecting",
            "Disconnected",
            "Unknown command: /ide",
        ];
        for _ in 0..30 {
            let connected = self.shown("Connected to");
            let answered = |tui: &Self| ANSWERS.iter().map(|a| tui.shown(a)).sum::<usize>();
            let before = answered(self);
            self.type_line("/ide status").await;
            self.wait_until("an /ide status answer", |tui| answered(tui) > before)
                .await;
            if self.shown("Connected to") > connected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "the CLI never connected to the IDE; its screen:\n{}",
            tail(&strip_escapes(&self.screen()), 6000)
        );
    }

    async fn quit(mut self) {
        // Not `type_line`: a CLI that quits draws no empty prompt.
        self.type_text("/quit").await;
        self.stdin.write_all(b"\r").await.expect("enter");
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// `node <cli> <args>` in a pty (`script`, 160x50) in `cwd`, with the environment a loopback test
/// needs: no proxies, and `SSH_CONNECTION` (in a container the CLIs dial
/// host.docker.internal instead of 127.0.0.1 unless they see SSH).
fn tui_command(node: &Path, cli: &Path, args: &str, cwd: &Path) -> Command {
    let line = format!(
        "stty cols 160 rows 50; exec {} {} {args}",
        node.display(),
        cli.display()
    );
    let mut cmd = Command::new("script");
    cmd.args(["-qfec", &line, "/dev/null"])
        .current_dir(cwd)
        .env("SSH_CONNECTION", "127.0.0.1 1 127.0.0.1 2")
        .env("TERM", "xterm-256color")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Ink's `is-in-ci` turns the interactive app off when it sees CI, CONTINUOUS_INTEGRATION
    // or any CI_* variable (Gemini CLI's troubleshooting guide), and .ci/run runs with CI=true:
    // the CLI must see the environment a user's terminal has.
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k == "CI" || k == "CONTINUOUS_INTEGRATION" || k.starts_with("CI_") {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// The tab of the first diff pending in `fe`, waited for; the CLI's screen is shown if none comes.
async fn diff_opened(fe: &FakeEditor, tui: &GeminiTui) -> String {
    let found = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(t) = fe.pending_diffs().first() {
                return t.clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    match found {
        Ok(t) => t,
        Err(_) => panic!(
            "no diff opened in the editor; the CLI's screen:\n{}",
            tail(&strip_escapes(&tui.screen()), 6000)
        ),
    }
}

/// True when `script` (util-linux: a pty for the interactive CLI) runs; else skips or fails
/// as [`find_gemini`] does.
fn have_script() -> bool {
    let ok = std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let msg = "`script` (util-linux) not found: the interactive Gemini CLI needs a pty";
        crate::common::cannot_run(msg);
    }
    ok
}

/// A broker whose gemini dir is `<root>/tmp/gemini/ide` (Gemini CLI runs with `TMPDIR=<root>/tmp`),
/// a fake editor on a real project folder, and a file the editor has focused.
async fn scene() -> (TestBroker, FakeEditor, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_path_buf();
    let b = TestBroker::start_in(dir, |c| {
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::gemini::GeminiConfig| {
            s.dir = Some(root.join("tmp").join("gemini").join("ide"))
        });
    })
    .await;
    let project = std::fs::canonicalize(b.dir.path())
        .expect("canonical")
        .join("project");
    std::fs::create_dir_all(&project).expect("project");
    let fe = FakeEditor::start_in(&b.pi_dir, Options::pi(&[project.to_str().unwrap_or("/")]))
        .await
        .expect("fake editor");
    b.wait_editor(fe.port, "ready").await;
    (b, fe, project)
}

#[tokio::test]
async fn the_real_gemini_cli_gets_editor_context_and_its_edits_reviewed_in_the_editor() {
    let Some(g) = find_gemini() else { return };
    if !have_script() {
        return;
    }
    let (b, fe, project) = scene().await;
    let gemini_dir = b.dir.path().join("tmp").join("gemini").join("ide");
    one_discovery(&gemini_dir, project.to_str().unwrap_or("/")).await;
    let active = project.join("focus.rs");
    std::fs::write(&active, "fn focus() {}\n").expect("write");
    fe.select(active.to_str().unwrap_or("/"), "fn focus", 0);

    let mut api = FakeGemini::start().await;
    let target = project.join("new.txt");
    api.push(Reply::Tool {
        name: "write_file".into(),
        args: json!({"file_path": target.to_str(), "content": "proposed\n"}),
    });
    api.push(Reply::Text("written".into()));
    let mut tui = GeminiTui::start(&g, b.dir.path(), &project, api.port);
    // The CLI's own start-up is awaited on its screen (60 s bound: a Node CLI on a busy
    // machine takes more than the broker's 10 s steps); then it says it is connected, and
    // its session is on the editor.
    tui.wait_for("Type your message").await;
    tui.wait_ide_connected().await;
    b.wait_status("a gemini session", |st| {
        st["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["door"] == "gemini"))
    })
    .await;
    tui.type_line("please write new.txt").await;

    // The chat request carries the editor's active file as IDE context.
    let chat = match api.next_chat().await {
        Some(c) => c,
        None => panic!(
            "no chat request in 30 s; the CLI's screen:\n{}",
            tail(&strip_escapes(&tui.screen()), 6000)
        ),
    };
    let text = all_text(&chat);
    assert!(
        text.contains(active.to_str().unwrap_or("?")),
        "no IDE context in: {text}"
    );

    // The proposed write opens as a diff in the editor; accepted there with an edit, the file
    // is written with the editor's text.
    let tab = diff_opened(&fe, &tui).await;
    assert!(fe.accept_diff(&tab, "proposed, edited in the editor\n"));
    eventually("the file written", || {
        (std::fs::read_to_string(&target).ok().as_deref()
            == Some("proposed, edited in the editor\n"))
        .then_some(())
    })
    .await;
    // The function response goes back to the model, whose answer ends the turn: the next
    // prompt is typed once the CLI shows it (typed during the turn, its Enter may be lost).
    assert!(
        api.next_chat().await.is_some(),
        "no function response in 30 s"
    );
    tui.wait_for("written").await;

    // Rejected in the editor, a proposed change leaves the file untouched.
    let kept = project.join("kept.txt");
    std::fs::write(&kept, "original\n").expect("write");
    api.push(Reply::Tool {
        name: "write_file".into(),
        args: json!({"file_path": kept.to_str(), "content": "changed\n"}),
    });
    api.push(Reply::Text("ok".into()));
    tui.type_line("please change kept.txt").await;
    if api.next_chat().await.is_none() {
        panic!(
            "no chat request in 30 s; the CLI's screen:\n{}",
            tail(&strip_escapes(&tui.screen()), 6000)
        );
    }
    let tab = eventually("the second diff in the editor", || {
        fe.pending_diffs().first().cloned()
    })
    .await;
    assert!(fe.reject_diff(&tab));
    tui.wait_for("kept.txt → Rejected").await;
    assert_eq!(
        std::fs::read_to_string(&kept).ok().as_deref(),
        Some("original\n")
    );
    tui.quit().await;
    b.stop().await;
}

/// Qwen Code's `cli.js` (`PI_IDE_BROKER_QWEN_CLI`, which `.ci/run` sets), or `None` after
/// saying why (a failure under `PI_IDE_BROKER_REQUIRE_ALL=1`).
fn find_qwen() -> Option<PathBuf> {
    let cli = std::env::var_os("PI_IDE_BROKER_QWEN_CLI").map(PathBuf::from);
    match cli {
        Some(c) if c.exists() => Some(c),
        _ => {
            let msg = "Qwen Code not found: set PI_IDE_BROKER_QWEN_CLI (bash .ci/run does)";
            crate::common::cannot_run(msg);
            None
        }
    }
}

#[tokio::test]
async fn the_real_qwen_code_finds_the_editor_without_an_exported_port_and_reviews_in_it() {
    use crate::common::fake_model::{self, FakeModel};
    let Some(g) = find_gemini() else { return };
    let Some(qwen) = find_qwen() else { return };
    if !have_script() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let qwen_home = std::fs::canonicalize(dir.path())
        .expect("canonical")
        .join("qwen-home");
    // Qwen Code has run here before (its home exists): the broker makes its `ide` dir.
    std::fs::create_dir_all(&qwen_home).expect("qwen home");
    let qh = qwen_home.clone();
    let b = TestBroker::start_in(dir, |c| {
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::gemini::GeminiConfig| {
            s.qwen_dir = Some(qh.join("ide"))
        })
    })
    .await;
    let project = qwen_home.parent().expect("root").join("project");
    std::fs::create_dir_all(&project).expect("project");
    let fe = FakeEditor::start_in(&b.pi_dir, Options::pi(&[project.to_str().unwrap_or("/")]))
        .await
        .expect("fake editor");
    b.wait_editor(fe.port, "ready").await;
    let active = project.join("focus.py");
    fe.select(active.to_str().unwrap_or("/"), "def focus", 2);
    let settings = json!({
        "ide": {"enabled": true, "hasSeenNudge": true},
        "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": false}},
        "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
        "privacy": {"usageStatisticsEnabled": false},
        "model": {"name": "fake-model"},
    });
    std::fs::write(qwen_home.join("settings.json"), settings.to_string()).expect("settings");

    let mut model = FakeModel::start().await;
    let target = project.join("q.txt");
    model.push(fake_model::Reply::Tool {
        name: "write_file".into(),
        args: json!({"file_path": target.to_str(), "content": "proposed\n"}),
    });
    model.push(fake_model::Reply::Text("written".into()));
    // Newer Qwen Code starts in "auto" mode (a classifier approves tools): ask first.
    let mut cmd = tui_command(&g.node, &qwen, "--approval-mode default", &project);
    cmd.env("QWEN_HOME", &qwen_home)
        .env("HOME", qwen_home.parent().expect("root"))
        .env("OPENAI_API_KEY", "fake-key")
        .env(
            "OPENAI_BASE_URL",
            format!("http://127.0.0.1:{}/v1", model.port),
        )
        .env("OPENAI_MODEL", "fake-model")
        .env_remove("QWEN_CODE_IDE_SERVER_PORT");
    let mut tui = GeminiTui::spawn(cmd);
    tui.wait_for("Type your message").await;
    tui.wait_ide_connected().await;
    b.wait_status("a qwen session (door gemini)", |st| {
        st["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x["door"] == "gemini"))
    })
    .await;
    tui.type_line("please write q.txt").await;
    let chat = model.next_chat().await;
    let text = fake_model::all_text(&chat);
    assert!(
        text.contains(active.to_str().unwrap_or("?")),
        "no IDE context in: {text}"
    );
    let tab = diff_opened(&fe, &tui).await;
    assert!(fe.accept_diff(&tab, "proposed, edited in the editor\n"));
    eventually("the file written", || {
        (std::fs::read_to_string(&target).ok().as_deref()
            == Some("proposed, edited in the editor\n"))
        .then_some(())
    })
    .await;
    tui.quit().await;
    b.stop().await;
}
