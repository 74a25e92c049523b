//! The attacks of issue 61, each done the way it was done, against the real daemon: a
//! container that floods the socket and races a recycled pid, a remote agent that tries to
//! become the owner's followed thread, another user squatting the socket's dir, a symlink out
//! of a remote's folder, `ssh -R` run as `slogin`, and a compat token used for another editor.
//! (The memory flood is `hostile::`'s, the lockfile whose port is another user's is
//! `hostile::`'s too.) Each test fails with its fix reverted; docs/security.md names them.
//! They need root (a second uid, `unshare`, `ns_last_pid`): `bash .ci/run` runs as root.

use crate::common::process::{broker_bin, isolate, write_config, Proc};
use crate::common::*;
use crate::trust::{acp, acp_error, follow, get};
use pi_ide_broker::protocol::pathmap::RemoteConfig;
use pi_ide_broker::sys::config::Config;
use pi_ide_broker::testkit::agent::Agent;
use pi_ide_broker::testkit::pi_client::PiClient;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::Command;

/// Root, and the programs the attacks use; else says why (a failure under `.ci/run`).
fn can_attack(what: &str) -> bool {
    let have = |c: &str| {
        std::process::Command::new(c)
            .arg("--version")
            .output()
            .is_ok()
    };
    if !rustix::process::getuid().is_root() || !have("unshare") || !have("python3") {
        cannot_run(&format!(
            "{what}: needs root, unshare and python3 (bash .ci/run runs as root)"
        ));
        return false;
    }
    true
}

/// The attacker's script (`common/attacker.py`).
fn attacker() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/suite/common/attacker.py")
}

/// A line-driven child: its stdout read line by line, its stdin written.
struct Driven {
    child: tokio::process::Child,
    out: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Driven {
    fn spawn(cmd: &mut Command) -> Driven {
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn");
        let out = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        Driven { child, out }
    }

    async fn line(&mut self, what: &str) -> String {
        within(what, self.out.next_line())
            .await
            .expect("read")
            .unwrap_or_else(|| panic!("{what}: the child ended"))
    }

    async fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write");
    }
}

/// Whether a file named `name` is anywhere under `dir`.
fn has_file(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let p = e.path();
            e.file_name() == name || (p.is_dir() && !p.is_symlink() && has_file(&p, name))
        })
}

/// `key=<n>` out of a line such as `flood held=64 refused=336`.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

/// Attack 1: a container (`unshare --mount`) opens `/v1/events` connections until the daemon
/// would run out of descriptors (its hard limit set low, 256, as a busy machine's may be); a
/// child of another container connects, queues `GET /v1/pi-sessions`, exits, and its pid goes
/// to a process of the user; the flood then lets go of 100 connections. The flood meets its
/// realm's budget (refused with a reason, never an exhausted `accept`), the owner is served
/// throughout, and the queued connection is never the owner's.
#[tokio::test]
async fn a_flood_and_a_recycled_pid_leave_a_container_an_agent_and_the_owner_served() {
    if !can_attack("fd flood and pid race") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("root");
    let cfg = write_config(&root, "");
    let mut cmd = Command::new("prlimit");
    cmd.arg("--nofile=256:256")
        .arg(broker_bin())
        .arg("--config")
        .arg(&cfg)
        .arg("daemon")
        .env("RUST_LOG", "info")
        .env_remove("PI_IDE_BROKER_SOCKET");
    isolate(&mut cmd, &root);
    let mut daemon = Proc::spawn(&mut cmd);
    daemon.wait_line(&["pi-ide-broker ready"]).await;
    let socket = root.join("run/sock");
    let sock = socket.display().to_string();
    // The daemon's sockets (its other descriptors, watchers and pollers, come as its tasks
    // start).
    let pid = daemon.child.id().expect("the daemon's pid").to_string();
    let daemon_sockets = || crate::common::process::socket_inodes(&pid).len();
    // Its listeners: the socket, then Codex's hub, bound by its door after "ready".
    daemon.wait_line(&["codex hub: serving"]).await;
    let baseline = daemon_sockets();

    // The flood, from one container.
    let mut flood = Driven::spawn(
        Command::new("unshare")
            .args(["--mount", "--", "python3"])
            .arg(attacker())
            .args(["flood", &sock, "400"]),
    );
    let tally = flood.line("the flood's tally").await;
    let (held, refused, pending) = (
        field(&tally, "held"),
        field(&tally, "refused"),
        field(&tally, "pending"),
    );
    assert_eq!(
        pending, 0,
        "every connection answered, none left unaccepted: {tally}"
    );
    assert!(
        held > 0 && held <= 64,
        "one realm holds at most its share: {tally}"
    );
    assert!(
        refused >= 400 - 64,
        "the rest refused with a reason: {tally}"
    );
    // A refusal gives its descriptor back: the daemon holds its listeners and the realm's
    // share, not the flood.
    let given_back = || (daemon_sockets() <= baseline + held as usize).then_some(());
    pi_ide_broker::testkit::eventually("the refused connections' fds given back", given_back).await;
    // The owner is served meanwhile, as the owner.
    let st = within("the owner's status", get(&socket, "/v1/status"))
        .await
        .expect("the owner gets in");
    assert_eq!(st["connection"]["rights"], "owner", "{st}");

    // The race: a child connects and exits; its pid goes to a `sleep` of ours.
    let mut race = Driven::spawn(
        Command::new("unshare")
            .args(["--mount", "--", "python3"])
            .arg(attacker())
            .args(["race", &sock]),
    );
    let child = race.line("the racing child").await;
    let pid: u32 = child
        .strip_prefix("child ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{child:?}"));
    let mut recycled = None;
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).expect("ns_last_pid");
        let sleeper = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        if sleeper.id() == pid {
            recycled = Some(sleeper);
            break;
        }
        let mut s = sleeper;
        let _ = s.kill();
        let _ = s.wait();
    }
    let mut sleeper = recycled.expect("the child's pid given to a process of the user");
    flood.say("close 100").await;
    assert_eq!(flood.line("closed").await, "closed 100");
    race.say("read").await;
    let answer = race.line("the queued request's answer").await;
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(
        answer == "status 403" || answer == "status 503",
        "the queued connection must not be the owner's: {answer}"
    );
    flood.say("quit").await;
    daemon.signal(rustix::process::Signal::TERM);
    daemon.wait_exit().await;
}

