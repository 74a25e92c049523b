//! Issue: a real user service — sd-notify, socket activation, reload, graceful stop, units.

use crate::common::process::*;
use crate::common::*;
use pi_ide_broker::testkit::fake_editor::next_tool_call;
use pi_ide_broker::testkit::pi_client::PiClient;
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::{eventually, within};
use rustix::process::Signal;
use serde_json::{json, Value};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;
use tokio::process::Command;

/// Receives sd-notify datagrams on a real socket.
struct NotifySocket {
    sock: UnixDatagram,
    path: std::path::PathBuf,
}

impl NotifySocket {
    fn new(dir: &std::path::Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(WAIT)).unwrap();
        NotifySocket { sock, path }
    }

    /// The next datagram (blocking, bounded by WAIT) — run on a blocking thread.
    async fn next(&self) -> String {
        let sock = self.sock.try_clone().unwrap();
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; 4096];
            let n = sock.recv(&mut buf).expect("a datagram within the bound");
            String::from_utf8_lossy(&buf[..n]).to_string()
        })
        .await
        .unwrap()
    }

    /// Datagrams until one contains `needle`; returns it.
    async fn until(&self, needle: &str) -> String {
        loop {
            let d = self.next().await;
            if d.contains(needle) {
                return d;
            }
        }
    }
}

#[tokio::test]
async fn notify_socket_sees_ready_status_watchdog_reload_and_stopping_in_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("pi-ide")).unwrap();
    let cfg = write_config(dir.path(), "");
    let ns = NotifySocket::new(dir.path());
    let mut cmd = Command::new(broker_bin());
    cmd.args(["--config", cfg.to_str().unwrap(), "daemon"])
        .env("NOTIFY_SOCKET", &ns.path)
        .env("WATCHDOG_USEC", "200000")
        .env_remove("WATCHDOG_PID")
        .env_remove("PI_IDE_BROKER_SOCKET");
    let mut daemon = Proc::spawn(&mut cmd);
    let ready = ns.until("READY=1").await;
    assert!(
        ready.contains("STATUS=0 editors ready, 0 sessions"),
        "{ready}"
    );
    // The socket is bound and the first scan done before READY.
    assert!(dir.path().join("run/sock").exists());
    ns.until("WATCHDOG=1").await;
    ns.until("WATCHDOG=1").await;
    // STATUS follows changes within a few seconds.
    let (_ed, _port) = start_editor(&dir.path().join("pi-ide"), &["--folder", "/s"]).await;
    ns.until("STATUS=1 editor ready, 0 sessions").await;
    daemon.signal(Signal::HUP);
    let reloading = ns.until("RELOADING=1").await;
    assert!(
        reloading.contains("MONOTONIC_USEC="),
        "one datagram: {reloading}"
    );
    ns.until("READY=1").await;
    daemon.signal(Signal::TERM);
    ns.until("STOPPING=1").await;
    assert!(daemon.wait_exit().await.success());
}

#[tokio::test]
async fn socket_activation_uses_the_inherited_listener() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let cfg = write_config(dir.path(), "");
    let sock = run.join("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    // Hand it over as fd 3 the way systemd does: clear close-on-exec, dup to 3, and set
    // LISTEN_PID to the pid that execs the daemon (the shell's, kept by `exec`).
    use std::os::fd::AsRawFd;
    let fd = listener.as_raw_fd();
    rustix::io::fcntl_setfd(&listener, rustix::io::FdFlags::empty()).unwrap();
    let script =
        format!("exec 3<&{fd}; LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" --config \"$1\" daemon");
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(script)
        .arg(broker_bin())
        .arg(&cfg)
        .env("RUST_LOG", "info")
        .env_remove("PI_IDE_BROKER_SOCKET");
    let mut daemon = Proc::spawn(&mut cmd);
    daemon
        .wait_line(&["using the socket passed by the service manager"])
        .await;
    daemon.wait_line(&["pi-ide-broker ready"]).await;
    let st = within(
        "status",
        pi_ide_broker::frontdoor::client::get_json(&sock, "/v1/status"),
    )
    .await
    .unwrap();
    assert_eq!(
        st["broker"]["pid"].as_u64(),
        daemon.child.id().map(u64::from)
    );
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
    // The socket is the service manager's (here, the test's listener): it is left in place,
    // and a client dialling it after the stop reaches it, which starts the daemon again.
    let dialled = std::os::unix::net::UnixStream::connect(&sock);
    assert!(
        dialled.is_ok(),
        "the service manager's socket after a stop: {dialled:?}"
    );
    drop(listener);
}

