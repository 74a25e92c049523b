//! Lock dirs however they are spelled or whenever they appear: editors are seen through the
//! watcher's events, never only at the periodic rescan (set to an hour here, so a test that
//! passes only through a rescan times out instead).

use crate::common::{FakeEditor, Options, TestBroker};

const NO_RESCAN_MS: u64 = 3_600_000;

#[tokio::test]
async fn a_lock_dir_reached_through_a_symlink_sees_a_new_editor_by_its_events() {
    let outside = tempfile::tempdir().unwrap();
    let real = outside.path().join("real-ide");
    std::fs::create_dir(&real).unwrap();
    let link = outside.path().join("linked-ide");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let b = TestBroker::start_with(|c| {
        c.rescan_interval_ms = NO_RESCAN_MS;
        if let Some(dirs) = c.lock_dirs.as_mut() {
            dirs[0].path = link.clone();
        }
    })
    .await;
    // The editor writes its lockfile through the real path, as one that resolved the link would.
    let fe = FakeEditor::start_in(&real, Options::pi(&["/work/linked"]))
        .await
        .unwrap();
    let e = b.wait_editor(fe.port, "ready").await;
    let lockfile = e["lockfile"].as_str().unwrap_or_default().to_string();
    assert!(
        lockfile.starts_with(link.to_str().unwrap()),
        "the editor's lockfile is named as the dir is configured: {lockfile}"
    );
    b.stop().await;
}

#[tokio::test]
async fn a_missing_lock_dir_is_left_to_its_editor_and_its_first_editor_seen() {
    let outside = tempfile::tempdir().unwrap();
    let later = outside.path().join("not/yet/ide");
    let b = TestBroker::start_with(|c| {
        c.rescan_interval_ms = NO_RESCAN_MS;
        if let Some(dirs) = c.lock_dirs.as_mut() {
            dirs[0].path = later.clone();
        }
    })
    .await;
    assert!(!later.exists(), "the editor's dir is the editor's to make");
    let fe = FakeEditor::start_in(&later, Options::pi(&["/work/later"]))
        .await
        .unwrap();
    b.wait_editor(fe.port, "ready").await;
    b.stop().await;
}

#[tokio::test]
async fn a_lock_dir_that_could_not_be_created_is_picked_up_once_it_can_be() {
    let outside = tempfile::tempdir().unwrap();
    // A file where the dir's parent should be: the daemon cannot create the dir.
    let blocker = outside.path().join("blocked");
    std::fs::write(&blocker, "").unwrap();
    let dir = blocker.join("ide");
    let b = TestBroker::start_with(|c| {
        c.rescan_interval_ms = NO_RESCAN_MS;
        if let Some(dirs) = c.lock_dirs.as_mut() {
            dirs[0].path = dir.clone();
        }
    })
    .await;
    assert!(!dir.exists());
    // The user (or the editor) makes the dir; the poll finds it and its editor.
    std::fs::remove_file(&blocker).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let fe = FakeEditor::start_in(&dir, Options::pi(&["/work/blocked"]))
        .await
        .unwrap();
    b.wait_editor(fe.port, "ready").await;
    b.stop().await;
}