/// Attack 2: a remote agent opens a pi-like session (`client=pi&protocol=2`) on its socket
/// and makes it the most recently active; the owner then opens an ACP thread in the host
/// folder. The thread never follows the agent's session (no owner's session there: "no pi
/// session"), the owner's list does not show it, and when the owner follows it by name the
/// agent's `broker/read` of the owner's files is refused and never reaches the owner's editor.
#[tokio::test]
async fn a_remote_agent_cannot_take_the_owners_acp_thread() {
    if !can_attack("remote hijack of an ACP thread") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("root");
    let host = root.join("src/app");
    std::fs::create_dir_all(&host).expect("mkdir");
    let h = host.clone();
    let b = TestBroker::start_in(dir, move |c| {
        c.remote = vec![RemoteConfig {
            name: "box".into(),
            agent: "/workspaces/app".into(),
            host: h,
        }];
    })
    .await;
    let host_s = host.display().to_string();
    let (_fe, _id) = b.editor(&[&host_s]).await;
    let remote = Config::remote_socket(&b.socket, "box");
    let mut evil = Agent::connect(
        &remote,
        "cwd=/workspaces/app&session=evil&client=pi&protocol=2",
    )
    .await
    .expect("the agent's session");
    evil.send_text(
        &json!({"jsonrpc": "2.0", "method": "pi/update", "params": {"update": {"n": 1}}})
            .to_string(),
    )
    .await;
    b.wait_status("the agent's session", |st| {
        st["sessions"]
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s["key"] == "remote:box/evil"))
    })
    .await;
    let list = get(
        &b.socket,
        &format!(
            "/v1/pi-sessions?cwd={}",
            pi_ide_broker::protocol::percent::encode_query(&host_s)
        ),
    )
    .await
    .expect("the owner lists");
    assert_eq!(
        list["sessions"],
        json!([]),
        "an agent's session is never listed: {list}"
    );
    let mut c = acp(&b, &b.socket, &[]).await;
    let why = acp_error(
        &mut c,
        "session/new",
        json!({"cwd": host_s, "mcpServers": []}),
    )
    .await;
    assert!(why.contains("no pi session"), "session/new: {why}");
    c.close().await;

    // Followed by name (the owner's explicit choice), its reads are still refused.
    let stream = tokio::net::UnixStream::connect(&b.socket)
        .await
        .expect("connect");
    let (mut follower, _) = within(
        "follow",
        tokio_tungstenite::client_async(
            "ws://localhost/v1/follow?session=remote%3Abox%2Fevil&buffers=1",
            stream,
        ),
    )
    .await
    .expect("the owner follows the agent's session by name");
    let secret = root.join("home/.ssh/id_ed25519").display().to_string();
    let r = evil
        .request(json!("r1"), "broker/read", json!({"path": secret}))
        .await;
    let why = r["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("agent") && why.contains("remote:box"), "{r}");
    evil.send_text(
        &json!({"jsonrpc": "2.0", "method": "pi/update", "params": {"update": {"n": 2}}})
            .to_string(),
    )
    .await;
    use futures_util::StreamExt;
    loop {
        let frame = within("the follower's next frame", follower.next())
            .await
            .expect("open")
            .expect("frame");
        let Ok(text) = frame.to_text() else { continue };
        let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
        assert_ne!(
            v["method"], "pi/read",
            "the follower was asked to read: {v}"
        );
        if v["method"] == "pi/update" && v["params"]["update"]["n"] == 2 {
            break;
        }
    }
    b.stop().await;
}

