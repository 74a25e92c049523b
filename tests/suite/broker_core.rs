//! Issue: broker core — discovery, one health-checked link per editor, status.

use crate::common::*;
use pi_ide_broker::testkit::{fake_editor::Event, within};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

#[tokio::test]
async fn lockfile_appears_then_ready_in_status_then_removed_gone() {
    let b = TestBroker::start().await;
    let fe = FakeEditor::start_in(&b.pi_dir, Options::pi(&["/proj"]))
        .await
        .unwrap();
    let e = b.wait_editor(fe.port, "ready").await;
    assert_eq!(e["family"], "pi");
    assert_eq!(e["ide_name"], "Neovim");
    assert_eq!(e["pid"], std::process::id());
    assert_eq!(e["workspace_folders"], serde_json::json!(["/proj"]));
    assert!(e["tools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t == "openDiff"));
    assert!(e["connected_since"].is_u64());
    // The same through the real socket, as `curl --unix-socket` would see it.
    let st = b.status().await;
    let e2 = editor_by_port(&st, fe.port).expect("editor in /v1/status");
    assert_eq!(e2["id"], e["id"]);
    assert_eq!(fe.clients(), 1, "exactly one link per editor");
    fe.remove_lockfile();
    b.wait_editor_gone(fe.port).await;
    b.stop().await;
}

#[tokio::test]
async fn bad_lockfiles_are_ignored_while_a_good_editor_works() {
    let b = TestBroker::start().await;
    let d = &b.pi_dir;
    let me = std::process::id();
    std::fs::write(d.join("40001.lock"), "{not json").unwrap();
    std::fs::write(d.join("40002.lock"), "").unwrap();
    std::fs::write(d.join("40003.lock"), vec![b' '; 70 * 1024]).unwrap();
    std::os::unix::fs::symlink("/dev/zero", d.join("40004.lock")).unwrap();
    // A reaped child's pid is dead.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    std::fs::write(
        d.join("40005.lock"),
        format!(r#"{{"pid":{dead},"authToken":"0123456789abcdef"}}"#),
    )
    .unwrap();
    std::fs::write(
        d.join("abc.lock"),
        format!(r#"{{"pid":{me},"authToken":"0123456789abcdef"}}"#),
    )
    .unwrap();
    std::fs::write(
        d.join("40007.lock.tmp.1.2"),
        format!(r#"{{"pid":{me},"authToken":"0123456789abcdef"}}"#),
    )
    .unwrap();
    std::fs::write(
        d.join("0.lock"),
        format!(r#"{{"pid":{me},"authToken":"0123456789abcdef"}}"#),
    )
    .unwrap();
    let fifo = d.join("40008.lock");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let (fe, _) = b.editor(&["/p"]).await;
    let st = b.status().await;
    let editors = st["editors"].as_array().unwrap();
    assert_eq!(editors.len(), 1, "only the good editor: {st:#}");
    assert_eq!(editors[0]["port"], fe.port);
    b.stop().await;
}

#[tokio::test]
async fn a_lockfile_written_in_two_steps_is_picked_up_once_complete() {
    let b = TestBroker::start().await;
    let fe = FakeEditor::start(Options::pi(&["/p"])).await.unwrap();
    let path = b.pi_dir.join(format!("{}.lock", fe.port));
    let json = fe.lockfile_json();
    let (first, second) = json.split_at(json.len() / 2);
    std::fs::write(&path, first).unwrap();
    // Give the watcher a chance to see (and tolerate) the half file: await its event round trip
    // by creating a marker editor and waiting for it.
    let (_marker, _) = b.editor(&["/marker"]).await;
    assert!(editor_by_port(&b.status().await, fe.port).is_none());
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(second.as_bytes()).unwrap();
    drop(f);
    b.wait_editor(fe.port, "ready").await;
    b.stop().await;
}

/// A HOME that never had Claude Code gets no `~/.claude/ide` from the broker (issue 52); the
/// editor that makes it later is found (the dir is polled, its parent never watched: see
/// lockdirs.rs for the events-only checks).
#[tokio::test]
async fn a_missing_lock_dir_is_not_created_and_its_editors_picked_up_once_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let claude = dir.path().join("home/.claude/ide");
    let c2 = claude.clone();
    let b = TestBroker::start_in(dir, move |c| {
        if let Some(dirs) = c.lock_dirs.as_mut() {
            dirs[1].path = c2.clone();
        }
    })
    .await;
    assert!(
        !b.dir.path().join("home/.claude").exists(),
        "the broker made another program's dir"
    );
    let mut opts = Options::pi(&["/c"]);
    opts.family = pi_ide_broker::protocol::family::Family::Claude;
    opts.ide_name = "Visual Studio Code".into();
    let fe = FakeEditor::start_in(&claude, opts).await.unwrap();
    let e = b.wait_editor(fe.port, "ready").await;
    assert_eq!(e["family"], "claude");
    b.stop().await;
}

#[tokio::test]
async fn an_editor_that_stops_answering_pings_turns_unhealthy_then_recovers() {
    init_logs();
    let b = TestBroker::start_with(|c| {
        c.health.interval_ms = 100;
        c.health.timeout_ms = 150;
        c.health.drop_after_ms = 60_000;
    })
    .await;
    let (fe, _) = b.editor(&["/p"]).await;
    let e = b
        .wait_status("an RTT", |st| {
            editor_by_port(st, fe.port).is_some_and(|e| e["rtt_ms"].is_f64())
        })
        .await;
    let rtt = editor_by_port(&e, fe.port).and_then(|e| e["rtt_ms"].as_f64());
    assert!(
        rtt.is_some_and(|ms| ms > 0.0),
        "a measured round trip: {rtt:?}"
    );
    fe.freeze(true);
    b.wait_editor(fe.port, "unhealthy").await;
    fe.freeze(false);
    b.wait_editor(fe.port, "ready").await;
    assert_eq!(fe.clients(), 1, "recovered on the same link");
    b.stop().await;
}

#[tokio::test]
async fn an_unresponsive_link_is_dropped_and_redialled() {
    let b = TestBroker::start_with(|c| {
        c.health.interval_ms = 100;
        c.health.timeout_ms = 100;
        c.health.drop_after_ms = 300;
    })
    .await;
    let (fe, _) = b.editor(&["/p"]).await;
    let mut ev = fe.events();
    fe.freeze(true);
    b.wait_editor(fe.port, "unhealthy").await;
    // The broker gives up on the frozen link and dials again; the new link is answered once thawed.
    let _ = fake_editor::wait_for(&mut ev, "a redial", |e| {
        matches!(e, Event::Connected { .. })
    })
    .await;
    fe.freeze(false);
    b.wait_editor(fe.port, "ready").await;
    b.stop().await;
}

/// A real editor (pi-ide.nvim) quit and started again in its folder comes back on a new port
/// as the same editor, recorded as its own successor; another folder is another editor.
#[tokio::test]
async fn a_restarted_editor_is_recorded_as_successor() {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let b = TestBroker::start().await;
    let proj = std::fs::canonicalize(b.dir.path())
        .expect("canonical")
        .join("proj");
    let (a, other_dir) = (proj.join("a"), proj.join("b"));
    std::fs::create_dir_all(&a).expect("mkdir a");
    std::fs::create_dir_all(&other_dir).expect("mkdir b");
    let Some(old) = NvimEditor::start(&b, Plugin::PiIde, &a, "a").await else {
        return;
    };
    let id = b.wait_editor(old.port, "ready").await["id"].clone();
    let old_port = old.port;
    // `:qa!`: the plugin removes its lockfile as Neovim exits.
    let new = old.restart().await;
    b.wait_editor_gone(old_port).await;
    assert_ne!(new.port, old_port);
    let e = b.wait_editor(new.port, "ready").await;
    assert_eq!(e["id"], id, "a restart keeps the editor id");
    assert_eq!(e["restarts"], 1);
    assert_eq!(e["previous_port"], old_port);
    // A different workspace is a different editor.
    let Some(other) = NvimEditor::start(&b, Plugin::PiIde, &other_dir, "b").await else {
        return;
    };
    let e = b.wait_editor(other.port, "ready").await;
    assert_ne!(e["id"], id);
    assert_eq!(e["restarts"], 0);
    b.stop().await;
}

#[tokio::test]
async fn a_wrong_token_backs_off_instead_of_spinning() {
    let b = TestBroker::start_with(|c| {
        c.backoff.initial_ms = 100;
        c.backoff.max_ms = 2000;
    })
    .await;
    let fe = FakeEditor::start(Options::pi(&["/p"])).await.unwrap();
    let mut ev = fe.events();
    let path = b.pi_dir.join(format!("{}.lock", fe.port));
    let wrong = fe
        .lockfile_json()
        .replace(fe.token(), "WRONG-TOKEN-0123456789");
    pi_ide_broker::registry::state::write_atomic(&path, wrong.as_bytes()).unwrap();
    let _ = fake_editor::wait_for(&mut ev, "first refusal", |e| matches!(e, Event::Refused)).await;
    // Count refusals over one second: backoff (100, 200, 400, 800 ms) allows a handful.
    let mut refused = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Ok(Ok(e)) = tokio::time::timeout_at(deadline, ev.recv()).await {
        if matches!(e, Event::Refused) {
            refused += 1;
        }
    }
    assert!(
        refused <= 5,
        "{refused} redials in one second is a tight loop"
    );
    // The editor is listed (a missing entry would pass a check on its state alone) and is
    // not ready with the wrong token.
    let st = b.status().await;
    let e = editor_by_port(&st, fe.port).unwrap_or_else(|| panic!("the editor is listed: {st}"));
    assert_ne!(e["state"], "ready", "{e}");
    // The editor's real token appears in the lockfile: the broker re-reads it and connects.
    fe.write_lockfile(&b.pi_dir).unwrap();
    b.wait_editor(fe.port, "ready").await;
    b.stop().await;
}

#[tokio::test]
async fn fifty_editors_at_once_all_become_ready() {
    let b = TestBroker::start().await;
    let mut editors = Vec::new();
    for i in 0..50 {
        editors.push(
            FakeEditor::start(Options::pi(&[&format!("/w/{i}")]))
                .await
                .unwrap(),
        );
    }
    for e in &editors {
        e.write_lockfile(&b.pi_dir).unwrap();
    }
    let st = b
        .wait_status("50 ready editors", |st| {
            st["editors"]
                .as_array()
                .is_some_and(|a| a.len() == 50 && a.iter().all(|e| e["state"] == "ready"))
        })
        .await;
    let mut ids: Vec<&str> = st["editors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 50, "ids are unique");
    for e in &editors {
        assert_eq!(e.clients(), 1);
    }
    b.stop().await;
}

#[tokio::test]
async fn socket_and_dir_modes_and_stale_socket_replacement() {
    let dir = tempfile::tempdir().unwrap();
    // A stale socket from a dead daemon: bound, then its listener dropped.
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700)).unwrap();
    drop(std::os::unix::net::UnixListener::bind(run.join("sock")).unwrap());
    assert!(run.join("sock").exists());
    let b = TestBroker::start_in(dir, |_| {}).await;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&b.socket), 0o600);
    assert_eq!(mode(b.socket.parent().unwrap()), 0o700);
    assert!(
        b.status().await["editors"].is_array(),
        "the replaced socket answers"
    );
    // A second daemon on the same socket is refused, naming the running one.
    let cfg = crate::common::test_config(b.dir.path());
    let second = pi_ide_broker::serve(cfg, tokio_util::sync::CancellationToken::new(), |_, _| {});
    let err = within("second daemon", second)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("already running (pid {})", std::process::id())),
        "{err}"
    );
    b.stop().await;
}

