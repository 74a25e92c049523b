//! A broker in WSL and an editor on Windows, simulated on Linux: the Windows side's lockfile
//! written as Claude Code's IDE extensions write it there (`runningInWindows`, `C:\` folders,
//! a Windows pid that means nothing here) into the Windows profile as WSL mounts it, a real
//! editor server behind it, and the real daemon process told where the drives are mounted
//! and where the Windows profile is (what `/etc/wsl.conf` and `cmd.exe` tell it in WSL).

use crate::common::process::{broker_bin, isolate, Proc};
use crate::common::*;
use pi_ide_broker::testkit::fake_editor::{next_tool_call, FakeEditor, Options};
use pi_ide_broker::testkit::text;
use serde_json::{json, Value};
use tokio::process::Command;

/// The lockfile as the Windows side writes it, for the editor on `port` with `token`.
fn windows_lockfile(token: &str) -> String {
    json!({
        // A Windows pid: no process of this machine has it (`u32::MAX >> 1` is no Linux pid).
        "pid": 2_147_483_000u32,
        "workspaceFolders": [r"c:\Users\me\proj"],
        "ideName": "Visual Studio Code",
        "transport": "ws",
        "runningInWindows": true,
        "authToken": token,
    })
    .to_string()
}

#[tokio::test]
async fn a_windows_editor_is_reached_from_wsl_with_paths_mapped_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let mnt = root.join("mnt");
    let profile = mnt.join("c/Users/me");
    let proj = profile.join("proj");
    std::fs::create_dir_all(proj.join("src")).unwrap();
    let win_ide = profile.join(".claude/ide");
    std::fs::create_dir_all(&win_ide).unwrap();
    // No lock dirs configured: the Windows profile's are added because it is in WSL.
    let cfg = root.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "socket = \"{r}/run/sock\"\nstate_dir = \"{r}/state\"\n[compat]\nenabled = false\n[gemini]\nenabled = false\n",
            r = root.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(broker_bin());
    cmd.arg("--config")
        .arg(&cfg)
        .arg("daemon")
        .env("RUST_LOG", "debug");
    isolate(&mut cmd, &root)
        .env("WSL_DISTRO_NAME", "Ubuntu")
        .env("PI_IDE_BROKER_WSL_MOUNT_ROOT", &mnt)
        .env("PI_IDE_BROKER_WINDOWS_HOME", &profile)
        .env("PI_IDE_BROKER_WINDOWS_HOST", "127.0.0.1");
    let mut daemon = Proc::spawn(&mut cmd);
    daemon.wait_line(&["pi-ide-broker ready"]).await;
    let socket = root.join("run/sock");

    // The editor server, and its lockfile as Windows writes it.
    let fe = FakeEditor::start(Options::claudecode(&[])).await.unwrap();
    let mut ev = fe.events();
    let lock = win_ide.join(format!("{}.lock", fe.port));
    let written = windows_lockfile(fe.token());
    std::fs::write(&lock, &written).unwrap();

    // A session in the project as WSL sees it is routed to the Windows editor.
    let cwd = proj.join("src").display().to_string();
    let mut a = Agent::connect(&socket, &format!("cwd={cwd}&dialect=claude&session=w1"))
        .await
        .unwrap();
    let att = a.attached().await;
    assert_eq!(att["params"]["ide_name"], "Visual Studio Code");
    assert_eq!(
        att["params"]["workspace_folders"],
        json!([proj.display().to_string()]),
        "the editor's folders as this side sees them"
    );

    // Out: the editor sees Windows paths; file contents are never touched.
    let file = proj.join("src/a.rs").display().to_string();
    a.call_tool(
        json!(1),
        "openDiff",
        json!({"old_file_path": file, "new_file_path": file,
               "new_file_contents": format!("// {file}\n"), "tab_name": "t1"}),
    )
    .await;
    let args = next_tool_call(&mut ev, "openDiff").await;
    assert_eq!(args["old_file_path"], r"C:\Users\me\proj\src\a.rs");
    assert_eq!(args["new_file_path"], r"C:\Users\me\proj\src\a.rs");
    assert_eq!(args["new_file_contents"], format!("// {file}\n"));
    let tab = args["tab_name"].as_str().unwrap().to_string();
    assert!(fe.accept_diff(&tab, "saved\n"));
    let r = a.answer(&json!(1)).await;
    assert_eq!(r["result"]["content"][0]["text"], "FILE_SAVED");

    // In: the editor's selection, in Windows spelling, reaches the agent in WSL's.
    fe.select(r"C:\Users\me\proj\src\lib.rs", "", 3);
    let sel = a
        .until("selection", |v| v["method"] == "selection_changed")
        .await;
    assert_eq!(
        sel["params"]["filePath"],
        proj.join("src/lib.rs").display().to_string()
    );
    // A file URI goes out in the form VS Code writes, and an answer's JSON text holding one
    // comes back in WSL's (the fake's `echo` answers with the arguments it was sent).
    let uri = format!("file://{}/src/a%20b.rs", proj.display());
    let r = a.call("echo", json!({"uri": uri})).await;
    let asked = next_tool_call(&mut ev, "echo").await;
    assert_eq!(asked["uri"], "file:///C:/Users/me/proj/src/a%20b.rs");
    let body: Value = serde_json::from_str(text(&r)).unwrap();
    assert_eq!(body["uri"], uri.as_str(), "the answer in WSL's spelling");

    // The Windows side's file is never removed or rewritten from here, not even at stop.
    a.close().await;
    daemon.signal(rustix::process::Signal::TERM);
    assert!(daemon.wait_exit().await.success());
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), written);
}
