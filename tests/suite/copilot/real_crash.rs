//! The real Copilot CLI (`real`) across a broker killed with SIGKILL: the broker runs as a
//! process (as `crash` runs it), so its death leaves its copilot lockfile behind, naming a dead
//! pid and a dead socket; the next broker sweeps it at start and publishes a fresh one.

use super::real::{find_copilot, lockfiles, one_lockfile, project, start_copilot};
use crate::common::fake_model::FakeModel;
use crate::common::process::{start_daemon, write_config};
use crate::common::{FakeEditor, Options};
use rustix::process::Signal;

/// Issue 65: a killed broker's lockfile is left (its pid dead); the next broker removes it at
/// start and publishes a fresh one for the same editor, and the real Copilot CLI, which was
/// connected through the dead one, connects to the new one by itself: no stale "connected",
/// its footer shows a selection made after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_reconnects_after_a_killed_broker_whose_lockfile_is_swept() {
    let Some(copilot) = find_copilot() else {
        return;
    };
    // Copilot CLI's start loads the machine: its turn among the heavy tests.
    let _heavy = crate::common::machine_heavy().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    let ide = root.join("copilot-home").join("ide");
    std::fs::create_dir_all(root.join("copilot-home")).expect("mkdir copilot home");
    let cfg = write_config(
        root,
        &format!("[copilot]\nenabled = true\ndir = \"{}\"\n", ide.display()),
    );
    std::fs::create_dir_all(root.join("pi-ide")).expect("mkdir");
    let proj = project(root);
    let folder = proj.display().to_string();
    let file = proj.join("a.rs").display().to_string();
    let fe = FakeEditor::start_in(&root.join("pi-ide"), Options::pi(&[&folder]))
        .await
        .expect("fake editor");
    let mut daemon = start_daemon(&cfg).await;
    let first = one_lockfile(root, None).await;
    let model = FakeModel::start().await;
    let tui = start_copilot(&copilot, root, &proj, &model).await;
    tui.wait_log("Connected to IDE MCP server", 1).await;
    fe.select(&file, "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;

    tui.forget();
    daemon.signal(Signal::KILL);
    daemon.wait_exit().await;
    assert_eq!(
        lockfiles(root),
        vec![first.clone()],
        "a killed broker cannot remove its lockfile"
    );
    let left: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ide.join(&first)).expect("read"))
            .expect("lockfile JSON");
    let pid = left["pid"].as_u64().and_then(|p| u32::try_from(p).ok());
    assert!(
        pid.is_some_and(|p| !pi_ide_broker::platform::process::alive(p)),
        "it names the dead broker: {left}"
    );

    let mut next = start_daemon(&cfg).await;
    let second = one_lockfile(root, Some(&first)).await;
    assert_ne!(
        second, first,
        "the dead broker's lockfile swept, a fresh one published"
    );
    tui.wait_for("Connected to Neovim (via pi-ide-broker)")
        .await;
    fe.select(&file, "fn one() {}", 0);
    tui.wait_for("@a.rs:1").await;
    tui.quit().await;
    next.signal(Signal::TERM);
    next.wait_exit().await;
}
