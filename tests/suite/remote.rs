//! Agents elsewhere: a session that says `remote=<name>` has its cwd and every path and file
//! URI that crosses the broker mapped both ways; other uids only when listed in `allow_uids`.
//! (The transport here is the socket itself, as a bind mount or an `ssh -R` forward delivers
//! it; no sshd is started.)

use crate::common::*;
use pi_ide_broker::protocol::pathmap::RemoteConfig;
use pi_ide_broker::testkit::fake_editor::{next_answer, next_tool_call};
use pi_ide_broker::testkit::text;
use serde_json::{json, Value};

#[tokio::test]
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
    let att = a.attached().await;
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
        .call(
            "getDiagnostics",
            json!({"uri": "file:///workspaces/app/my%20file.rs"}),
        )
        .await;
    // What the editor was asked for: the host's path (the fake answers with the uri it was
    // sent, so the answer alone would pass without any mapping at all).
    let args = next_tool_call(&mut ev, "getDiagnostics").await;
    assert_eq!(
        args["uri"],
        format!("file://{}/my%20file.rs", host_s.replace(' ', "%20")),
        "the editor must see the host's uri"
    );
    let body: Value = serde_json::from_str(text(&r)).unwrap();
    assert!(
        body.get("file:///workspaces/app/my%20file.rs").is_some(),
        "the answer comes back in the agent's spelling: {body}"
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
    next_answer(&mut ev2, "the answer").await;

    // An unknown remote is refused with the fix.
    let bad = Agent::connect_raw(&b.socket, "cwd=/workspaces/app&remote=nope").await;
    assert!(bad.err().is_some_and(|e| e.contains("400")));
    b.stop().await;
}

#[tokio::test]
async fn other_uids_get_in_only_when_listed() {
    if !crate::common::process::other_uid_or_skip("allow_uids test").await {
        return;
    }
    for (allow, want_answer) in [(vec![], false), (vec![65534u32], true)] {
        let b = TestBroker::start_with(|c| c.allow_uids = allow.clone()).await;
        // A bind mount or an ssh forward hands the socket to the other uid: open the path.
        crate::common::process::expose_socket(&b.socket, b.dir.path(), true);
        let got = crate::common::process::probe_as_nobody(&b.socket)
            .await
            .unwrap_or_default();
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

/// A real OpenSSH server (in inetd mode, as ssh's ProxyCommand), with throwaway keys, and an `ssh -R`
/// streamlocal forward of the broker's socket to another path: the agent's socket "on the
/// dev box". Returns `None` (after saying why) where sshd cannot run at all.
pub(crate) struct SshForward {
    /// Its server is its ProxyCommand's child: both end when it is killed.
    _ssh: tokio::process::Child,
    /// The forwarded socket, on the "remote" side.
    pub(crate) remote: std::path::PathBuf,
}

async fn ssh_forward(dir: &std::path::Path, local: &std::path::Path) -> Option<SshForward> {
    ssh_forward_as(dir, local, "ssh").await
}

/// [`ssh_forward`], run as `program` (`slogin`: OpenSSH's client under another name).
pub(crate) async fn ssh_forward_as(
    dir: &std::path::Path,
    local: &std::path::Path,
    program: &str,
) -> Option<SshForward> {
    let sshd = std::path::Path::new("/usr/sbin/sshd");
    let have = |c: &str| std::process::Command::new(c).arg("-V").output().is_ok();
    if !sshd.exists() || !have("ssh") || !rustix::process::getuid().is_root() {
        crate::common::cannot_run("ssh test: needs /usr/sbin/sshd, ssh and root (bash .ci/run installs openssh-server and openssh-client)");
        return None;
    }
    for key in ["host_key", "user_key"] {
        let ok = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(dir.join(key))
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "ssh-keygen failed");
    }
    std::fs::copy(dir.join("user_key.pub"), dir.join("authorized_keys")).unwrap();
    // No port: ssh runs the server itself, in inetd mode on its ProxyCommand's pipes.
    let cfg = dir.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "HostKey {d}/host_key\nAuthorizedKeysFile {d}/authorized_keys\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n\
             PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nAllowStreamLocalForwarding yes\n\
             StreamLocalBindUnlink yes\nLogLevel ERROR\n",
            d = dir.display()
        ),
    )
    .unwrap();
    let _ = std::fs::create_dir_all("/run/sshd");
    let proxy = format!("ProxyCommand={} -i -e -f {}", sshd.display(), cfg.display());
    let remote = dir.join("devbox.sock");
    let ssh = tokio::process::Command::new(program)
        .args([
            "-N",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
        ])
        .args([
            "-o",
            "BatchMode=yes",
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "LogLevel=ERROR",
        ])
        .args(["-o", &proxy])
        .arg("-i")
        .arg(dir.join("user_key"))
        .arg("-R")
        .arg(format!("{}:{}", remote.display(), local.display()))
        .arg("root@127.0.0.1")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start ssh");
    let mut ssh = ssh;
    crate::common::process::capture_stderr(&mut ssh, "ssh");
    pi_ide_broker::testkit::eventually("the forwarded socket", || remote.exists().then_some(()))
        .await;
    Some(SshForward { _ssh: ssh, remote })
}

