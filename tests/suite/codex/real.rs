//! The real Codex (`@openai/codex`, pinned in `.ci/npm/codex`; `.ci/run` exports its native
//! binary as `PI_IDE_BROKER_CODEX`) in a pty (`script`), offline: a custom model provider in a
//! temp `CODEX_HOME` points at a fake Responses API on 127.0.0.1, and `TMPDIR` puts Codex's hub
//! socket where the test broker serves it. The editors are real headless Neovims: the first
//! folder's runs claudecode.nvim, the second's pi-ide.nvim (the vendored plugins,
//! `PI_IDE_BROKER_NVIM`, `PI_IDE_BROKER_CLAUDECODE_NVIM`, `PI_IDE_BROKER_PI_IDE_NVIM`); then
//! VS Code (code-server with the Claude Code extension in headless Chromium, `common::vscode`).

use crate::acp_nvim::{lua_str, Nvim};
use crate::common::broker::TestBroker;
use crate::common::nvim_editor::{NvimEditor, Plugin};
use crate::common::scripted_http::{Reply, Scripted, Seen};
use crate::common::tui::{Tui, Typing};
use serde_json::Value;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The pinned Codex's native binary, or `None` (said) to skip.
fn find_codex() -> Option<PathBuf> {
    match std::env::var_os("PI_IDE_BROKER_CODEX").filter(|p| !p.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(
                p.exists(),
                "PI_IDE_BROKER_CODEX={} is not there",
                p.display()
            );
            Some(p)
        }
        None => {
            crate::common::cannot_run(
                "codex::real: set PI_IDE_BROKER_CODEX (bash .ci/run installs the pinned Codex)",
            );
            None
        }
    }
}

