//! The real Claude Code (2.1.332, `PI_IDE_BROKER_CLAUDE`) in a pty (`script`), offline
//! against a fake Messages API, with a real Neovim running pi-ide.nvim (`PI_IDE_BROKER_NVIM`,
//! `PI_IDE_BROKER_PI_IDE_NVIM`), which writes no Claude lockfile: the broker's Claude
//! lockfile makes `/ide` list it, the selection made in Neovim reaches the model's prompt,
//! and Claude Code's own edit flow opens its diff there.
//!
//! Claude Code's first-run screens are answered in its files, as a user who used it before
//! has them: `~/.claude.json` (onboarding done, the test key approved, the folder trusted).

use crate::common::broker::TestBroker;
use crate::common::fake_anthropic::{prompt_text, FakeAnthropic, Reply};
use crate::common::nvim_editor::{NvimEditor, Plugin};
use crate::common::tui::{Tui, Typing};
use crate::stdio::claude_from;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The API key the fake model takes (Claude Code asks about a key once: approved in its file).
const KEY: &str = "sk-test-not-a-key";

/// How long Ink takes to listen for keys on a screen it has drawn (its input hook is set up
/// after the draw): waited after the screen is seen, never instead of seeing it.
const SETTLE: Duration = Duration::from_millis(300);

/// The picker's row the pointer (`❯`) is on now, as the terminal shows it, if it is on one of
/// `items`: which one.
fn pointed(tui: &Tui, items: &[&str]) -> Option<usize> {
    let rows = tui.rendered();
    let row = rows
        .iter()
        .find(|r| r.contains('❯') && items.iter().any(|i| r.contains(i)))?;
    items.iter().position(|i| row.contains(i))
}

/// Moves the pointer of Claude Code's `/ide` picker onto `item` (listed above `other`), one ↑
/// at a time, each time reading on the rendered screen where it went: where it starts depends
/// on whether the list was whole at its first draw, and Ink redraws only the cells that change
/// (a moved pointer is a lone `❯` in the output). Then a moment for Ink to take Enter there.
async fn point_at(tui: &Tui, item: &str, other: &str) {
    let items = [item, other];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let never = format!("pointed at {item:?} or {other:?} in the /ide picker");
    let mut at = tui.poll(&never, || pointed(tui, &items)).await;
    tokio::time::sleep(SETTLE).await;
    while at != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "↑ never put the pointer on {item:?}; {}",
            tui.ends()
        );
        tui.key_up();
        // Redrawn where it went; a key Ink was not yet taking is pressed again.
        let pressed = std::time::Instant::now();
        while pressed.elapsed() < REDRAWN {
            match pointed(tui, &items) {
                Some(now) if now != at => {
                    at = now;
                    break;
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    tokio::time::sleep(SETTLE).await;
}

/// What the lockfiles in `dir` say, their tokens left out: "1234.lock: pid 42, \"Neovim (via
/// pi-ide-broker)\", [\"/p\"]", or why one cannot be read.
fn lockfiles(dir: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return format!("nothing: {} cannot be read", dir.display());
    };
    let mut said: Vec<String> = entries
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let what = match std::fs::read_to_string(e.path())
                .map(|t| serde_json::from_str::<serde_json::Value>(&t))
            {
                Ok(Ok(v)) => format!(
                    "pid {}, {}, {}",
                    v["pid"], v["ideName"], v["workspaceFolders"]
                ),
                Ok(Err(err)) => format!("not JSON ({err})"),
                Err(err) => format!("unreadable ({err})"),
            };
            format!("{name}: {what}")
        })
        .collect();
    said.sort();
    if said.is_empty() {
        "no file".into()
    } else {
        said.join("; ")
    }
}

/// How long a picker takes at most to redraw its pointer after a key it took.
const REDRAWN: Duration = Duration::from_secs(5);

/// One interactive Claude Code in a pty, on the fake model at `model_port`.
fn start_claude(claude: &Path, home: &Path, cwd: &Path, model_port: u16) -> Tui {
    let typing = Typing::Burst {
        settle: Duration::from_millis(500),
    };
    let args = ["--permission-mode", "default"];
    Tui::start("Claude Code", claude, &args, cwd, typing, |cmd| {
        cmd.env("HOME", home)
            .env_remove("CLAUDE_CONFIG_DIR")
            .env_remove("CLAUDE_CODE_SSE_PORT")
            .env("ANTHROPIC_API_KEY", KEY)
            .env(
                "ANTHROPIC_BASE_URL",
                format!("http://127.0.0.1:{model_port}"),
            )
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
    })
}

