//! Issue 65: Claude Code's own `/ide` for editors that write no Claude lockfile (pi-ide.nvim):
//! the compat door's Claude lockfiles (`[compat] claude`), with fake editors. `real`: the real
//! Claude Code lists a real Neovim with pi-ide.nvim and has its edit reviewed there.

mod real;

use crate::common::*;
use pi_ide_broker::frontdoor::compat::CompatConfig;
use pi_ide_broker::testkit::pi_client::PiClient;
use pi_ide_broker::testkit::{diff_args, eventually, text, within};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The broker's files in `dir` (by its marker), with their JSON.
fn marked(dir: &Path) -> Vec<(PathBuf, Value)> {
    let mut out: Vec<(PathBuf, Value)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
        .filter_map(|e| {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok()?;
            v.get("piIdeBroker").is_some().then(|| (e.path(), v))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The broker's Claude lockfile for editor `id`, once there is one.
async fn claude_lockfile(b: &TestBroker, id: &str) -> (PathBuf, Value) {
    eventually(&format!("a Claude lockfile for {id}"), || {
        marked(&b.claude_dir)
            .into_iter()
            .find(|(_, v)| v["piIdeBroker"]["editor"] == id)
    })
    .await
}

/// Until no Claude lockfile of the broker's names editor `id`.
async fn no_claude_lockfile(b: &TestBroker, id: &str) {
    eventually(&format!("no Claude lockfile for {id}"), || {
        (!marked(&b.claude_dir)
            .iter()
            .any(|(_, v)| v["piIdeBroker"]["editor"] == id))
        .then_some(())
    })
    .await
}

/// A pi-ide editor gets a Claude lockfile in Claude Code's format (private, the editor's pid,
/// a name that says it goes through the broker); a client in Claude Code's dialect (its
/// header) connects, gets the editor's selection and has a diff reviewed there; the file is
/// gone with the editor.
#[tokio::test]
async fn a_pi_editor_gets_a_claude_lockfile_that_claude_code_dialect_uses() {
    let b = TestBroker::start_with(|c| c.editor_grace_ms = 100).await;
    let (fe, id) = b.editor(&["/home/u/proj"]).await;
    let (path, lock) = claude_lockfile(&b, &id).await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", path.display());
    assert_eq!(lock["pid"], std::process::id(), "the editor's pid: {lock}");
    assert_eq!(lock["piIdeBroker"]["pid"], std::process::id(), "{lock}");
    assert_eq!(lock["ideName"], "Neovim (via pi-ide-broker)");
    assert_eq!(lock["transport"], "ws");
    assert_eq!(lock["workspaceFolders"], json!(["/home/u/proj"]));
    let token = lock["authToken"].as_str().unwrap_or_default().to_string();
    assert!(token.len() >= 32, "{lock}");
    let port: u16 = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    // A browser, and the wrong token, are refused as the compat door refuses them.
    let header = "x-claude-code-ide-authorization";
    let browser = PiClient::connect_with(port, header, &token, Some("https://evil.example")).await;
    assert_eq!(
        browser.err().as_deref(),
        Some("Unexpected server response: 403")
    );
    let wrong = PiClient::connect_with(port, header, &"0".repeat(token.len()), None).await;
    assert!(wrong.is_err(), "a wrong token is refused");

    let mut c = PiClient::connect_with(port, header, &token, None)
        .await
        .unwrap();
    fe.select("/home/u/proj/a.rs", "let a = 1;", 2);
    let sel = within("the selection", async {
        loop {
            match c.next_message().await {
                Some(v) if v["method"] == "selection_changed" => return v["params"].clone(),
                Some(_) => {}
                None => panic!("closed before the selection"),
            }
        }
    })
    .await;
    assert_eq!(sel["filePath"], "/home/u/proj/a.rs", "{sel}");
    assert_eq!(sel["text"], "let a = 1;", "{sel}");
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["dialect"], "claude", "{st:#}");

    let differ = tokio::spawn(async move {
        let args = diff_args("/home/u/proj/a.rs", "let a = 2;\n", "claude-edit");
        let r = c.tool("openDiff", args).await;
        (r, c)
    });
    let tab = eventually("the diff in the editor", || {
        fe.pending_diffs().first().cloned()
    })
    .await;
    assert!(fe.accept_diff(&tab, "let a = 2;\n"));
    let (r, _c) = within("the verdict", differ).await.unwrap();
    let v = r.unwrap();
    assert_eq!(text(&v), "FILE_SAVED", "{v}");

    fe.remove_lockfile();
    fe.crash().await;
    b.wait_editor_gone(fe.port).await;
    eventually("the Claude lockfile removed with its editor", || {
        (!path.exists()).then_some(())
    })
    .await;
    b.stop().await;
}

/// A process of its own for an editor's lockfile (`pid`), alive while the test runs.
fn a_process() -> tokio::process::Child {
    tokio::process::Command::new("sleep")
        .arg("300")
        .kill_on_drop(true)
        .spawn()
        .expect("spawn sleep")
}

/// A fake editor of `opts`' family whose lockfile (in `dir`) names process `pid`.
async fn editor_as(
    b: &TestBroker,
    dir: &Path,
    opts: Options,
    pid: u32,
) -> (FakeEditor, PathBuf, String) {
    let fe = FakeEditor::start(opts).await.expect("fake editor");
    let mut v: Value = serde_json::from_str(&fe.lockfile_json()).unwrap();
    v["pid"] = json!(pid);
    let path = dir.join(format!("{}.lock", fe.port));
    std::fs::write(&path, v.to_string()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let e = b.wait_editor(fe.port, "ready").await;
    let id = e["id"].as_str().unwrap_or_default().to_string();
    (fe, path, id)
}

/// Only editors without a Claude lockfile of their own get one: not a Claude-family editor
/// found in Claude Code's dir, nor a pi editor whose process wrote one there too (a Neovim
/// with both plugins), whose entry goes when that one comes and returns when it goes. A dead
/// broker's leftovers are swept at start; a file without the marker is never touched.
#[tokio::test]
async fn only_editors_without_their_own_get_one_leftovers_swept_foreign_files_kept() {
    let dir = tempfile::tempdir().unwrap();
    let claude = dir.path().join("claude-ide");
    std::fs::create_dir_all(&claude).unwrap();
    std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let leftover = claude.join("1111.lock");
    let body = json!({"pid": std::process::id(), "authToken": "0123456789ab", "piIdeBroker": {"editor": "x", "pid": dead}});
    std::fs::write(&leftover, body.to_string()).unwrap();
    let foreign = claude.join("2222.lock");
    let foreign_body = json!({"pid": dead, "authToken": "0123456789ab"}).to_string();
    std::fs::write(&foreign, &foreign_body).unwrap();
    let b = TestBroker::start_in(dir, |c| c.editor_grace_ms = 100).await;
    eventually("the leftover swept", || (!leftover.exists()).then_some(())).await;

    let (proc_a, proc_b) = (a_process(), a_process());
    let (pid_a, pid_b) = (proc_a.id().unwrap(), proc_b.id().unwrap());
    let (_a, _, a) = editor_as(&b, &b.pi_dir, Options::pi(&["/a"]), pid_a).await;
    let (_c, _, c) = editor_as(&b, &b.claude_dir, Options::claudecode(&["/c"]), pid_b).await;
    let (_, lock) = claude_lockfile(&b, &a).await;
    assert_eq!(lock["pid"], pid_a);
    // The Claude-family editor has its own: none of ours for it, now or after a change.
    let (_x, _) = b.editor(&["/x"]).await;
    assert!(marked(&b.claude_dir)
        .iter()
        .all(|(_, v)| v["piIdeBroker"]["editor"] != c));

    // The same process writes a Claude lockfile too: ours for it is withdrawn...
    let (d_fe, d_path, _d) =
        editor_as(&b, &b.claude_dir, Options::claudecode(&["/a"]), pid_a).await;
    no_claude_lockfile(&b, &a).await;
    // ...and published again once that one is gone.
    std::fs::remove_file(&d_path).unwrap();
    d_fe.crash().await;
    b.wait_editor_gone(d_fe.port).await;
    claude_lockfile(&b, &a).await;

    assert_eq!(
        std::fs::read_to_string(&foreign).unwrap(),
        foreign_body,
        "a file without the marker is never touched"
    );
    let ours: Vec<PathBuf> = marked(&b.claude_dir).into_iter().map(|(p, _)| p).collect();
    let _kept = b.stop_keep_dir().await;
    for p in ours {
        assert!(!p.exists(), "removed at stop: {}", p.display());
    }
    assert!(foreign.exists(), "kept at stop");
}

/// A HOME that never had Claude Code gets no `~/.claude/ide` from the broker: with no Claude
/// lock dir and no parent, nothing is made; with the parent (Claude Code's home) there, the
/// dir is made private and the lockfile written.
#[tokio::test]
async fn the_claude_dir_is_made_only_where_claude_code_has_a_home() {
    let b = TestBroker::start_with(|c| {
        let home = c.home.clone().unwrap_or_default();
        c.edit_section(|s: &mut CompatConfig| s.claude_dir = Some(home.join("never-claude/ide")));
    })
    .await;
    let (_fe, _) = b.editor(&["/n"]).await;
    // A compat entry for pi-ide is there by now (the same door, the same event).
    compat_entry(&b.dir.path().join("compat"), "/n").await;
    assert!(
        !b.dir.path().join("home/never-claude").exists(),
        "nothing made"
    );
    b.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let claude_home = dir.path().join("claude-home");
    std::fs::create_dir_all(&claude_home).unwrap();
    let ide = claude_home.join("ide");
    let b = TestBroker::start_in(dir, |c| {
        c.edit_section(|s: &mut CompatConfig| s.claude_dir = Some(ide.clone()))
    })
    .await;
    let (_fe, id) = b.editor(&["/m"]).await;
    eventually("a Claude lockfile in the dir made", || {
        marked(&ide)
            .into_iter()
            .find(|(_, v)| v["piIdeBroker"]["editor"] == id.as_str())
    })
    .await;
    let mode = std::fs::metadata(&ide).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    b.stop().await;
}
