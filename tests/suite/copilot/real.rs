//! The real GitHub Copilot CLI (`@github/copilot`, pinned in `.ci/npm/copilot`; `.ci/run`
//! exports its native binary as `PI_IDE_BROKER_COPILOT`) in a pty (`script`), offline:
//! `COPILOT_OFFLINE` with a fake OpenAI-compatible `/chat/completions` on 127.0.0.1, a temp
//! `COPILOT_HOME` whose `ide` dir is the broker's copilot door's, its folder trusted there.

use crate::common::broker::TestBroker;
use crate::common::fake_model::{FakeModel, Reply};
use crate::common::tui::{tail, Tui, Typing};
use crate::common::FakeEditor;
use pi_ide_broker::sys::config::Config;
use pi_ide_broker::testkit::eventually;
use pi_ide_broker::testkit::fake_editor::Options;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The pinned Copilot CLI's native binary, or `None` (said) to skip.
pub(super) fn find_copilot() -> Option<PathBuf> {
    match std::env::var_os("PI_IDE_BROKER_COPILOT").filter(|p| !p.is_empty()) {
        Some(p) => {
            let p = PathBuf::from(p);
            assert!(
                p.exists(),
                "PI_IDE_BROKER_COPILOT={} is not there",
                p.display()
            );
            Some(p)
        }
        None => {
            crate::common::cannot_run(
                "copilot::real: set PI_IDE_BROKER_COPILOT (bash .ci/run installs the pinned Copilot CLI)",
            );
            None
        }
    }
}

/// What a real-Copilot test starts from: the CLI; the machine's heavy turn (Copilot CLI's
/// start loads the machine, a 200 MB binary unpacking its JavaScript: taken so the flood
/// tests' bounds measure the broker); a broker with the copilot door on, its config also
/// `tweak`ed; its project folder ([`project`]). `None` (said) to skip without the CLI.
pub(super) async fn real(
    tweak: impl FnOnce(&mut Config),
) -> Option<(
    PathBuf,
    tokio::sync::MutexGuard<'static, ()>,
    TestBroker,
    PathBuf,
)> {
    let copilot = find_copilot()?;
    let heavy = crate::common::machine_heavy().await;
    let b = TestBroker::start_with(|c| {
        copilot_on(c);
        tweak(c);
    })
    .await;
    let proj = project(b.dir.path());
    Some((copilot, heavy, b, proj))
}

/// [`start_copilot`] in `cwd`, waited for until it is connected for good to the IDE (logged:
/// not only the selection pushed while its handshake goes on, so that a lockfile removed
/// after is a lost connection, not a failed connect) and broker `b` has its session.
pub(super) async fn start_connected(
    copilot: &Path,
    b: &TestBroker,
    cwd: &Path,
    model: &FakeModel,
) -> Tui {
    let tui = start_copilot(copilot, b.dir.path(), cwd, model).await;
    tui.wait_log("Connected to IDE MCP server", 1).await;
    copilot_session(b, &cwd.display().to_string()).await;
    tui
}

/// Types `/ide` and waits until its list shows IDE `ide` (through the broker) on each of
/// `others`, then on `current`, the connected one.
pub(super) async fn ide_list_shows(tui: &Tui, ide: &str, others: &[&str], current: &str) {
    tui.type_line("/ide").await;
    tui.wait_for("Select an IDE workspace to connect to:").await;
    for folder in others {
        tui.wait_for(&format!("{ide} (via pi-ide-broker): {folder}"))
            .await;
    }
    tui.wait_for(&format!("{ide} (via pi-ide-broker): {current} (current)"))
        .await;
}

