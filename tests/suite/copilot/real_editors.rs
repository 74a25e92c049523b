//! The real Copilot CLI (`real`) with other real editors linked by the broker: the real VS Code
//! with the Claude Code extension (`common::vscode`), which speaks Claude Code's protocol to
//! the broker while Copilot CLI connects through the broker's copilot lockfile.

use super::real::{copilot_on, find_copilot, ide_list_shows, one_lockfile, real, start_connected};
use crate::common::broker::TestBroker;
use crate::common::fake_model::{FakeModel, Reply};
use crate::common::vscode::{find_vscode, VsCode};
use crate::common::Agent;
use crate::vscode::{call, click_when_shown};
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::sys::config::LockDirConfig;
use pi_ide_broker::testkit::eventually;
use serde_json::json;

/// Issue 65 with the real VS Code as the editor: the Claude Code extension's lockfile is
/// linked by the broker (the Claude family), which publishes a copilot lockfile for it; the
/// real Copilot CLI in its workspace connects by itself, shows the selection made in VS Code,
/// lists it in `/ide`; an edit accepted in VS Code's diff is written by Copilot CLI, one
/// rejected there leaves the file as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_with_the_real_vs_code_sees_its_selection_and_its_diff_verdicts() {
    let (Some(copilot), Some(install)) = (find_copilot(), find_vscode()) else {
        return;
    };
    let root = tempfile::tempdir().expect("tempdir");
    // `VsCode::start` takes this test's turn among the machine-heavy ones (held while it runs).
    let before = "fn one() {}\nfn two() {}\n";
    let mut vsc = VsCode::start(&install, root.path(), &[("a.rs", before)]).await;
    let lock_dir = vsc.lock_dir.clone();
    let b = TestBroker::start_with(|c| {
        copilot_on(c);
        c.lock_dirs = Some(vec![LockDirConfig {
            path: lock_dir,
            family: Family::Claude,
        }]);
    })
    .await;
    let ws = std::fs::canonicalize(&vsc.workspace).expect("canonical workspace");
    let folder = ws.display().to_string();
    let file = ws.join("a.rs");
    let e = b
        .wait_status("VS Code linked", |st| {
            st["editors"]
                .as_array()
                .is_some_and(|e| e.iter().any(|e| e["state"] == "ready"))
        })
        .await;
    let ide_name = e["editors"][0]["ide_name"]
        .as_str()
        .unwrap_or("code-server")
        .to_string();
    one_lockfile(b.dir.path(), None).await;
    let mut model = FakeModel::start().await;
    let tui = start_connected(&copilot, &b, &ws, &model).await;

    // A selection made in VS Code (by a helper session's openFile) reaches the footer.
    let query = format!(
        "cwd={}&dialect=claude",
        pi_ide_broker::protocol::percent::encode_query(&folder)
    );
    let mut helper = Agent::connect(&b.socket, &query).await.expect("agent");
    helper.attached().await;
    let args = json!({"filePath": file, "preview": false, "startText": "fn two", "endText": "{}", "makeFrontmost": true});
    let opened = call(&mut helper, 1, "openFile", args).await;
    assert!(opened.get("result").is_some(), "{opened:#}");
    tui.wait_for("@a.rs:2").await;

    // The edits: accepted in VS Code's diff, then rejected there.
    for (old, new, accept) in [
        ("fn one() {}", "fn uno() {}", true),
        ("fn two() {}", "fn dos() {}", false),
    ] {
        let now = std::fs::read_to_string(&file).expect("read a.rs");
        let args = json!({"path": file.display().to_string(), "old_str": old, "new_str": new});
        model.push(Reply::Tool {
            name: "edit".into(),
            args,
        });
        tui.type_line(if accept { "edit1" } else { "edit2" }).await;
        if accept {
            click_when_shown(&mut vsc, "Claude Code: Accept Proposed Changes").await;
            let proposed = now.replace(old, new);
            eventually("Copilot CLI wrote the edit accepted in VS Code", || {
                (std::fs::read_to_string(&file).ok()? == proposed).then_some(())
            })
            .await;
            // The turn goes on with the edit's outcome: wait for that request, so that no
            // request of this turn takes the next scripted reply.
            model.next_tool_outcome().await;
        } else {
            click_when_shown(&mut vsc, "Claude Code: Reject Proposed Changes").await;
            tui.wait_for("The user rejected this tool call").await;
            assert_eq!(std::fs::read_to_string(&file).expect("read a.rs"), now);
        }
    }

    // `/ide` lists VS Code, through the broker, on its workspace, as the current one.
    ide_list_shows(&tui, &ide_name, &[], &folder).await;
    tui.quit().await;
    helper.close().await;
    b.stop().await;
}

/// Issue 65 with claudecode.nvim (the Claude family) as the editor: the broker links its
/// lockfile and publishes a copilot lockfile for it; the real Copilot CLI in its folder
/// connects by itself, shows the selection made in Neovim, an edit accepted there
/// (`:ClaudeCodeDiffAccept`) is written, and `/ide` lists the editor through the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_copilot_cli_with_claudecode_nvim_lists_it_sees_its_selection_and_writes_an_accepted_edit(
) {
    use crate::common::nvim_editor::{NvimEditor, Plugin};
    let Some((copilot, _heavy, b, proj)) = real(|_| {}).await else {
        return;
    };
    let folder = proj.display().to_string();
    let file = proj.join("a.rs");
    let Some(ed) = NvimEditor::start(&b, Plugin::ClaudeCode, &proj, "nvim").await else {
        return;
    };
    let e = b.wait_editor(ed.port, "ready").await;
    assert_eq!(e["family"], "claude", "{e}");
    let ide_name = e["ide_name"].as_str().unwrap_or("Neovim").to_string();
    one_lockfile(b.dir.path(), None).await;
    let mut model = FakeModel::start().await;
    let tui = start_connected(&copilot, &b, &proj, &model).await;
    ed.select(&file, 2).await;
    tui.wait_for("@a.rs:2").await;

    let (old, new) = ("fn one() {}", "fn uno() {}");
    let args = json!({"path": file.display().to_string(), "old_str": old, "new_str": new});
    model.push(Reply::Tool {
        name: "edit".into(),
        args,
    });
    tui.type_line("edit1").await;
    let tab = ed
        .pending_until("the diff open in claudecode.nvim", |s| !s.is_empty())
        .await;
    let proposed = std::fs::read_to_string(&file)
        .expect("read a.rs")
        .replace(old, new);
    ed.accept(&file, &tab, "").await;
    eventually(
        "Copilot CLI wrote the edit accepted in claudecode.nvim",
        || (std::fs::read_to_string(&file).ok()? == proposed).then_some(()),
    )
    .await;
    // The turn goes on with the edit's outcome: wait for that request before `/ide`.
    model.next_tool_outcome().await;

    ide_list_shows(&tui, &ide_name, &[], &folder).await;
    tui.quit().await;
    b.stop().await;
}
