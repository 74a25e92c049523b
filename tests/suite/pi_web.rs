//! pi-web (`@agegr/pi-web`, many pi sessions in one Node process, one per chat) with the pi
//! extension installed as the README tells a user: two projects, two fake editors, the real
//! broker, the fake model, pi-web driven only through its HTTP API. Skipped (with a message)
//! where pi-web is not installed; `.ci/run` installs it and makes its absence a failure.

use crate::common::fake_model::{all_text, FakeModel};
use crate::common::pi_web::{find_pi_web, web_home, PiWeb};
use crate::common::*;
use crate::pi_extension::{attached_key, next_diff, write_call};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The broker, two projects each with its editor (a file selected in each), the fake model
/// and pi-web.
struct World {
    broker: TestBroker,
    model: FakeModel,
    web: PiWeb,
    a: Project,
    b: Project,
}

/// A project folder with a fake editor on it and a file selected there.
struct Project {
    dir: PathBuf,
    editor: FakeEditor,
    id: String,
    /// The selected file, as the `<editor>` block names it.
    file: String,
}

impl Project {
    async fn open(broker: &TestBroker, root: &Path, name: &str) -> Project {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("mkdir project");
        let dir = std::fs::canonicalize(&dir).expect("canonical project");
        let (editor, id) = broker.editor(&[&dir.display().to_string()]).await;
        let file = format!("{}/src/{name}.rs", dir.display());
        editor.select(&file, "", 4);
        Project {
            dir,
            editor,
            id,
            file,
        }
    }

    /// The `<file>` line of this editor's `<editor>` block.
    fn block(&self) -> String {
        format!(
            "<editor>\n  <file>{}</file>\n  <cursor>line 5</cursor>",
            self.file
        )
    }
}

impl World {
    /// Everything started, or `None` when pi-web is not installed (skip).
    async fn start(idle_ms: u64) -> Option<World> {
        let install = find_pi_web()?;
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical root");
        let model = FakeModel::start().await;
        let home = crate::common::pi::pi_home(&root, &model.models_json());
        web_home(&install, &home).await;
        let broker = TestBroker::start_in(dir, |_| {}).await;
        let a = Project::open(&broker, &root, "alpha").await;
        let b = Project::open(&broker, &root, "beta").await;
        let web = PiWeb::start(&install, &home, &broker.socket, idle_ms).await;
        Some(World {
            broker,
            model,
            web,
            a,
            b,
        })
    }

    /// The text of the next chat request to the model, checked to carry `own`'s `<editor>`
    /// block and not `other`'s.
    async fn next_request_on(&mut self, own: Side, what: &str) -> String {
        let text = all_text(&self.model.next_chat().await);
        let (mine, theirs) = match own {
            Side::A => (&self.a, &self.b),
            Side::B => (&self.b, &self.a),
        };
        assert!(
            text.contains(&mine.block()),
            "{what}: no {} block:\n{text}",
            mine.file
        );
        assert!(
            !text.contains(&theirs.file),
            "{what}: the other chat's editor:\n{text}"
        );
        text
    }
}

#[derive(Clone, Copy)]
enum Side {
    A,
    B,
}

/// The broker's native session with key `key` (status JSON), once it exists.
async fn native_session(b: &TestBroker, key: &str) -> Value {
    let k = key.to_string();
    let st = b
        .wait_status(&format!("native session {key}"), move |st| {
            st["sessions"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["key"] == k.as_str() && s["door"] == "native")
            })
        })
        .await;
    st["sessions"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["key"] == key).cloned())
        .unwrap_or(Value::Null)
}

/// Waits until the broker has no session with key `key`.
async fn session_gone(b: &TestBroker, key: &str) {
    let k = key.to_string();
    b.wait_status(&format!("session {key} to leave the broker"), move |st| {
        st["sessions"]
            .as_array()
            .is_some_and(|s| !s.iter().any(|s| s["key"] == k.as_str()))
    })
    .await;
}

