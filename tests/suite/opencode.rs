//! Issue 40: OpenCode (npm `opencode-ai`, pinned by `.ci/run`), the one agent the README's MCP
//! snippets named that no test ran. The real binary runs headless (`opencode run`) against a
//! fake OpenAI-compatible model, with the broker's stdio door configured exactly as `setup`
//! writes it (`opencode.json`, key `mcp`, no `--cwd`: the door takes OpenCode's own folder).

use crate::common::fake_model::{all_text, FakeModel, Reply};
use crate::common::process::{broker_bin, isolate};
use crate::common::*;
use pi_ide_broker::cli::setup::mcp::FileClient;
use pi_ide_broker::testkit::fake_editor::next_tool_call;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

/// How long one `opencode run` may take (about 8 s here: its start, two model turns).
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The real OpenCode binary (`PI_IDE_BROKER_OPENCODE`, set by `.ci/run`), or `None` after
/// saying it is missing.
fn find_opencode() -> Option<PathBuf> {
    match std::env::var_os("PI_IDE_BROKER_OPENCODE").map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        _ => {
            cannot_run("OpenCode not found: set PI_IDE_BROKER_OPENCODE (bash .ci/run does)");
            None
        }
    }
}

/// OpenCode's user config: the `editor` entry as `setup --write` adds it, and a provider `fake`
/// (`@ai-sdk/openai-compatible`, which OpenCode bundles) on the fake model's port.
fn write_config(home: &Path, bin: &Path, model_port: u16) -> PathBuf {
    let entry: Value = serde_json::from_str(&FileClient::OpenCode.snippet(&bin.to_string_lossy()))
        .expect("setup's OpenCode snippet is JSON");
    let mut config = json!({
        "$schema": "https://opencode.ai/config.json",
        "model": "fake/m",
        "autoupdate": false,
        "share": "disabled",
        "provider": {"fake": {
            "npm": "@ai-sdk/openai-compatible",
            "options": {"baseURL": format!("http://127.0.0.1:{model_port}/v1"), "apiKey": "test-key"},
            "models": {"m": {"name": "Fake"}},
        }},
    });
    config["mcp"] = entry["mcp"].clone();
    let file = home.join(".config/opencode/opencode.json");
    std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir opencode config");
    std::fs::write(&file, config.to_string()).expect("write opencode.json");
    file
}

/// The tool names a model request offered.
fn offered_tools(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["function"]["name"].as_str().map(String::from))
        .collect()
}

/// `opencode run` in a project an editor holds: the model is offered the editor's tools through
/// the broker, its `editor_getDiagnostics` call reaches that editor, and the editor's answer is
/// what the model gets back.
#[tokio::test]
async fn opencode_is_offered_the_editors_tools_and_its_call_reaches_the_editor() {
    let Some(opencode) = find_opencode() else {
        return;
    };
    let b = TestBroker::start().await;
    let project = b.dir.path().join("project");
    std::fs::create_dir_all(&project).expect("mkdir project");
    let project = project.canonicalize().expect("canonical project");
    let (fe, _id) = b.editor(&[project.to_str().expect("utf-8 path")]).await;
    let mut editor_events = fe.events();

    let mut model = FakeModel::start().await;
    model.push(Reply::Tool {
        name: "editor_getDiagnostics".into(),
        args: json!({}),
    });
    model.push(Reply::Text("Checked the diagnostics.".into()));

    let root = b.dir.path();
    let home = root.join("home");
    write_config(&home, &broker_bin(), model.port);
    let mut cmd = Command::new(&opencode);
    cmd.args(["run", "check the diagnostics"])
        .current_dir(&project)
        // As a shell started it: OpenCode (Bun) takes its folder from $PWD.
        .env("PWD", &project)
        .env("PI_IDE_BROKER_SOCKET", &b.socket)
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("TMPDIR", root)
        .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
        .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
        .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
        .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
        .env("OPENCODE_DISABLE_CLAUDE_CODE", "1")
        .env_remove("PI_IDE_BROKER_CONFIG")
        .kill_on_drop(true);
    isolate(&mut cmd, root);
    let run = tokio::spawn(async move { tokio::time::timeout(RUN_LIMIT, cmd.output()).await });

    let out = run
        .await
        .expect("the run task")
        .expect("opencode run ended within its limit")
        .expect("opencode ran");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "opencode run failed: {stdout}\n{stderr}"
    );

    let requests = model.received();
    let turn = requests
        .iter()
        .find(|r| !offered_tools(r).is_empty())
        .unwrap_or_else(|| panic!("no model request offered tools: {requests:?}"));
    let tools = offered_tools(turn);
    for t in [
        "editor_openDiff",
        "editor_getDiagnostics",
        "editor_editor_context",
    ] {
        assert!(tools.iter().any(|n| n == t), "{t} not offered: {tools:?}");
    }
    // The call reached the editor (its events are kept from before the run began).
    let args = next_tool_call(&mut editor_events, "getDiagnostics").await;
    assert!(args.is_object(), "getDiagnostics arguments: {args}");
    // The editor's own diagnostics ("boom" in the fake editor's file) came back to the model.
    let answered = requests.iter().any(|r| {
        r["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"))
            && all_text(r).contains("boom")
    });
    assert!(
        answered,
        "no model request carried the editor's answer: {requests:?}"
    );
    assert!(stdout.contains("Checked the diagnostics."), "{stdout}");
}
