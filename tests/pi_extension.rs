//! The pi extension (`extensions/pi`) end to end: the real pi CLI in RPC mode, offline against
//! a fake model, the real broker, the fake editor. Skipped (with a message) where pi is not
//! installed; `.ci/run` installs it and makes its absence a failure.

mod common;

use common::fake_model::{all_text, FakeModel, Reply};
use common::pi::{find_pi, pi_home, Pi, PiInstall};
use common::*;
use pi_ide_broker::testkit::fake_editor::{wait_for, Event};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A broker on a temp dir with a project folder in it, plus the fake model.
struct World {
    broker: TestBroker,
    proj: PathBuf,
    model: FakeModel,
    home: PathBuf,
    pi: PiInstall,
}

impl World {
    async fn start() -> Option<World> {
        let pi = find_pi()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let proj = dir.path().join("proj");
        std::fs::create_dir_all(&proj).expect("mkdir proj");
        let proj = std::fs::canonicalize(&proj).expect("canonical proj");
        let model = FakeModel::start().await;
        let home = pi_home(dir.path(), &model.models_json());
        let broker = TestBroker::start_in(dir, |_| {}).await;
        Some(World {
            broker,
            proj,
            model,
            home,
            pi,
        })
    }

    fn proj_s(&self) -> String {
        self.proj.display().to_string()
    }

    async fn editor(&self) -> (FakeEditor, String) {
        self.broker.editor(&[&self.proj_s()]).await
    }

    async fn pi(&self, args: &[&str]) -> Pi {
        Pi::start(&self.pi, &self.home, &self.proj, &self.broker.socket, args).await
    }
}

/// Waits until the session with pi key `key` is attached to `editor` in the broker's status.
async fn attached_in_status(b: &TestBroker, editor: &str) -> Value {
    let e = editor.to_string();
    b.wait_status(&format!("a native session on {editor}"), move |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["editor"] == e.as_str() && s["door"] == "native")
        })
    })
    .await
}

async fn session_key(pi: &mut Pi) -> String {
    let st = pi.command("get_state", json!({})).await;
    st["data"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_string()
}

/// The tab name of the next openDiff the editor receives.
async fn next_diff(ev: &mut tokio::sync::broadcast::Receiver<Event>) -> (String, Value) {
    let call = wait_for(
        ev,
        "an openDiff",
        |e| matches!(e, Event::Call { tool: Some(t), .. } if t == "openDiff"),
    )
    .await;
    match call {
        Event::Call { args, .. } => (
            args["tab_name"].as_str().unwrap_or_default().to_string(),
            args,
        ),
        _ => unreachable!(),
    }
}

fn write_call(path: &str, content: &str) -> Reply {
    Reply::Tool {
        name: "write".into(),
        args: json!({"path": path, "content": content}),
    }
}

fn edit_call(path: &str, old: &str, new: &str) -> Reply {
    Reply::Tool {
        name: "edit".into(),
        args: json!({"path": path, "edits": [{"oldText": old, "newText": new}]}),
    }
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autoconnect_context_and_reviewed_writes_and_edits() {
    let Some(mut w) = World::start().await else {
        return;
    };
    let (ed, id) = w.editor().await;
    let mut ev = ed.events();
    let mut pi = w.pi(&[]).await;
    // 1. Autoconnect with nothing typed; the key is pi's session id.
    let key = session_key(&mut pi).await;
    pi.toast(0, "Auto-connected to Neovim").await;
    let st = attached_in_status(&w.broker, &id).await;
    let mine = st["sessions"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["door"] == "native").cloned())
        .expect("native session");
    assert_eq!(mine["key"], key.as_str(), "{st}");
    assert_eq!(mine["cwd"], w.proj_s().as_str());
    ed.select(&format!("{}/src/main.rs", w.proj_s()), "let x = 1;", 6);
    pi.until("the widget", 0, |v| {
        v["method"] == "setWidget"
            && v["widgetLines"][0]
                .as_str()
                .is_some_and(|l| l.contains("Lines 7-7 selected in main.rs"))
    })
    .await;
    pi.prompt("hello").await;
    let body = w.model.next_chat().await;
    let text = all_text(&body);
    assert!(
        text.contains("<editor>") && text.contains("src/main.rs") && text.contains("line 7"),
        "{text}"
    );
    assert!(
        text.contains("<lsp_diagnostics>") && text.contains("file:///x.rs:1:1 [Error] boom"),
        "{text}"
    );
    assert!(!text.contains("fyi"), "only errors and warnings: {text}");

    // 2. A write accepted in the editor writes the editor's text.
    let target = w.proj.join("a.txt");
    w.model.push(write_call("a.txt", "proposed\n"));
    let from = pi.mark();
    let (cmd_pi, prompt) = (&mut pi, "write it");
    let run = async {
        cmd_pi.prompt(prompt).await;
    };
    let review = async {
        let (tab, args) = next_diff(&mut ev).await;
        assert!(tab.starts_with("pi-write:"), "{tab}");
        assert_eq!(args["new_file_contents"], "proposed\n");
        assert_eq!(args["old_file_path"], target.display().to_string());
        assert!(ed.accept_diff(&tab, "edited in the editor\n"));
    };
    tokio::join!(run, review);
    assert_eq!(read(&target).as_deref(), Some("edited in the editor\n"));
    let results = pi.tool_results(from);
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(!results[0].1, "{results:?}");

    // A rejected write writes nothing.
    let other = w.proj.join("b.txt");
    w.model.push(write_call("b.txt", "nope\n"));
    let from = pi.mark();
    let review = async {
        let (tab, _) = next_diff(&mut ev).await;
        assert!(ed.reject_diff(&tab));
    };
    tokio::join!(pi.prompt("write b"), review);
    assert_eq!(read(&other), None);
    let results = pi.tool_results(from);
    assert!(
        results[0].1 && results[0].2.contains("rejected"),
        "{results:?}"
    );

    // An edit: accepted writes the editor's text, rejected leaves the file alone.
    w.model
        .push(edit_call("a.txt", "edited in the editor", "edit proposed"));
    let review = async {
        let (tab, args) = next_diff(&mut ev).await;
        assert!(tab.starts_with("pi-edit:"), "{tab}");
        assert_eq!(args["new_file_contents"], "edit proposed\n");
        assert!(ed.accept_diff(&tab, "edit final\n"));
    };
    tokio::join!(pi.prompt("edit a"), review);
    assert_eq!(read(&target).as_deref(), Some("edit final\n"));
    w.model.push(edit_call("a.txt", "edit final", "never"));
    let review = async {
        let (tab, _) = next_diff(&mut ev).await;
        assert!(ed.reject_diff(&tab));
    };
    tokio::join!(pi.prompt("edit again"), review);
    assert_eq!(read(&target).as_deref(), Some("edit final\n"));

    // 3. The editor dies mid-diff: the tool is blocked, the file untouched.
    w.model.push(write_call("a.txt", "unreviewed\n"));
    let from = pi.mark();
    let kill = async {
        let (_tab, _) = next_diff(&mut ev).await;
        ed.crash();
    };
    tokio::join!(pi.prompt("write during a crash"), kill);
    assert_eq!(read(&target).as_deref(), Some("edit final\n"));
    let results = pi.tool_results(from);
    assert!(
        results[0].1 && results[0].2.contains("NOT changed"),
        "{results:?}"
    );
    drop(ed);
    pi.quit().await;
    w.broker.stop().await;
}