#[tokio::test]
async fn a_world_writable_socket_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = crate::common::test_config(dir.path());
    let r = within(
        "serve",
        pi_ide_broker::serve(cfg, tokio_util::sync::CancellationToken::new(), |_, _| {}),
    )
    .await;
    let err = r.unwrap_err().to_string();
    assert!(
        err.contains("writable by others") && err.contains("chmod 700"),
        "{err}"
    );
}

#[tokio::test]
async fn selection_and_tools_are_cached_per_editor() {
    let b = TestBroker::start().await;
    let (fe, id) = b.editor(&["/p"]).await;
    fe.select("/p/main.rs", "fn main", 3);
    let reg = b.handle.registry().clone();
    let sel = pi_ide_broker::testkit::eventually("cached selection", || {
        reg.editor(&id).and_then(|e| e.last_selection())
    })
    .await;
    assert!(sel.contains("/p/main.rs"));
    // The tools are cached too: the editor's own list, as its tools/list gave it.
    let tools = reg
        .editor(&id)
        .and_then(|e| e.tool_names())
        .expect("the editor's tools/list is cached");
    for t in ["openDiff", "getDiagnostics", "close_tab"] {
        assert!(tools.iter().any(|n| n == t), "{t} missing from {tools:?}");
    }
    b.stop().await;
}
#[allow(dead_code)]
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("debug")
        .with_test_writer()
        .try_init();
}
