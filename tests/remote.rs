//! Agents elsewhere: a session that says `remote=<name>` has its cwd and every path and file
//! URI that crosses the broker mapped both ways; other uids only when listed in `allow_uids`.
//! (The transport here is the socket itself, as a bind mount or an `ssh -R` forward delivers
//! it; no sshd is started.)

mod common;

use common::*;
use pi_ide_broker::pathmap::RemoteConfig;
use pi_ide_broker::testkit::fake_editor::{next_tool_call, wait_for, Event};
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_sessions_paths_are_mapped_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let host = std::fs::canonicalize(dir.path()).unwrap().join("src/app");
    std::fs::create_dir_all(&host).unwrap();
    let host_s = host.display().to_string();
    let h = host_s.clone();
    let b = TestBroker::start_in(dir, move |c| {
        c.remote = vec![RemoteConfig {
            name: "box".into(),
            agent: "/workspaces/app".into(),
            host: h.clone().into(),
        }];
    })
    .await;
    let (fe, id) = b.editor(&[&host_s]).await;
    let mut ev = fe.events();
    // The agent's cwd does not exist here; mapped, it is the editor's folder.
    let mut a = Agent::connect(&b.socket, "cwd=/workspaces/app/sub&remote=box&session=r1")
        .await
        .unwrap();
    let att = a
        .until("attached", |v| v["method"] == "broker/attached")
        .await;
    assert_eq!(att["params"]["editor"], id.as_str());
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["remote"], "box");
    assert_eq!(st["sessions"][0]["cwd"], "/workspaces/app/sub");
    assert_eq!(st["sessions"][0]["host_cwd"], format!("{host_s}/sub"));

    // openDiff reaches the editor with host paths; contents are never touched.
    a.call_tool(
        json!(1),
        "openDiff",
        json!({"old_file_path": "/workspaces/app/a.rs", "new_file_path": "/workspaces/app/a.rs",
               "new_file_contents": "// see /workspaces/app/b.rs\n", "tab_name": "t1"}),
    )
    .await;
    let args = next_tool_call(&mut ev, "openDiff").await;
    assert_eq!(args["old_file_path"], format!("{host_s}/a.rs"));
    assert_eq!(args["new_file_path"], format!("{host_s}/a.rs"));
    assert_eq!(args["new_file_contents"], "// see /workspaces/app/b.rs\n");
    assert!(fe.accept_diff("t1", "// see /workspaces/app/b.rs\n"));
    let r = a.answer(&json!(1)).await;
    assert_eq!(
        r["result"]["content"][1]["text"],
        "// see /workspaces/app/b.rs\n"
    );

    // getDiagnostics: the uri argument goes out as the host's, the result comes back as the agent's.
    let r = a
        .request(
            json!(2),
            "tools/call",
            json!({"name": "getDiagnostics", "arguments": {"uri": "file:///workspaces/app/my%20file.rs"}}),
        )
        .await;
    let body: Value =
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert!(
        body.get("file:///workspaces/app/my%20file.rs").is_some(),
        "{body}"
    );

    // The editor's selection reaches the agent with agent paths (replay and live).
    fe.select(&format!("{host_s}/src/lib.rs"), "", 3);
    let sel = a
        .until("selection", |v| v["method"] == "selection_changed")
        .await;
    assert_eq!(sel["params"]["filePath"], "/workspaces/app/src/lib.rs");
    // A path outside every prefix passes through unchanged.
    fe.select("/etc/hosts", "", 1);
    let sel = a
        .until("selection outside", |v| {
            v["method"] == "selection_changed" && v["params"]["filePath"] == "/etc/hosts"
        })
        .await;
    assert_eq!(sel["params"]["filePath"], "/etc/hosts");
    // Editor-initiated requests carry agent paths too.
    let mut ev2 = fe.events();
    fe.request_suggestions().unwrap();
    let req = a
        .until("getSuggestions", |v| v["method"] == "getSuggestions")
        .await;
    assert_eq!(
        req["params"]["filePath"], "/x.rs",
        "outside the prefix: unchanged"
    );
    a.send_text(
        &json!({"jsonrpc": "2.0", "id": req["id"], "result": {"suggestions": []}}).to_string(),
    )
    .await;
    wait_for(&mut ev2, "the answer", |e| {
        matches!(e, Event::Answered { .. })
    })
    .await;

    // An unknown remote is refused with the fix.
    let bad = Agent::connect_raw(&b.socket, "cwd=/workspaces/app&remote=nope").await;
    assert!(bad.err().is_some_and(|e| e.contains("400")));
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_uids_get_in_only_when_listed() {
    let probe = common::process::example_bin("connect_probe");
    let as_nobody = |path: std::path::PathBuf| {
        let probe = probe.clone();
        async move {
            let out = tokio::process::Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&probe)
                .arg(path)
                .output();
            let out = within("probe as another uid", out).await.ok()?;
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        }
    };
    let usable = rustix::process::getuid().as_raw() == 0
        && as_nobody("/nonexistent".into())
            .await
            .is_some_and(|o| o.starts_with("connect-failed"));
    if !usable {
        eprintln!("SKIPPED allow_uids test: needs root, setpriv, and a build dir other users can execute from");
        return;
    }
    for (allow, want_answer) in [(vec![], false), (vec![65534u32], true)] {
        let b = TestBroker::start_with(|c| c.allow_uids = allow.clone()).await;
        // A bind mount or an ssh forward hands the socket to the other uid: open the path.
        let opened: Vec<std::path::PathBuf> = b
            .socket
            .ancestors()
            .skip(1)
            .take_while(|p| p.starts_with(b.dir.path()))
            .map(|p| p.to_path_buf())
            .collect();
        for d in &opened {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o711)).unwrap();
        }
        std::fs::set_permissions(&b.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
        let got = as_nobody(b.socket.clone()).await.unwrap_or_default();
        if want_answer {
            assert!(got.starts_with("answered"), "listed uid: {got}");
            let st = b.status().await;
            assert_eq!(st["broker"]["allow_uids"], json!([65534]));
        } else {
            assert_eq!(got, "dropped", "unlisted uid");
        }
        b.stop().await;
    }
}