/// True when the editor has received an `openDiff` since `ev` was taken.
fn saw_diff(ev: &mut tokio::sync::broadcast::Receiver<fake_editor::Event>) -> bool {
    std::iter::from_fn(|| ev.try_recv().ok())
        .any(|e| matches!(e, fake_editor::Event::Call { tool: Some(t), .. } if t == "openDiff"))
}

#[tokio::test]
async fn two_chats_two_editors_context_from_the_first_prompt_reviews_and_forks() {
    let Some(mut w) = World::start(0).await else {
        return;
    };
    let (a, b) = two_chats(&mut w).await;
    reviewed_writes(&mut w, &a, &b).await;
    a_fork_keeps_the_editor(&mut w, &a).await;
    w.broker.stop().await;
}

/// (1) and (2): a chat on each project, its first and second requests each with its own
/// editor's block; two native sessions keyed by the chats' session ids, on the right editors.
async fn two_chats(w: &mut World) -> (String, String) {
    let a = w.web.new_chat(&w.a.dir, "hello from alpha").await;
    let text = w.next_request_on(Side::A, "alpha's first request").await;
    assert!(text.contains("hello from alpha"), "{text}");
    w.web.wait_idle(&a).await;
    let b = w.web.new_chat(&w.b.dir, "hello from beta").await;
    w.next_request_on(Side::B, "beta's first request").await;
    w.web.wait_idle(&b).await;
    assert_ne!(a, b);
    for (key, p) in [(&a, &w.a), (&b, &w.b)] {
        let s = native_session(&w.broker, key).await;
        assert_eq!(s["cwd"], p.dir.display().to_string().as_str(), "{s}");
        assert_eq!(attached_key(&w.broker, key).await, p.id, "{s}");
    }
    w.web.send(&a, "again alpha").await;
    w.next_request_on(Side::A, "alpha's second request").await;
    w.web.wait_idle(&a).await;
    w.web.send(&b, "again beta").await;
    w.next_request_on(Side::B, "beta's second request").await;
    w.web.wait_idle(&b).await;
    (a, b)
}

/// (3): a write in alpha is reviewed in alpha's editor (never beta's): accepted, the
/// editor's text is written; rejected, nothing is.
async fn reviewed_writes(w: &mut World, a: &str, b: &str) {
    let mut ev_a = w.a.editor.events();
    let mut ev_b = w.b.editor.events();
    let target = w.a.dir.join("a.txt");
    w.model.push(write_call("a.txt", "proposed\n"));
    w.web.send(a, "write a.txt").await;
    let _ = w.model.next_chat().await;
    let (tab, args) = next_diff(&mut ev_a).await;
    assert_eq!(args["old_file_path"], target.display().to_string().as_str());
    assert_eq!(args["new_file_contents"], "proposed\n");
    assert!(w.a.editor.accept_diff(&tab, "from the editor\n"));
    // The tool's result goes back to the model once the write is done.
    let after = all_text(&w.model.next_chat().await);
    assert!(after.contains("a.txt"), "{after}");
    assert_eq!(
        std::fs::read_to_string(&target).ok().as_deref(),
        Some("from the editor\n")
    );
    w.web.wait_idle(a).await;
    let other = w.a.dir.join("b.txt");
    w.model.push(write_call("b.txt", "never\n"));
    w.web.send(a, "write b.txt").await;
    let _ = w.model.next_chat().await;
    let (tab, _) = next_diff(&mut ev_a).await;
    assert!(w.a.editor.reject_diff(&tab));
    let after = all_text(&w.model.next_chat().await);
    assert!(after.contains("rejected"), "{after}");
    assert!(!other.exists());
    w.web.wait_idle(a).await;
    assert!(
        !saw_diff(&mut ev_b),
        "beta's editor was asked to review alpha's write"
    );
    assert_eq!(attached_key(&w.broker, b).await, w.b.id);
}