/// Issue 65's first acceptance steps with the real Copilot CLI: started in the folder of an
/// editor the broker links, it connects to the broker's lockfile by itself, shows the
/// editor's selection in its footer; an edit accepted in the editor is written, one rejected
/// there is not (and the turn is cancelled); `/ide` lists the editor through the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_sees_the_selection_reviews_edits_in_the_editor_and_lists_it_in_ide() {
    let Some((copilot, _heavy, b, proj)) = real(|_| {}).await else {
        return;
    };
    let folder = proj.display().to_string();
    let (fe, _): (FakeEditor, String) = b.editor(&[&folder]).await;
    let mut model = FakeModel::start().await;
    let tui = start_copilot(&copilot, b.dir.path(), &proj, &model).await;
    // Its session came through the copilot door, its cwd the CLI's own (the socket peer's).
    copilot_session(&b, &folder).await;

    // The editor's selection, pushed on the session's event stream, is in the footer.
    fe.select(&proj.join("a.rs").display().to_string(), "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;

    // An edit the model asks for is reviewed in the editor: accepted there, Copilot CLI
    // writes it; rejected there, the file stays as it was.
    let file = proj.join("a.rs");
    for (old, new, accept) in [
        ("fn one() {}", "fn uno() {}", true),
        ("fn two() {}", "fn dos() {}", false),
    ] {
        let args =
            serde_json::json!({"path": file.display().to_string(), "old_str": old, "new_str": new});
        model.push(Reply::Tool {
            name: "edit".into(),
            args,
        });

        tui.type_line(if accept { "edit1" } else { "edit2" }).await;
        let tab = eventually("a diff in the editor", || {
            let p = fe.pending_diffs();
            (p.len() == 1).then(|| p[0].clone())
        })
        .await;
        assert!(tab.contains("a.rs"), "{tab}");
        let before = std::fs::read_to_string(&file).expect("read a.rs");
        let proposed = before.replace(old, new);
        if accept {
            assert!(fe.accept_diff(&tab, &proposed));
            eventually("Copilot CLI wrote the edit", || {
                (std::fs::read_to_string(&file).ok()? == proposed).then_some(())
            })
            .await;
            // The turn goes on with the edit's outcome (answered "ok"): the next edit waits
            // for that request, so no request of this turn takes the next scripted call.
            model.next_tool_outcome().await;
        } else {
            assert!(fe.reject_diff(&tab));
            tui.wait_for("The user rejected this tool call").await;
            assert_eq!(std::fs::read_to_string(&file).expect("read a.rs"), before);
        }
    }

    // `/ide` lists the editor, through the broker, on its folder, as the current one.
    ide_list_shows(&tui, "Neovim", &[], &folder).await;
    if std::env::var_os("COPILOT_TEST_DUMP").is_some() {
        eprintln!("{}", tail(&tui.screen(), 6000));
    }
    tui.quit().await;
    b.stop().await;
}

/// The copilot door on, its dir `copilot-home/ide` beside the broker's dirs (the CLI's
/// `COPILOT_HOME` below), that home made as a Copilot CLI that ran before made it (the door
/// publishes nothing without it).
pub(super) fn copilot_on(c: &mut Config) {
    c.edit_section(|s: &mut pi_ide_broker::frontdoor::copilot::CopilotConfig| {
        s.enabled = true;
        s.dir = s
            .dir
            .as_ref()
            .and_then(|d| d.parent())
            .map(|r| r.join("copilot-home").join("ide"));
        if let Some(home) = s.dir.as_ref().and_then(|d| d.parent()) {
            std::fs::create_dir_all(home).expect("mkdir copilot home");
        }
    });
}

/// A Copilot CLI in `proj` (the editor's folder) of broker dir `root`, offline against `model`,
/// `COPILOT_HOME` the door's, the folder trusted. Waits for its prompt.
pub(super) async fn start_copilot(
    copilot: &Path,
    root: &Path,
    proj: &Path,
    model: &FakeModel,
) -> Tui {
    let copilot_home = root.join("copilot-home");
    std::fs::create_dir_all(&copilot_home).expect("mkdir copilot home");
    let trusted = serde_json::json!({"trustedFolders": [proj.display().to_string()]}).to_string();
    std::fs::write(copilot_home.join("config.json"), trusted).expect("config.json");
    let settings = r#"{"showTipsOnStartup": false}"#;
    std::fs::write(copilot_home.join("settings.json"), settings).expect("settings.json");
    let cache = std::env::temp_dir().join("pi-ide-broker-copilot-cache");
    // One write: drawn at once, so no hint line lands between its characters.
    let typing = Typing::Burst {
        settle: Duration::from_millis(1000),
    };
    let tui = Tui::start("Copilot CLI", copilot, &[], proj, typing, |cmd| {
        cmd.env_remove("GH_TOKEN")
            .env_remove("GITHUB_TOKEN")
            .env_remove("COPILOT_GITHUB_TOKEN")
            .env("HOME", root.join("home"))
            .env("COPILOT_HOME", &copilot_home)
            .env("COPILOT_CACHE_HOME", cache)
            .env("COPILOT_OFFLINE", "true")
            .env(
                "COPILOT_PROVIDER_BASE_URL",
                format!("http://127.0.0.1:{}", model.port),
            )
            .env("COPILOT_MODEL", "fake-model");
    })
    .with_logs(copilot_home.join("logs"));
    tui.wait_for("❯").await;
    tui
}

/// The project folder `proj` (canonical) of broker dir `root`, with `a.rs` of two lines.
pub(super) fn project(root: &Path) -> PathBuf {
    let proj = root.join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    let proj = std::fs::canonicalize(&proj).expect("canonical proj");
    std::fs::write(proj.join("a.rs"), "fn one() {}\nfn two() {}\n").expect("write a.rs");
    proj
}