#[tokio::test]
async fn sighup_adds_a_lock_dir_and_a_broken_config_keeps_the_old_one() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let extra = root.join("extra-ide");
    let (_ed, port) = start_editor(&extra, &["--folder", "/e"]).await;
    // Not watched yet. Add it and reload.
    let text = std::fs::read_to_string(&cfg).unwrap()
        + &format!(
            "\n[[lock_dirs]]\npath = \"{}\"\nfamily = \"pi\"\n",
            extra.display()
        );
    std::fs::write(&cfg, text).unwrap();
    daemon.signal(Signal::HUP);
    daemon.wait_line(&["config reloaded"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    // A broken file: the exact error, and the daemon keeps serving on the old config.
    std::fs::write(&cfg, "[health]\ninterval_ms = \"often\"\n").unwrap();
    daemon.signal(Signal::HUP);
    let line = daemon.wait_line(&["config reload failed"]).await;
    assert!(
        line.contains("interval_ms") && line.contains("line 2"),
        "{line}"
    );
    let st = within(
        "status",
        pi_ide_broker::frontdoor::client::get_json(&root.join("run/sock"), "/v1/status"),
    )
    .await
    .unwrap();
    assert!(
        editor_by_port(&st, port).is_some(),
        "still serving with the old config"
    );
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

/// A daemon process on a config with `extra` at its top, and an in-process fake pi editor on
/// `/g` that it has linked to (in-process, so a test can watch what the editor receives).
async fn daemon_beside_editor(root: &std::path::Path, extra: &str) -> (Proc, FakeEditor) {
    std::fs::create_dir_all(root.join("pi-ide")).unwrap();
    let mut daemon = start_daemon(&write_config(root, extra)).await;
    let fe = FakeEditor::start_in(&root.join("pi-ide"), Options::pi(&["/g"]))
        .await
        .unwrap();
    daemon
        .wait_line(&["editor ready", &format!("port={}", fe.port)])
        .await;
    (daemon, fe)
}

#[tokio::test]
async fn sigterm_answers_pending_diffs_closes_them_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (mut daemon, fe) = daemon_beside_editor(root, "shutdown_timeout_ms = 3000").await;
    let mut ev = fe.events();
    let socket = root.join("run/sock");
    // A native session with a sticky key and a pending diff.
    let mut native = Agent::open(&socket, "/g", Some("keep-me")).await;
    native.attached().await;
    native
        .call_tool(
            json!(1),
            "openDiff",
            pi_ide_broker::testkit::diff_args("/g/a", "a", "native-tab"),
        )
        .await;
    // A compat (pi-ide-like) session with a pending diff.
    let compat_dir = root.join("compat");
    let cand = compat_entry(&compat_dir, "/g").await;
    let mut pi = PiClient::connect(&cand).await.unwrap();
    let pi_task =
        tokio::spawn(async move { pi.open_diff_raw("/g/b", "pi-write:compat-tab").await });
    eventually("both diffs pending", || {
        (fe.pending_diffs().len() == 2).then_some(())
    })
    .await;

    let started = std::time::Instant::now();
    daemon.signal(Signal::TERM);
    // Both the diff's answer and the detach notice arrive before the socket closes.
    let (mut ans, mut det) = (None, None);
    while ans.is_none() || det.is_none() {
        let v = native
            .next()
            .await
            .expect("socket closed before the diff's answer and the detach notice");
        if v["id"] == 1 {
            ans = Some(v);
        } else if v["method"] == "broker/detached" {
            det = Some(v);
        }
    }
    let (ans, det) = (ans.unwrap(), det.unwrap());
    assert_eq!(text(&ans), "DIFF_REJECTED");
    assert_eq!(ans["result"]["content"][1]["text"], "native-tab");
    // Marked undelivered: pi tells the model the broker stopped, not that the user rejected.
    let undelivered = |a: &Value| {
        a["result"]["_meta"]["pi-ide-broker/undelivered"]
            .as_str()
            .is_some_and(|why| !why.is_empty())
    };
    assert!(undelivered(&ans), "{ans:#}");
    assert!(det["params"]["reason"]
        .as_str()
        .unwrap()
        .contains("shutting down"));
    let pi_ans: Value = within("pi answer", pi_task)
        .await
        .unwrap()
        .expect("an answer, not a closed socket");
    assert_eq!(text(&pi_ans), "DIFF_REJECTED");
    assert_eq!(
        pi_ans["result"]["content"][1]["text"],
        "pi-write:compat-tab"
    );
    assert!(undelivered(&pi_ans), "{pi_ans:#}");
    let status = daemon.wait_exit().await;
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3) + Duration::from_secs(2),
        "within shutdown_timeout_ms (+ slack)"
    );
    // The editor was told to close both diffs.
    let mut closed = Vec::new();
    while closed.len() < 2 {
        let args = next_tool_call(&mut ev, "close_tab").await;
        closed.push(args["tab_name"].as_str().unwrap().to_string());
    }
    closed.sort();
    assert_eq!(closed, vec!["native-tab", "pi-write:compat-tab"]);
    assert!(fe.pending_diffs().is_empty());
    // State flushed, socket and virtual lockfiles gone.
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("state/state.json")).unwrap())
            .unwrap();
    assert!(state["sticky"]["keep-me"]["editor"].is_string());
    assert!(!socket.exists());
    assert_eq!(
        std::fs::read_dir(&compat_dir).unwrap().count(),
        0,
        "virtual lockfiles removed"
    );
}