/// The Responses API, as much of it as a turn needs: every POST answered with one streamed
/// assistant message; anything else (a models listing) with an empty list.
fn responses(seen: &Seen, _: &mut VecDeque<Reply>) -> (&'static str, String) {
    if !seen.path.ends_with("/responses") {
        return ("application/json", r#"{"data":[],"models":[]}"#.into());
    }
    let events = [
        serde_json::json!({"type": "response.created", "response": {"id": "resp_1"}}),
        serde_json::json!({"type": "response.output_item.done", "item": {"type": "message", "role": "assistant", "id": "msg_1", "content": [{"type": "output_text", "text": "noted"}]}}),
        serde_json::json!({"type": "response.completed", "response": {"id": "resp_1", "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2}}}),
    ];
    let body = events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
        .collect();
    ("text/event-stream", body)
}

/// The user's message of a turn request (the last user text of `input`).
fn user_text(body: &Value) -> String {
    body["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["role"] == "user")
        .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["text"].as_str().map(String::from))
        .next_back()
        .unwrap_or_default()
}

/// One interactive Codex in a pty: its home `home`, its temp dir (where its hub socket is)
/// `tmp`.
fn start_codex(codex: &Path, home: &Path, tmp: &Path, cwd: &Path) -> Tui {
    let typing = Typing::KeyByKey {
        gap: Duration::from_millis(15),
        settle: Duration::from_millis(300),
    };
    Tui::start("Codex", codex, &[], cwd, typing, |cmd| {
        cmd.env("CODEX_HOME", home)
            .env("TMPDIR", tmp)
            .env_remove("OPENAI_API_KEY");
    })
}

/// The next turn request carrying `said` (Codex also asks the model for a thread title).
async fn turn(model: &mut Scripted, said: &str) -> String {
    loop {
        let seen = pi_ide_broker::testkit::within(&format!("the turn {said:?}"), model.next_seen())
            .await
            .expect("the fake API is gone");
        let text = user_text(&seen.body);
        if seen.path.ends_with("/responses") && text.ends_with(said) && !text.contains("task title")
        {
            return text;
        }
    }
}

/// Issue 66's acceptance with the real Codex: `/ide on`; a prompt in a folder no editor has
/// goes on at once without context; with claudecode.nvim open on the folder, the model gets
/// its active file and selection; a second Codex in another folder gets that folder's editor
/// (pi-ide.nvim); after a broker restart, the first gets the new selection.
#[tokio::test(flavor = "current_thread")]
async fn the_real_codex_gets_the_routed_editors_selection_through_the_broker() {
    let Some((nvim, plugin)) = neovim() else {
        return;
    };
    let Some(codex) = find_codex() else {
        return;
    };
    let tmp_of = |b: &TestBroker| b.dir.path().join("tmp");
    let uid = rustix::process::getuid().as_raw();
    let hub_in = move |root: &Path| {
        root.join("tmp")
            .join("codex-ipc")
            .join(format!("ipc-{uid}.sock"))
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = hub_in(dir.path());
    let tweak = move |c: &mut pi_ide_broker::sys::config::Config| {
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::codex::CodexConfig| {
            s.socket = Some(socket.clone())
        })
    };
    let b = TestBroker::start_in(dir, tweak.clone()).await;
    std::fs::create_dir_all(tmp_of(&b)).expect("mkdir tmp");
    let proj = project(&b, "a.rs", "fn one() {}\nfn two() {}\nfn three() {}\n");
    let mut model = Scripted::start(responses).await;
    let proj_b = b.dir.path().join("proj-b");
    std::fs::create_dir_all(&proj_b).expect("mkdir proj-b");
    let proj_b = std::fs::canonicalize(proj_b).expect("canonical proj-b");
    let home = codex_home(&b, model.port, &[&proj, &proj_b]);
    let tui = start_codex(&codex, &home, &tmp_of(&b), &proj);
    tui.wait_for("Ask Codex to do anything").await;
    tui.type_line("/ide on").await;
    tui.wait_for("IDE context is on").await;

    let asked = Instant::now();
    tui.type_line("first with no editor").await;
    let first = turn(&mut model, "first with no editor").await;
    println!(
        "no editor: the turn went out {:?} after Enter",
        asked.elapsed()
    );
    assert!(!first.contains("Context from my IDE"), "{first}");

    let nv = claudecode(&b, &nvim, &plugin, &proj).await;
    let file = proj.join("a.rs").display().to_string();
    select(&b, &nv, &file, (2, 3), "fn three() {}").await;
    tui.type_line("second with the editor").await;
    let second = turn(&mut model, "second with the editor").await;
    assert!(second.contains("# Context from my IDE setup"), "{second}");
    assert!(second.contains("## Active file: a.rs"), "{second}");
    assert!(second.contains("fn two() {}\nfn three() {}"), "{second}");
    other_folder(&b, &codex, &home, &proj_b, &mut model).await;

    // The broker restarts between prompts; the editor links again and the user selects anew.
    let dir = b.stop_keep_dir().await;
    let b = TestBroker::start_in(dir, tweak).await;
    linked(&b, &proj).await;
    select(&b, &nv, &file, (1, 1), "fn one() {}").await;
    tui.type_line("third after a restart").await;
    let third = turn(&mut model, "third after a restart").await;
    assert!(
        third.contains("## Active selection of the file:\nfn one() {}"),
        "{third}"
    );
    tui.quit().await;
    b.stop().await;
}

/// A second Codex in another folder, whose editor is another real one (pi-ide.nvim in its own
/// headless Neovim, lockfile in the broker's pi lock dir): its message carries that editor's
/// file and selection, not claudecode.nvim's.
async fn other_folder(
    b: &TestBroker,
    codex: &Path,
    home: &Path,
    proj_b: &Path,
    model: &mut Scripted,
) {
    // pi-ide.nvim tells a line selected (`V`) with the cursor at its start as the line's first
    // character (it reads the columns of Visual mode's ends, in `V` too): line 2 starts with a
    // letter no line of a.rs does, so the selection Codex gets names its editor.
    let file_b = proj_b.join("b.rs");
    std::fs::write(&file_b, "fn bee() {}\nzap();\n").expect("write b.rs");
    let ed = NvimEditor::start(b, Plugin::PiIde, proj_b, "pi-ide")
        .await
        .expect("pi-ide.nvim (checked by neovim())");
    linked(b, proj_b).await;
    ed.select(&file_b, 2).await;
    let file_b = file_b.display().to_string();
    let reg = b.handle.registry();
    pi_ide_broker::testkit::eventually("folder b's selection at the broker", || {
        reg.editors()
            .iter()
            .any(|e| {
                e.last_selection().is_some_and(|s| {
                    s.contains(&file_b) && s.contains(r#""text":"z""#) && s.contains(r#""line":1"#)
                })
            })
            .then_some(())
    })
    .await;
    let tui = start_codex(codex, home, &b.dir.path().join("tmp"), proj_b);
    tui.wait_for("Ask Codex to do anything").await;
    tui.type_line("/ide on").await;
    tui.wait_for("IDE context is on").await;
    tui.type_line("from folder b").await;
    let said = turn(model, "from folder b").await;
    assert!(
        said.contains("## Active file: b.rs") && !said.contains("a.rs"),
        "{said}\n{}",
        ed.printed()
    );
    assert!(
        said.contains("## Active selection of the file:\nz") && !said.contains("fn two"),
        "{said}"
    );
    // The open tabs, from pi-ide.nvim's getOpenEditorTabs.
    assert!(said.contains("## Open tabs:\n- b.rs: "), "{said}");
    tui.quit().await;
    ed.kill().await;
}

/// A test's `CODEX_HOME`. Codex installs a managed app-server daemon into it (`packages/`),
/// which outlives Codex with an update loop of its own: dropped, this ends every process
/// running from there.
struct CodexHome(PathBuf);

impl std::ops::Deref for CodexHome {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for CodexHome {
    fn drop(&mut self) {
        for pid in running_from(&self.0.join("packages")) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// The processes whose program is under `dir` (its path as their command line names it,
/// which stays when the file is gone).
fn running_from(dir: &Path) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let program = cmdline.split(|b| *b == 0).next()?;
            Path::new(std::str::from_utf8(program).ok()?)
                .starts_with(dir)
                .then_some(pid)
        })
        .collect()
}

/// A `CODEX_HOME` whose model provider is the fake API, with the projects trusted.
fn codex_home(b: &TestBroker, port: u16, projects: &[&Path]) -> CodexHome {
    let home = b.dir.path().join("codex-home");
    std::fs::create_dir_all(&home).expect("mkdir codex home");
    let mut config = format!(
        "model = \"fake-model\"\nmodel_provider = \"fake\"\ncheck_for_update_on_startup = false\n\n\
         [model_providers.fake]\nname = \"Fake\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\n\
         wire_api = \"responses\"\nrequires_openai_auth = false\n"
    );
    for p in projects {
        config.push_str(&format!(
            "\n[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
            p.display()
        ));
    }
    std::fs::write(home.join("config.toml"), config).expect("write config.toml");
    CodexHome(home)
}

/// Neovim and claudecode.nvim (pi-ide.nvim, the second folder's, checked there too), or
/// `None` (said) to skip.
fn neovim() -> Option<(PathBuf, PathBuf)> {
    let (nvim, plugins) = crate::common::nvim_plugins::neovim_with(
        "codex::real",
        &["PI_IDE_BROKER_CLAUDECODE_NVIM", "PI_IDE_BROKER_PI_IDE_NVIM"],
    )?;
    Some((nvim, plugins.into_iter().next()?))
}

/// A fresh project folder under the broker's dir, canonical, with `file` holding `text`.
fn project(b: &TestBroker, file: &str, text: &str) -> PathBuf {
    let proj = b.dir.path().join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    let proj = std::fs::canonicalize(&proj).expect("canonical proj");
    std::fs::write(proj.join(file), text).expect("write the file");
    proj
}

/// A headless Neovim in `proj` with claudecode.nvim started (its lockfile in the broker's
/// Claude lock dir, through `CLAUDE_CONFIG_DIR`), once the broker has linked it.
async fn claudecode(b: &TestBroker, nvim: &Path, plugin: &Path, proj: &Path) -> Nvim {
    let config_dir = b.dir.path().join("nvim-claude-config");
    std::fs::create_dir_all(&config_dir).expect("mkdir");
    std::os::unix::fs::symlink(&b.claude_dir, config_dir.join("ide")).expect("link the lock dir");
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codex/driver.lua");
    let nv = Nvim::start(
        nvim,
        &b.dir.path().join("nvim.sock"),
        &[plugin.to_path_buf()],
        &[driver],
        proj,
        &[
            ("HOME", b.dir.path().join("nvim-home")),
            ("CLAUDE_CONFIG_DIR", config_dir),
            ("XDG_STATE_HOME", b.dir.path().join("nvim-state")),
            ("XDG_CACHE_HOME", b.dir.path().join("nvim-cache")),
        ],
    )
    .await;
    nv.until("claudecode.nvim started", "start()", |s| s == "ok")
        .await;
    linked(b, proj).await;
    nv
}

/// Waits until the broker's editor on `proj` is ready.
async fn linked(b: &TestBroker, proj: &Path) {
    let proj = proj.display().to_string();
    b.wait_status("the editor on the folder linked", |st| {
        st["editors"].as_array().is_some_and(|e| {
            e.iter().any(|e| {
                e["state"] == "ready"
                    && e["workspace_folders"]
                        .as_array()
                        .is_some_and(|f| f.iter().any(|f| f == proj.as_str()))
            })
        })
    })
    .await;
}

/// Selects lines `first..=last` of `file` in Neovim and waits until the broker has that
/// selection, its text holding `last_line`.
async fn select(b: &TestBroker, nv: &Nvim, file: &str, (first, last): (u32, u32), last_line: &str) {
    let call = format!("select({}, {first}, {last})", lua_str(file));
    assert_eq!(nv.call(&call).await, "ok", "{}", nv.printed());
    let quoted = serde_json::to_string(last_line).unwrap_or_default();
    let want = quoted.trim_matches('"');
    let reg = b.handle.registry();
    pi_ide_broker::testkit::eventually("the selection at the broker", || {
        reg.editors()
            .iter()
            .any(|e| {
                e.last_selection()
                    .is_some_and(|s| s.contains(file) && s.contains(want))
            })
            .then_some(())
    })
    .await;
}

/// Issue 66's acceptance with VS Code (code-server, the real Claude Code extension, headless
/// Chromium: `common::vscode`, which takes the `machine_heavy` turn): the extension opens
/// src/main.rs with a line selected (asked through the broker as a Claude session does, the
/// way `vscode::a_pi_session_gets_vs_codes_selection…` does), and Codex in the workspace,
/// `/ide on`, gets VS Code's active file and selection in its model request.
#[tokio::test(flavor = "current_thread")]
async fn the_real_codex_gets_vs_codes_active_file_and_selection() {
    use crate::common::vscode::{find_vscode, VsCode};
    use pi_ide_broker::protocol::family::Family;
    use pi_ide_broker::sys::config::LockDirConfig;
    let Some(codex) = find_codex() else {
        return;
    };
    let Some(install) = find_vscode() else {
        return;
    };
    let t0 = Instant::now();
    let root = tempfile::tempdir().expect("tempdir");
    let main_rs = "fn main() {\n    let x = 1;\n}\n";
    let vsc = VsCode::start(&install, root.path(), &[("src/main.rs", main_rs)]).await;
    let uid = rustix::process::getuid().as_raw();
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir
        .path()
        .join("tmp/codex-ipc")
        .join(format!("ipc-{uid}.sock"));
    let lock_dir = vsc.lock_dir.clone();
    let b = TestBroker::start_in(dir, |c| {
        c.edit_section(|s: &mut pi_ide_broker::frontdoor::codex::CodexConfig| {
            s.socket = Some(socket)
        });
        c.lock_dirs = Some(vec![LockDirConfig {
            path: lock_dir,
            family: Family::Claude,
        }]);
    })
    .await;
    std::fs::create_dir_all(b.dir.path().join("tmp")).expect("mkdir tmp");
    let workspace = std::fs::canonicalize(&vsc.workspace).expect("canonical workspace");
    linked(&b, &workspace).await;

    let helper = vs_code_selects(&b, &workspace, &vsc).await;

    let mut model = Scripted::start(responses).await;
    let home = codex_home(&b, model.port, &[&workspace]);
    let tui = start_codex(&codex, &home, &b.dir.path().join("tmp"), &workspace);
    tui.wait_for("Ask Codex to do anything").await;
    tui.type_line("/ide on").await;
    tui.wait_for("IDE context is on").await;
    tui.type_line("with vs code").await;
    let said = turn(&mut model, "with vs code").await;
    assert!(said.contains("## Active file: src/main.rs"), "{said}");
    assert!(
        said.contains("## Active selection of the file:\nlet x = 1;"),
        "{said}"
    );
    // The open tabs, from the extension's getOpenEditors.
    assert!(said.contains("## Open tabs:\n- main.rs: "), "{said}");
    tui.quit().await;
    helper.close().await;
    b.stop().await;
    println!("codex with VS Code: {:?} in all", t0.elapsed());
}

/// VS Code opens src/main.rs with `let x = 1;` selected, asked through the broker by a
/// Claude-dialect session (kept open and returned), once the broker has that selection.
async fn vs_code_selects(
    b: &TestBroker,
    workspace: &Path,
    vsc: &crate::common::vscode::VsCode,
) -> crate::common::Agent {
    use crate::common::vscode::VSCODE_WAIT;
    let cwd = pi_ide_broker::protocol::percent::encode_query(&workspace.display().to_string());
    let mut helper = crate::common::Agent::connect(&b.socket, &format!("cwd={cwd}&dialect=claude"))
        .await
        .expect("a Claude session");
    helper.attached().await;
    let main = workspace.join("src/main.rs");
    let args = serde_json::json!({"filePath": main, "preview": false, "startText": "let x",
                                  "endText": "1;", "makeFrontmost": true});
    helper
        .call_tool(serde_json::json!(1), "openFile", args)
        .await;
    let opened = tokio::time::timeout(VSCODE_WAIT, async {
        loop {
            match helper.next_unbounded().await {
                Some(v) if v["id"] == 1 => return v,
                Some(_) => {}
                None => panic!("the session closed before openFile's answer"),
            }
        }
    })
    .await
    .expect("openFile answered");
    assert!(opened.get("result").is_some(), "{opened:#}\n{}", vsc.log());
    let main = main.display().to_string();
    let reg = b.handle.registry();
    pi_ide_broker::testkit::eventually("VS Code's selection at the broker", || {
        reg.editors()
            .iter()
            .any(|e| {
                e.last_selection()
                    .is_some_and(|s| s.contains(&main) && s.contains("let x = 1;"))
            })
            .then_some(())
    })
    .await;
    helper
}