/// The lockfiles in the door's dir (the names).
pub(super) fn lockfiles(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root.join("copilot-home").join("ide"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.ends_with(".lock"))
        .collect();
    v.sort();
    v
}

/// Waits until the door's dir holds exactly one lockfile, other than `old` if named; its name.
pub(super) async fn one_lockfile(root: &Path, old: Option<&str>) -> String {
    eventually("one copilot lockfile", || {
        let l = lockfiles(root);
        (l.len() == 1 && Some(l[0].as_str()) != old).then(|| l[0].clone())
    })
    .await
}

/// Waits until broker `b` has a copilot session whose cwd is `folder`.
pub(super) async fn copilot_session(b: &TestBroker, folder: &str) {
    b.wait_status("a copilot session in the project", |st| {
        st["sessions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["door"] == "copilot" && s["cwd"] == folder)
    })
    .await;
}

/// Issue 65: an editor restart is survived. The editor goes (its lockfile removed, its process
/// dead): the Copilot CLI shows the IDE connection lost at once (no stale "connected" to an
/// editor that is not there); it comes back on the same folder (the same id, a successor):
/// the CLI connects to it again by itself and shows its selection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_loses_a_dead_editor_and_reconnects_to_its_restart() {
    // A grace period longer than any wait here: the CLI must learn at once that the editor
    // went, not when the broker gives up on it, and the restart comes within it.
    let Some((copilot, _heavy, b, proj)) = real(|c| c.editor_grace_ms = 600_000).await else {
        return;
    };
    let folder = proj.display().to_string();
    let file = proj.join("a.rs").display().to_string();
    let (fe, id) = b.editor(&[&folder]).await;
    let first = one_lockfile(b.dir.path(), None).await;
    let model = FakeModel::start().await;
    let tui = start_connected(&copilot, &b, &proj, &model).await;
    fe.select(&file, "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;

    tui.forget();
    fe.remove_lockfile();
    fe.crash().await;
    b.wait_editor_gone(fe.port).await;
    tui.wait_for("IDE connection lost").await;
    eventually("the lockfile withdrawn", || {
        lockfiles(b.dir.path()).is_empty().then_some(())
    })
    .await;

    // The restart: a new process on a new port, the same folder, the same id; a fresh lockfile.
    let (fe2, id2) = b.start_editor(Options::pi(&[&folder])).await;
    assert_eq!(id2, id, "a restart of the same editor keeps its id");
    let second = one_lockfile(b.dir.path(), Some(&first)).await;
    assert_ne!(second, first);
    tui.wait_for("Connected to Neovim (via pi-ide-broker)")
        .await;
    copilot_session(&b, &folder).await;
    fe2.select(&file, "fn one() {}", 0);
    tui.wait_for("@a.rs:1").await;
    tui.quit().await;
    b.stop().await;
}

/// Issue 65: a broker restart is survived. The broker stops (its lockfiles withdrawn: the CLI
/// shows the connection lost), a new one starts on the same dirs with the editor still up: it
/// publishes a fresh lockfile, the CLI connects to it by itself and the selection comes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_reconnects_after_a_broker_restart() {
    let Some((copilot, _heavy, b, proj)) = real(|_| {}).await else {
        return;
    };
    let folder = proj.display().to_string();
    let file = proj.join("a.rs").display().to_string();
    let (fe, id) = b.editor(&[&folder]).await;
    let first = one_lockfile(b.dir.path(), None).await;
    let model = FakeModel::start().await;
    let tui = start_connected(&copilot, &b, &proj, &model).await;
    fe.select(&file, "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;

    tui.forget();
    let dir = b.stop_keep_dir().await;
    tui.wait_for("IDE connection lost").await;
    assert!(
        lockfiles(dir.path()).is_empty(),
        "a stopped broker leaves no lockfile"
    );

    let b = TestBroker::start_in(dir, copilot_on).await;
    let e = b.wait_editor(fe.port, "ready").await;
    assert_eq!(
        e["id"],
        id.as_str(),
        "the editor keeps its id across a broker restart"
    );
    let second = one_lockfile(b.dir.path(), Some(&first)).await;
    assert_ne!(second, first);
    tui.wait_for("Connected to Neovim (via pi-ide-broker)")
        .await;
    copilot_session(&b, &folder).await;
    fe.select(&file, "fn one() {}", 0);
    tui.wait_for("@a.rs:1").await;
    tui.quit().await;
    b.stop().await;
}

/// Issue 65 with a real editor: Neovim with pi-ide.nvim, linked by the broker; the real Copilot
/// CLI in its folder connects through the copilot door, shows the selection made in Neovim,
/// and an edit the model asks for, accepted in Neovim, is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_with_a_real_neovim_shows_its_selection_and_writes_an_accepted_edit() {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let Some((copilot, _heavy, b, proj)) = real(|_| {}).await else {
        return;
    };
    let file = proj.join("a.rs");
    let Some(ed) = NvimEditor::start(&b, Plugin::PiIde, &proj, "nvim").await else {
        return;
    };
    b.wait_editor(ed.port, "ready").await;
    one_lockfile(b.dir.path(), None).await;
    let model = FakeModel::start().await;
    let tui = start_connected(&copilot, &b, &proj, &model).await;
    ed.select(&file, 2).await;
    tui.wait_for("@a.rs:2").await;

    let (old, new) = ("fn one() {}", "fn uno() {}");
    let args =
        serde_json::json!({"path": file.display().to_string(), "old_str": old, "new_str": new});
    model.push(Reply::Tool {
        name: "edit".into(),
        args,
    });
    tui.type_line("edit1").await;
    ed.pending_until("the diff open in Neovim", |s| !s.is_empty())
        .await;
    let proposed = std::fs::read_to_string(&file)
        .expect("read a.rs")
        .replace(old, new);
    ed.accept(&file, "a.rs", "").await;
    eventually("Copilot CLI wrote the edit accepted in Neovim", || {
        (std::fs::read_to_string(&file).ok()? == proposed).then_some(())
    })
    .await;
    tui.quit().await;
    b.stop().await;
}