/// An agent on the daemon in `root` with a diff (`tab`) pending in editor `fe`, then `fe`
/// frozen: a stop now waits on the link's drain of that diff's `close_tab`.
async fn frozen_on_a_diff(root: &std::path::Path, fe: &FakeEditor, tab: &str) -> Agent {
    let mut agent = Agent::open(&root.join("run/sock"), "/g", None).await;
    agent.attached().await;
    agent
        .call_tool(
            json!(1),
            "openDiff",
            pi_ide_broker::testkit::diff_args("/g/a", "a", tab),
        )
        .await;
    eventually("the diff pending in the editor", || {
        (fe.pending_diffs().len() == 1).then_some(())
    })
    .await;
    fe.freeze(true);
    agent
}

/// A link that owes the editor only an unanswered `close_tab` stops when its one-second drain
/// ends, not at its next health check: a frozen editor holds a shutdown no longer than that,
/// and the frame written before the link closed still reaches it.
#[tokio::test]
async fn a_frozen_editor_holds_a_shutdown_only_for_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The next health check a minute away and the stop limit at 9 s: only the drain's own
    // deadline can end the link within a few seconds.
    let (mut daemon, fe) = daemon_beside_editor(
        root,
        "shutdown_timeout_ms = 9000\n[health]\ninterval_ms = 60000",
    )
    .await;
    let mut ev = fe.events();
    let _agent = frozen_on_a_diff(root, &fe, "frozen-tab").await;

    let started = std::time::Instant::now();
    daemon.signal(Signal::TERM);
    let status = daemon.wait_exit().await;
    let took = started.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(
        !daemon
            .seen
            .iter()
            .any(|l| l.contains("did not stop in time")),
        "the link outlived the stop limit"
    );
    assert!(
        took < Duration::from_secs(5),
        "stopped after {took:?}: the drain's second should end the link"
    );
    // The close_tab was written before the link closed: it waits in the editor's socket.
    fe.freeze(false);
    let args = next_tool_call(&mut ev, "close_tab").await;
    assert_eq!(args["tab_name"], "frozen-tab");
}