/// Attack 3: another user made the socket's dir in the shared temp dir (no
/// `XDG_RUNTIME_DIR`) and listens there with a 0777 socket. `status`, `acp` and `mcp` refuse
/// to speak to it, say what to do, start no daemon, and the squatter hears nothing.
#[tokio::test]
async fn a_squatted_socket_dir_is_refused_by_every_client() {
    if !can_attack("a squatted socket dir") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("root");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let shared = root.join("tmp");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    // Where a client of uid 0 without XDG_RUNTIME_DIR looks (as Config::socket_path says).
    let uid = rustix::process::getuid().as_raw();
    let squat = shared.join(format!("pi-ide-broker-{uid}"));
    let path = squat.join("sock");
    // Started as root, it becomes nobody before it touches anything.
    let script = "import os,socket,sys\nos.setgroups([]); os.setgid(65534); os.setuid(65534)\nd=os.path.dirname(sys.argv[1]); os.mkdir(d); os.chmod(d,0o777)\ns=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1],0o777); s.listen(8)\nprint('ready', flush=True)\nwhile True:\n  c,_=s.accept(); c.settimeout(2)\n  try: d=c.recv(65536)\n  except OSError: d=b''\n  print('got', len(d), flush=True)\n";
    let mut squatter = Driven::spawn(Command::new("python3").arg("-c").arg(script).arg(&path));
    assert_eq!(squatter.line("the squatter").await, "ready");
    let explicit = Path::new(&format!("/run/user/{uid}")).exists();
    let client = |args: &[&str]| {
        let mut cmd = Command::new(broker_bin());
        cmd.args(args)
            .env("TMPDIR", &shared)
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("PI_IDE_BROKER_SOCKET");
        if explicit {
            // This machine has a runtime dir for root: point at the squatted path instead.
            cmd.env("PI_IDE_BROKER_SOCKET", &path);
        }
        isolate(&mut cmd, &root);
        cmd
    };
    for args in [&["status"][..], &["mcp"][..]] {
        let out = within(
            "the client's refusal",
            client(args).stdin(std::process::Stdio::null()).output(),
        )
        .await
        .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains("uid 65534") && err.contains("XDG_RUNTIME_DIR"),
            "{args:?} says what is wrong and what to do: {err}"
        );
    }
    let mut cmd = client(&["acp"]);
    let mut c = pi_ide_broker::testkit::acp_client::AcpClient::spawn(&mut cmd);
    c.initialize(true, true).await;
    let why = acp_error(
        &mut c,
        "session/new",
        json!({"cwd": root.display().to_string(), "mcpServers": []}),
    )
    .await;
    assert!(why.contains("uid 65534"), "acp: {why}");
    c.close().await;
    assert!(
        !has_file(&root, "running.json") && !has_file(&root, "daemon.log"),
        "no daemon was started beside the squatter"
    );
    // Nothing reached it: had a client connected, it would have said `got <n>`.
    let _ = squatter.child.start_kill();
    let _ = squatter.child.wait().await;
    while let Ok(Some(line)) = squatter.out.next_line().await {
        assert!(!line.starts_with("got"), "the squatter was dialled: {line}");
    }
}