/// (4): pi-web's fork of alpha starts on alpha's editor, even with a second editor on
/// alpha's folder that the user touched last (plain routing would pick that one).
async fn a_fork_keeps_the_editor(w: &mut World, a: &str) {
    let alpha = w.a.dir.display().to_string();
    let (e2, id2) = w.broker.editor(&[&alpha]).await;
    e2.select(&format!("{alpha}/z.rs"), "", 1);
    // Once a session on e2 sees that selection, the broker has recorded e2 as focused.
    let q = format!("cwd={alpha}&editor={id2}");
    let mut watcher = Agent::connect(&w.broker.socket, &q).await.expect("watcher");
    watcher
        .until("e2's selection", |v| v["method"] == "selection_changed")
        .await;
    watcher.close().await;
    let entry = w.web.first_user_entry(a).await;
    let forked = w
        .web
        .command(a, json!({"type": "fork", "entryId": entry}))
        .await;
    assert_eq!(forked["cancelled"], false, "{forked}");
    let fork = forked["newSessionId"]
        .as_str()
        .expect("newSessionId")
        .to_string();
    assert_ne!(fork, a);
    w.web.send(&fork, "in the fork").await;
    let text = w.next_request_on(Side::A, "the fork's first request").await;
    assert!(!text.contains("z.rs"), "{text}");
    assert_eq!(
        attached_key(&w.broker, &fork).await,
        w.a.id,
        "the fork must keep alpha's editor, not follow the last-focused {id2}"
    );
    w.web.wait_idle(&fork).await;
    drop(e2);
}

#[tokio::test]
async fn every_new_chat_sends_its_editor_with_its_first_prompt() {
    let Some(mut w) = World::start(0).await else {
        return;
    };
    let mut carried = 0;
    for i in 0..10 {
        let side = if i % 2 == 0 { Side::A } else { Side::B };
        let dir = match side {
            Side::A => w.a.dir.clone(),
            Side::B => w.b.dir.clone(),
        };
        let _chat = w.web.new_chat(&dir, &format!("chat {i}")).await;
        let text = all_text(&w.model.next_chat().await);
        let (mine, theirs) = match side {
            Side::A => (&w.a, &w.b),
            Side::B => (&w.b, &w.a),
        };
        assert!(
            !text.contains(&theirs.file),
            "chat {i}: the other editor:\n{text}"
        );
        if text.contains(&mine.block()) {
            carried += 1;
        }
    }
    eprintln!("first prompt carried its editor's <editor> block in {carried} of 10 new chats");
    assert_eq!(carried, 10, "first prompts without their editor");
    w.broker.stop().await;
}

#[tokio::test]
async fn an_idle_chat_leaves_the_broker_the_other_keeps_working_and_it_comes_back() {
    // pi-web shuts a chat down after this long idle.
    let Some(mut w) = World::start(3000).await else {
        return;
    };
    // Beta is busy: its write waits for the review in beta's editor.
    let mut ev_b = w.b.editor.events();
    w.model.push(write_call("b.txt", "proposed\n"));
    let b = w.web.new_chat(&w.b.dir, "write b.txt").await;
    w.next_request_on(Side::B, "beta's first request").await;
    let (tab, _) = next_diff(&mut ev_b).await;
    // Alpha answers and goes idle; pi-web shuts its session down, and the broker drops it.
    let a = w.web.new_chat(&w.a.dir, "hello from alpha").await;
    w.next_request_on(Side::A, "alpha's first request").await;
    assert_eq!(attached_key(&w.broker, &a).await, w.a.id);
    session_gone(&w.broker, &a).await;
    assert!(!w.web.running(&a).await, "pi-web still runs alpha");
    // Beta was never touched: still on its editor, and its review goes through.
    assert_eq!(attached_key(&w.broker, &b).await, w.b.id);
    assert!(w.b.editor.accept_diff(&tab, "reviewed in beta\n"));
    let _ = w.model.next_chat().await;
    assert_eq!(
        std::fs::read_to_string(w.b.dir.join("b.txt"))
            .ok()
            .as_deref(),
        Some("reviewed in beta\n")
    );
    // Alpha again: pi-web reopens it, on the same editor, with its context.
    w.web.send(&a, "back again").await;
    w.next_request_on(Side::A, "alpha's request after the idle shutdown")
        .await;
    assert_eq!(attached_key(&w.broker, &a).await, w.a.id);
    w.broker.stop().await;
}