/// A stopping daemon turns a new client away at once: its socket's path is gone from the
/// start of the stop (the listening socket itself stays open to the end, kept for a handover),
/// so a client dialling while a frozen editor holds the stop for its drain is told no daemon
/// runs, instead of waiting in the backlog of a daemon that will never accept it.
#[tokio::test]
async fn a_stopping_daemon_turns_new_clients_away_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (mut daemon, fe) = daemon_beside_editor(root, "[health]\ninterval_ms = 60000").await;
    let socket = root.join("run/sock");
    let _agent = frozen_on_a_diff(root, &fe, "held-tab").await;
    daemon.signal(Signal::TERM);
    daemon.wait_line(&["stopping"]).await;
    // Held there (the frozen editor holds its drain for a second; this, for as long as it takes).
    daemon.signal(Signal::STOP);
    let dialled = std::os::unix::net::UnixStream::connect(&socket);
    let running = daemon
        .child
        .try_wait()
        .expect("the daemon's status")
        .is_none();
    assert!(
        running,
        "the daemon ended before it could be dialled while stopping"
    );
    assert_eq!(
        dialled.as_ref().map_err(std::io::Error::kind).err(),
        Some(std::io::ErrorKind::NotFound),
        "a client dialling a stopping daemon: {dialled:?}"
    );
    assert!(
        !root.join("state/running.json").exists(),
        "the running record is gone too"
    );
    daemon.signal(Signal::CONT);
    fe.freeze(false);
    assert!(daemon.wait_exit().await.success());
}

#[test]
fn unit_files_verify_and_parse() {
    let dir = tempfile::tempdir().unwrap();
    let unit = pi_ide_broker::cli::service::unit(
        pi_ide_broker::cli::service::Manager::Systemd,
        &broker_bin(),
        Some(&dir.path().join("my config.toml")),
        dir.path(),
        dir.path(),
    );
    assert!(
        unit.content.contains(" --config \"") && unit.content.contains("my config.toml\" daemon"),
        "{}",
        unit.content
    );
    let svc = dir.path().join("pi-ide-broker.service");
    std::fs::write(&svc, &unit.content).unwrap();
    let sock = dir.path().join("pi-ide-broker.socket");
    std::fs::write(&sock, include_str!("../../systemd/pi-ide-broker.socket")).unwrap();
    match std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&svc)
        .arg(&sock)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "systemd-analyze verify: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) => crate::common::cannot_run(
            "systemd-analyze verify: systemd-analyze is not installed here",
        ),
    }
    let plist = pi_ide_broker::cli::service::unit(
        pi_ide_broker::cli::service::Manager::Launchd,
        &broker_bin(),
        Some(&dir.path().join("my config.toml")),
        dir.path(),
        dir.path(),
    );
    let p = dir.path().join("agent.plist");
    std::fs::write(&p, &plist.content).unwrap();
    match std::process::Command::new("python3").args(["-c", "import plistlib,sys; d=plistlib.load(open(sys.argv[1],'rb')); assert d['Label']=='dev.pi-ide-broker' and d['RunAtLoad'] and d['ProcessType']=='Interactive' and d['KeepAlive']=={'Crashed': True} and d['Umask']==0o077 and d['ProgramArguments'][1:3]==['--config', sys.argv[2]] and d['ProgramArguments'][3]=='daemon', d"]).arg(&p).arg(dir.path().join("my config.toml")).output() {
        Ok(out) => assert!(out.status.success(), "plist: {}", String::from_utf8_lossy(&out.stderr)),
        Err(_) => crate::common::cannot_run("plist parse: python3 is not installed here"),
    }
}