/// Attack 4: the agent links its folder to another on the host (`ln -s ~/src/secret
/// ~/src/app/esc`, which it can through its own mount) and opens a session in the link. It
/// is refused, saying where the link leads, and no session reaches the secret folder's
/// editor; a session in the folder itself still works.
#[tokio::test]
async fn a_symlink_out_of_a_remotes_folder_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("root");
    let (app, secret) = (root.join("src/app"), root.join("src/secret"));
    std::fs::create_dir_all(&app).expect("mkdir");
    std::fs::create_dir_all(&secret).expect("mkdir");
    std::os::unix::fs::symlink(&secret, app.join("esc")).expect("symlink");
    let a = app.clone();
    let b = TestBroker::start_in(dir, move |c| {
        c.remote = vec![RemoteConfig {
            name: "box".into(),
            agent: "/workspaces/app".into(),
            host: a,
        }];
    })
    .await;
    let (_app_editor, app_id) = b.editor(&[&app.display().to_string()]).await;
    let (_secret_editor, _) = b.editor(&[&secret.display().to_string()]).await;
    let remote = Config::remote_socket(&b.socket, "box");
    let why = Agent::connect_raw(&remote, "cwd=/workspaces/app/esc")
        .await
        .err()
        .expect("the link out is refused");
    assert!(
        why.contains("403") && why.contains(&secret.display().to_string()),
        "{why}"
    );
    let mut ok = Agent::connect(&remote, "cwd=/workspaces/app&session=k")
        .await
        .expect("its own folder");
    let att = ok.attached().await;
    assert_eq!(att["params"]["editor"], app_id.as_str());
    let st = b.status().await;
    let sessions = st["sessions"].as_array().cloned().unwrap_or_default();
    assert_eq!(sessions.len(), 1, "{st}");
    assert!(
        !st.to_string()
            .contains(&secret.display().to_string().replace('/', "\\/"))
            && sessions
                .iter()
                .all(|s| !s["host_cwd"].as_str().unwrap_or("").contains("secret")),
        "{st}"
    );
    b.stop().await;
}

/// Attack 5: the main socket forwarded by `ssh -R` run as `slogin` (Debian's other name for
/// the same client): the forwarder is told by its executable, so the forwarded connection is
/// an agent, not the owner.
#[tokio::test]
async fn ssh_run_as_slogin_is_a_forwarder() {
    if !Path::new("/usr/bin/slogin").exists() {
        cannot_run("slogin: needs openssh-client's /usr/bin/slogin (bash .ci/run installs it)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("root");
    let ssh_dir = root.join("ssh");
    std::fs::create_dir_all(&ssh_dir).expect("mkdir");
    let b = TestBroker::start_in(dir, |_| {}).await;
    let Some(fwd) = crate::remote::ssh_forward_as(&ssh_dir, &b.socket, "slogin").await else {
        return;
    };
    let st = get(&fwd.remote, "/v1/status")
        .await
        .expect("status through the forward");
    assert_eq!(st["connection"]["rights"], "agent", "{st}");
    assert!(
        st["connection"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("forwarded")),
        "{st}"
    );
    let why = get(&fwd.remote, "/v1/pi-sessions?cwd=/")
        .await
        .expect_err("a forwarded connection may not list the owner's sessions");
    assert!(why.contains("agent"), "{why}");
    let why = follow(&fwd.remote, "anything")
        .await
        .expect_err("nor follow");
    assert!(why.contains("403"), "{why}");
    drop(fwd);
    b.stop().await;
}

/// Attack 7: with one editor's compat token, `broker/attach {editor: <another>}` is refused
/// and the session's next call is still answered by its own editor.
#[tokio::test]
async fn a_compat_session_cannot_attach_to_another_editor() {
    let b = TestBroker::start().await;
    let (mine, mine_id) = b.editor(&["/home/u/mine"]).await;
    let (_other, other_id) = b.editor(&["/home/u/other"]).await;
    let cand = compat_entry(&b.dir.path().join("compat"), "/home/u/mine").await;
    let mut c = PiClient::connect(&cand).await.expect("compat session");
    let r = c
        .call("broker/attach", json!({"editor": other_id}))
        .await
        .expect("an answer");
    let why = r["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains(&mine_id) && why.contains("stays on it"), "{r}");
    let mut ev = mine.events();
    c.tool("getDiagnostics", json!({}))
        .await
        .expect("answered by its own editor");
    let _ = pi_ide_broker::testkit::fake_editor::next_tool_call(&mut ev, "getDiagnostics").await;
    let st = b.status().await;
    assert_eq!(st["sessions"][0]["editor"], mine_id.as_str(), "{st}");
    c.close().await;
    b.stop().await;
}