/// Through a real `ssh -R` forward of the remote's own socket (what `pi-ide-broker remote`
/// prints): an agent whose cwd exists only on the "dev box" side is routed to the host
/// folder's editor, its openDiff reaches the editor with host paths, and the editor's
/// selection reaches it with its own paths; its remote is the socket's, unsaid. The main
/// socket forwarded the same way gives an agent's rights only (ssh forwards it).
#[tokio::test]
async fn an_agent_over_ssh_reaches_the_hosts_editor_with_mapped_paths() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let host = root.join("src/app");
    std::fs::create_dir_all(&host).unwrap();
    let ssh_dir = root.join("ssh");
    std::fs::create_dir_all(&ssh_dir).unwrap();
    let host_s = host.display().to_string();
    let h = host_s.clone();
    let b = TestBroker::start_in(dir, move |c| {
        c.remote = vec![RemoteConfig {
            name: "devbox".into(),
            agent: "/home/dev/app".into(),
            host: h.clone().into(),
        }];
    })
    .await;
    let remote_sock = pi_ide_broker::sys::config::Config::remote_socket(&b.socket, "devbox");
    let Some(fwd) = ssh_forward(&ssh_dir, &remote_sock).await else {
        return;
    };
    let (fe, id) = b.editor(&[&host_s]).await;
    let mut ev = fe.events();
    let mut a = Agent::connect(&fwd.remote, "cwd=/home/dev/app/src&session=ssh")
        .await
        .expect("a session through the ssh forward");
    let att = a.attached().await;
    assert_eq!(att["params"]["editor"], id.as_str());
    a.call_tool(
        json!("d"),
        "openDiff",
        pi_ide_broker::testkit::diff_args("/home/dev/app/src/main.rs", "fn main() {}\n", "ssh-tab"),
    )
    .await;
    let args = next_tool_call(&mut ev, "openDiff").await;
    assert_eq!(args["old_file_path"], format!("{host_s}/src/main.rs"));
    assert!(fe.reject_diff("ssh-tab"));
    let r = a.answer(&json!("d")).await;
    assert_eq!(text(&r), "DIFF_REJECTED");
    assert_eq!(r["result"]["content"][1]["text"], "ssh-tab");
    fe.select(&format!("{host_s}/src/main.rs"), "fn main", 0);
    let sel = a
        .until("selection", |v| v["method"] == "selection_changed")
        .await;
    assert_eq!(sel["params"]["filePath"], "/home/dev/app/src/main.rs");
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["remote"], "devbox", "{st}");
    drop(fwd);

    // The main socket over ssh: the forwarder is ssh, so an agent's rights.
    let main_dir = root.join("ssh-main");
    std::fs::create_dir_all(&main_dir).unwrap();
    let Some(fwd) = ssh_forward(&main_dir, &b.socket).await else {
        return;
    };
    let st = pi_ide_broker::frontdoor::client::get_json(&fwd.remote, "/v1/status")
        .await
        .expect("status through the forward");
    assert_eq!(st["connection"]["rights"], "agent", "{st}");
    assert!(
        st["connection"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("ssh")),
        "{st}"
    );
    assert_eq!(
        st["sessions"],
        json!([]),
        "the host's sessions are hidden: {st}"
    );
    let refused =
        pi_ide_broker::frontdoor::client::get_json(&fwd.remote, "/v1/pi-sessions?cwd=/").await;
    assert!(
        matches!(
            refused,
            Err(pi_ide_broker::frontdoor::client::ClientError::Refused(_))
        ),
        "{refused:?}"
    );
    drop(fwd);
    b.stop().await;
}