#[tokio::test]
async fn service_install_dry_run_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let out = within(
        "dry run",
        Command::new(broker_bin())
            .args(["service", "install", "--dry-run"])
            .env("HOME", dir.path())
            .env("XDG_CONFIG_HOME", dir.path().join("cfg"))
            .output(),
    )
    .await
    .unwrap();
    assert!(out.status.success());
    let text =
        String::from_utf8_lossy(&out.stdout).replace(&dir.path().display().to_string(), "$HOME");
    let bin = std::fs::canonicalize(broker_bin())
        .unwrap()
        .display()
        .to_string();
    let text = text.replace(&bin, "$BIN");
    let expected = format!(
        "would write $HOME/cfg/systemd/user/pi-ide-broker.service:\n{}\nwould run:\nsystemctl --user daemon-reload\nsystemctl --user enable --now pi-ide-broker.service\n",
        include_str!("../../systemd/pi-ide-broker.service").replace("%h/.cargo/bin/pi-ide-broker", "$BIN")
    );
    assert_eq!(text, expected);
    assert!(
        !dir.path().join("cfg/systemd").exists(),
        "a dry run writes nothing"
    );
}

/// `service --manager launchd install --dry-run` prints a plist that parses (Python's
/// plistlib, an independent reader) with the keys that keep it well-behaved under launchd.
#[tokio::test]
async fn launchd_dry_run_prints_a_plist_that_parses_with_umask_and_crash_only_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let out = within(
        "dry run",
        Command::new(broker_bin())
            .args(["service", "--manager", "launchd", "install", "--dry-run"])
            .env("HOME", dir.path())
            .output(),
    )
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let plist_path = dir
        .path()
        .join("Library/LaunchAgents/dev.pi-ide-broker.plist");
    let body = text
        .strip_prefix(&format!("would write {}:\n", plist_path.display()))
        .and_then(|rest| rest.split_once("\nwould run:\n"))
        .map(|(plist, _)| plist.to_string())
        .unwrap_or_else(|| panic!("unexpected dry run output:\n{text}"));
    let uid = rustix::process::getuid().as_raw();
    assert!(
        text.contains(&format!(
            "launchctl bootstrap gui/{uid} {}",
            plist_path.display()
        )) && text.contains(&format!("launchctl print gui/{uid}/dev.pi-ide-broker")),
        "the install is checked after it: {text}"
    );
    let p = dir.path().join("printed.plist");
    std::fs::write(&p, body).unwrap();
    let check = "import plistlib,sys; d=plistlib.load(open(sys.argv[1],'rb')); \
        assert d['Umask']==0o077 and d['KeepAlive']=={'Crashed': True} and d['ProgramArguments'][-1]=='daemon', d";
    let out = Command::new("python3")
        .args(["-c", check])
        .arg(&p)
        .output()
        .await
        .expect("python3 runs (CI installs it)");
    assert!(
        out.status.success(),
        "plist: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!plist_path.exists(), "a dry run writes nothing");
}

/// A `launchctl` that fails as it does over SSH (no GUI domain): the install says so, with
/// the fix, and exits non-zero instead of reporting success.
#[tokio::test]
async fn launchd_install_with_a_failing_launchctl_exits_non_zero_with_the_fix() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let calls = dir.path().join("calls");
    let fake = bin.join("launchctl");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\ncase \"$1\" in\n  bootout) exit 3 ;;\n  bootstrap) echo 'Bootstrap failed: 125: Domain does not support specified action' >&2; exit 125 ;;\nesac\nexit 0\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = within(
        "install",
        Command::new(broker_bin())
            .args(["service", "--manager", "launchd", "install"])
            .env("HOME", dir.path())
            .env("PATH", path)
            .output(),
    )
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("Domain does not support specified action")
            && err.contains("no GUI session")
            && err.contains("loads at your next login")
            && err.contains("launchctl bootstrap gui/"),
        "the failure and its fix: {err}"
    );
    let called = std::fs::read_to_string(&calls).unwrap();
    assert!(
        called.contains("bootout") && called.contains("bootstrap"),
        "{called}"
    );
    assert!(
        !called.contains("print"),
        "nothing after the failed step: {called}"
    );
    // The plist is written (launchd loads it at the next login), private to the user.
    assert!(dir
        .path()
        .join("Library/LaunchAgents/dev.pi-ide-broker.plist")
        .exists());
}