/// A HOME where Claude Code ran before: onboarding done, the test key approved, `proj`
/// trusted; its lock dir (`~/.claude/ide`) is the broker's Claude lock dir.
fn claude_home(b: &TestBroker, proj: &Path) -> PathBuf {
    let home = b.dir.path().join("claude-home");
    std::fs::create_dir_all(home.join(".claude")).expect("mkdir ~/.claude");
    std::os::unix::fs::symlink(&b.claude_dir, home.join(".claude/ide")).expect("link the lock dir");
    let state = json!({
        "hasCompletedOnboarding": true,
        "theme": "dark",
        "customApiKeyResponses": {"approved": [KEY], "rejected": []},
        "projects": {proj.display().to_string(): {"hasTrustDialogAccepted": true, "allowedTools": []}},
    });
    std::fs::write(home.join(".claude.json"), state.to_string()).expect("write ~/.claude.json");
    home
}

/// Issue 65's Claude acceptance: the real Claude Code lists a pi-ide.nvim Neovim in `/ide`
/// (through the broker's Claude lockfile), connects to it, the word selected in Neovim is in
/// the model's prompt, and its own edit flow opens the edit as a diff in Neovim; accepted
/// there (`:w`), the file is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_claude_code_lists_a_pi_ide_neovim_and_its_edit_is_accepted_there() {
    let Some(claude) = claude_from("PI_IDE_BROKER_CLAUDE") else {
        return;
    };
    if !crate::pty::available() {
        return crate::common::cannot_run("`script` (util-linux) for Claude Code's terminal");
    }
    let _heavy = crate::common::machine_heavy().await;
    let b = TestBroker::start().await;
    let proj = b.dir.path().join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    let proj = std::fs::canonicalize(&proj).expect("canonical proj");
    let file = proj.join("a.txt");
    std::fs::write(&file, "original\n").expect("write a.txt");
    let Some(ed) = NvimEditor::start(&b, Plugin::PiIde, &proj, "nvim").await else {
        return;
    };
    b.wait_editor(ed.port, "ready").await;

    let mut model = FakeAnthropic::start().await;
    let path = file.display().to_string();
    model.push(Reply::Tool {
        name: "Read".into(),
        args: json!({"file_path": path}),
    });
    model.push(Reply::Tool {
        name: "Edit".into(),
        args: json!({"file_path": path, "old_string": "original", "new_string": "edited by claude"}),
    });
    model.push(Reply::Text("the edit is in".into()));
    let home = claude_home(&b, &proj);
    let tui = start_claude(&claude, &home, &proj, model.port);
    tui.wait_for("Claude Code v").await;

    tui.type_line("/ide").await;
    tui.wait_for("Connect to an IDE").await;
    // Claude Code lists the lockfiles it finds when `/ide` opens; if the Neovim never shows,
    // what the dir held says whether the broker's lockfile was there to find.
    let listed = tokio::time::timeout(
        Duration::from_secs(30),
        tui.wait_for("Neovim (via pi-ide-broker)"),
    )
    .await;
    assert!(
        listed.is_ok(),
        "Claude Code's /ide never listed the Neovim; the Claude lock dir holds {}; {}",
        lockfiles(&b.claude_dir),
        tui.ends()
    );
    point_at(&tui, "Neovim (via pi-ide-broker)", "None").await;
    tui.keys(b"\r");
    // Asked once per HOME: "No, connect with /ide" (the highlighted answer) keeps this choice.
    tui.wait_for("Connect to your IDE automatically?").await;
    tui.wait_for("❯ No, connect with /ide").await;
    tui.wait_for("Enter to confirm").await;
    tokio::time::sleep(SETTLE).await;
    tui.keys(b"\r");
    b.wait_status("Claude Code's session through the Claude lockfile", |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["door"] == "compat" && s["dialect"] == "claude")
        })
    })
    .await;
    tui.wait_for("Connected to Neovim (via pi-ide-broker)")
        .await;

    // The editor's selection reaches Claude Code (its prompt line counts it), then the model
    // with the prompt typed next (Claude Code's `selected_lines_in_ide`: it needs the text, the
    // file and the range of the `selection_changed` that reached it after it connected).
    ed.select_word(&file, 1).await;
    tui.wait_for("1 line selected").await;
    tui.forget();
    tui.type_line("change original in a.txt").await;
    let pending = ed
        .pending_until("Claude Code's edit open in Neovim", |s| {
            s.contains("a.txt [pi-proposed]")
        })
        .await;
    assert!(pending.contains(&path), "{pending}");
    ed.accept(&file, "", "").await;
    tui.wait_for("the edit is in").await;
    let written = std::fs::read_to_string(&file).expect("read a.txt");
    assert_eq!(
        written, "edited by claude\n",
        "the edit accepted in Neovim is written"
    );
    let prompts: Vec<String> = model.received().iter().map(prompt_text).collect();
    let asked = prompts
        .iter()
        .find(|p| p.contains("change original in a.txt"))
        .expect("the typed prompt reached the model");
    let selected = format!("The user selected the lines 1 to 1 from {path}:\noriginal\n");
    assert!(
        asked.contains(&selected),
        "the selection made in Neovim is in the model's prompt: {:?}",
        asked
            .find("The user selected")
            .map(|at| &asked[at..asked.len().min(at + 300)])
    );
    tui.quit().await;
    b.stop().await;
}