/// The door's one lockfile in broker dir `root`: its JSON `workspaceFolders`, read once whole
/// (a read opens the file, which the door takes as a Copilot CLI looking: call it only to
/// check). The door rewrites it in place, as Copilot CLI needs (truncated, then written): a
/// read between the two finds it empty or cut, and is made again once it has changed.
async fn listed_folders(root: &Path) -> Vec<String> {
    let name = lockfiles(root).into_iter().next().expect("a lockfile");
    let path = root.join("copilot-home").join("ide").join(name);
    let t0 = std::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(&path).expect("read the lockfile");
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => {
                return serde_json::from_value(v["workspaceFolders"].clone())
                    .expect("workspaceFolders")
            }
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "the lockfile is not whole JSON 10 s on ({e}): {text:?}"
                );
                let len = text.len() as u64;
                while std::fs::metadata(&path).map_or(len, |m| m.len()) == len
                    && t0.elapsed() < Duration::from_secs(10)
                {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// The size of the door's one lockfile in broker dir `root` (a `stat`, which opens nothing).
fn lockfile_len(root: &Path) -> u64 {
    lockfiles(root)
        .into_iter()
        .next()
        .and_then(|n| std::fs::metadata(root.join("copilot-home").join("ide").join(n)).ok())
        .map_or(0, |m| m.len())
}

/// Issue 65: a Copilot CLI started in a subfolder of the editor's folder connects by itself
/// (Copilot CLI matches only a folder equal to its cwd: the door lists that cwd in the
/// editor's lockfile once it sees the CLI reading it), sees the selection, and `/ide` shows
/// both rows, the subfolder's current. When the CLI exits, the subfolder is taken off again
/// (its exit, not a read of the file, makes the door look).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_in_a_subfolder_connects_by_itself_and_sees_the_selection() {
    let Some((copilot, _heavy, b, proj)) = real(|_| {}).await else {
        return;
    };
    let sub = proj.join("src").join("deep");
    std::fs::create_dir_all(&sub).expect("mkdir sub");
    let (folder, subdir) = (proj.display().to_string(), sub.display().to_string());
    let file = proj.join("a.rs").display().to_string();
    let (fe, _) = b.editor(&[&folder]).await;
    one_lockfile(b.dir.path(), None).await;
    let model = FakeModel::start().await;
    let tui = start_connected(&copilot, &b, &sub, &model).await;
    fe.select(&file, "fn two() {}", 1);
    tui.wait_for("@a.rs:2").await;
    let len = lockfile_len(b.dir.path());
    assert_eq!(
        listed_folders(b.dir.path()).await,
        vec![folder.clone(), subdir.clone()]
    );

    // `/ide`: the editor on its folder, and on the subfolder, where the CLI is connected.
    ide_list_shows(&tui, "Neovim", &[&folder], &subdir).await;
    tui.quit().await;
    eventually("the subfolder taken off the lockfile", || {
        (lockfile_len(b.dir.path()) < len).then_some(())
    })
    .await;
    assert_eq!(listed_folders(b.dir.path()).await, vec![folder]);
    b.stop().await;
}
