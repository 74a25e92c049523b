//! The real binary: `daemon`, `status`, exit codes, log lines, and secrets kept out of output.

use crate::common::process::*;
use pi_ide_broker::testkit::text;
use pi_ide_broker::testkit::within;
use rustix::process::Signal;
use serde_json::Value;

async fn run_cli(config: &std::path::Path, args: &[&str]) -> std::process::Output {
    let mut cmd = tokio::process::Command::new(broker_bin());
    cmd.arg("--config")
        .arg(config)
        .args(args)
        .env_remove("PI_IDE_BROKER_SOCKET");
    within("cli", cmd.output()).await.expect("run cli")
}

#[tokio::test]
async fn status_without_a_daemon_explains_and_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "");
    let out = run_cli(&cfg, &["status"]).await;
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not running") && err.contains("pi-ide-broker daemon"),
        "{err}"
    );
}

/// `reload` makes the running daemon read its config again (SIGHUP here; its reload event on
/// Windows, under wine in `windows::`): a changed file is taken, a broken one refused with the
/// running config kept and the daemon serving; with nothing running it says so and fails.
#[tokio::test]
async fn reload_makes_the_running_daemon_read_its_config_again() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let out = run_cli(&cfg, &["reload"]).await;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("asked the daemon"),
        "{out:?}"
    );
    daemon.wait_line(&["config reloaded"]).await;
    // The daemon's own file broken (the client reads a good copy to find the daemon).
    let good = std::fs::read_to_string(&cfg).unwrap();
    let client = root.join("client.toml");
    std::fs::write(&client, &good).unwrap();
    std::fs::write(&cfg, "colour = 1\n").unwrap();
    assert!(run_cli(&client, &["reload"]).await.status.success());
    daemon
        .wait_line(&["config reload failed; keeping the running config"])
        .await;
    std::fs::write(&cfg, good).unwrap();
    assert!(
        run_cli(&cfg, &["status"]).await.status.success(),
        "still serving"
    );
    assert!(run_cli(&cfg, &["stop"]).await.status.success());
    daemon.wait_exit().await;
    let out = run_cli(&cfg, &["reload"]).await;
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stdout).contains("nothing to reload"),
        "{out:?}"
    );
}

/// Who may ask the daemon to reload or stop: only its user. The requests are signals (named
/// events with the user's default DACL on Windows): another uid's SIGHUP and SIGTERM are
/// refused by the kernel, and the daemon neither reloads nor stops; its user's `reload` works.
#[tokio::test]
async fn another_uid_cannot_make_the_daemon_reload_or_stop() {
    if !other_uid_or_skip("another_uid_cannot_make_the_daemon_reload_or_stop").await {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let pid = daemon.child.id().expect("pid").to_string();
    for sig in ["-HUP", "-TERM"] {
        let out = tokio::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "kill",
                sig,
                &pid,
            ])
            .output();
        let out = within("kill as another uid", out).await.expect("setpriv");
        assert!(
            !out.status.success(),
            "uid 65534's kill {sig} went through: {out:?}"
        );
    }
    assert!(
        run_cli(&cfg, &["status"]).await.status.success(),
        "still serving"
    );
    assert!(run_cli(&cfg, &["reload"]).await.status.success());
    daemon.wait_line(&["config reloaded"]).await;
    let reloads = daemon
        .seen
        .iter()
        .filter(|l| l.contains("config reloaded"))
        .count();
    assert_eq!(reloads, 1, "only its user's reload: {:?}", daemon.seen);
    assert!(run_cli(&cfg, &["stop"]).await.status.success());
    daemon.wait_exit().await;
}

/// `stop` stops the daemon this machine runs, gracefully, and says so; with nothing running
/// it says there is nothing to stop; a daemon its own record does not name (a socket
/// forwarded from elsewhere reports a pid of another machine) is not signalled.
#[tokio::test]
async fn stop_stops_this_machines_daemon_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let record = root.join("state/running.json");
    let real = std::fs::read_to_string(&record).expect("running.json");
    // As if the socket led to another machine's daemon: its record names another pid.
    std::fs::write(&record, real.replace("\"pid\":", "\"pid\":1000000")).expect("rewrite");
    let out = run_cli(&cfg, &["stop"]).await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("runs elsewhere"),
        "{err}"
    );
    assert!(
        run_cli(&cfg, &["status"]).await.status.success(),
        "stop signalled a daemon it must not"
    );
    std::fs::write(&record, &real).expect("restore");
    let out = run_cli(&cfg, &["stop"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("stopped the daemon (pid"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let exit = daemon.wait_exit().await;
    assert!(
        exit.success(),
        "the daemon did not stop gracefully: {exit:?}"
    );
    assert!(
        daemon.seen.iter().any(|l| l.contains("stopped")),
        "{:?}",
        daemon.seen
    );
    let out = run_cli(&cfg, &["stop"]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("nothing to stop"),
        "{text}"
    );
}

#[tokio::test]
async fn a_bad_config_names_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[health]\ninterval_ms = -5\n").unwrap();
    let out = run_cli(&cfg, &["status"]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("interval_ms") && err.contains(cfg.to_str().unwrap()),
        "{err}"
    );
}

#[tokio::test]
async fn daemon_end_to_end_with_real_editor_processes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("pi-ide")).unwrap();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;

    // A malformed lockfile beside a good editor: one clear log line, the editor works.
    std::fs::write(
        root.join("pi-ide/45454.lock"),
        "{\"pid\": \"nope\", \"authToken\": 1}",
    )
    .unwrap();
    daemon.wait_line(&["ignoring lockfile", "45454.lock"]).await;
    let (mut editor, port) = start_editor(&root.join("pi-ide"), &["--folder", "/srv/proj"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let token = serde_json::from_str::<Value>(
        &std::fs::read_to_string(root.join(format!("pi-ide/{port}.lock"))).unwrap(),
    )
    .unwrap()["authToken"]
        .as_str()
        .unwrap()
        .to_string();

    // status --json: exactly the contract's shape.
    let out = run_cli(&cfg, &["status", "--json"]).await;
    assert!(out.status.success());
    let st: Value = serde_json::from_slice(&out.stdout).expect("status --json is JSON");
    for k in ["pid", "version", "socket", "uptime_s"] {
        assert!(st["broker"].get(k).is_some(), "broker.{k} missing");
    }
    let e = &st["editors"][0];
    for k in [
        "id",
        "ide_name",
        "family",
        "lockfile",
        "port",
        "pid",
        "workspace_folders",
        "state",
        "rtt_ms",
        "connected_since",
        "restarts",
        "tools",
    ] {
        assert!(e.get(k).is_some(), "editors[].{k} missing: {e}");
    }
    assert_eq!(e["port"], port);
    assert_eq!(e["state"], "ready");
    assert!(st["sessions"].is_array());
    let table = run_cli(&cfg, &["status"]).await;
    let table_text = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(
        table_text.contains("EDITOR") && table_text.contains(e["id"].as_str().unwrap()),
        "{table_text}"
    );

    // A second daemon is refused with the first one's pid, and its own exit status (a start
    // that lost a race, which the pi extension does not report as a broken setup).
    let second = run_cli(&cfg, &["daemon"]).await;
    assert_eq!(
        second.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let second_err = String::from_utf8_lossy(&second.stderr).to_string();
    let first_pid = daemon.child.id().unwrap();
    assert!(
        second_err.contains(&format!("already running (pid {first_pid})")),
        "{second_err}"
    );

    // The compat entries' tokens (the broker's own secrets) must not leak either.
    let compat_tokens: Vec<String> = pi_ide_broker::testkit::eventually("a compat entry", || {
        let tokens: Vec<String> = std::fs::read_dir(root.join("compat"))
            .ok()?
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".lock"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|t| serde_json::from_str::<Value>(&t).ok())
            .filter_map(|v| v["authToken"].as_str().map(String::from))
            .collect();
        (!tokens.is_empty()).then_some(tokens)
    })
    .await;

    // The editor crashes (SIGKILL): its lockfile stays, and the broker lets it go anyway.
    editor.signal(Signal::KILL);
    editor.wait_exit().await;
    assert!(
        root.join(format!("pi-ide/{port}.lock")).exists(),
        "the broker never deletes editors' lockfiles"
    );
    daemon.wait_line(&["editor gone"]).await;

    daemon.signal(Signal::TERM);
    let status = daemon.wait_exit().await;
    assert!(status.success(), "{status:?}");
    assert!(!root.join("run/sock").exists(), "socket removed on stop");
    assert!(
        root.join(format!("pi-ide/{port}.lock")).exists(),
        "still never deleted"
    );

    // Not one captured byte carries the token, at trace level.
    let all = format!(
        "{}\n{}\n{}\n{}\n{}",
        daemon.seen.join("\n"),
        String::from_utf8_lossy(&out.stdout),
        table_text,
        second_err,
        String::from_utf8_lossy(&second.stdout)
    );
    assert!(!all.contains(&token), "the auth token leaked into output");
    for t in &compat_tokens {
        assert!(
            !all.contains(t.as_str()),
            "a compat token leaked into output"
        );
    }
}

/// What a CLI people install ships with: a version that names its commit, completions and a
/// man page from the same definitions as `--help`.
#[test]
fn version_completions_and_man_page() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pi-ide-broker"))
            .args(args)
            .output()
            .expect("run");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let v = run(&["--version"]);
    assert!(
        v.starts_with(&format!("pi-ide-broker {} (", env!("CARGO_PKG_VERSION"))),
        "{v}"
    );
    for (shell, needle) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef pi-ide-broker"),
        ("fish", "complete -c pi-ide-broker"),
    ] {
        let script = run(&["completions", shell]);
        assert!(script.contains(needle), "{shell}: {script}");
        assert!(script.contains("doctor"), "{shell} completes subcommands");
    }
    let man = run(&["man"]);
    assert!(man.contains(".TH pi-ide-broker 1"), "{man}");
    assert!(man.contains("doctor"), "{man}");
}

/// At the default level the session and link spans are off (entering them on every poll cost
/// about 8 % of a call's instructions), so each line names its session and editor itself.
#[tokio::test]
async fn log_lines_at_the_default_level_name_their_session_and_editor() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon_logging(&cfg, None).await;
    let (_editor, port) = start_editor(&root.join("pi-ide"), &["--folder", "/srv/proj"]).await;
    let ready = daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let mut a = pi_ide_broker::testkit::agent::Agent::open(
        &root.join("run/sock"),
        "/srv/proj/src",
        Some("k1"),
    )
    .await;
    let attached = a.attached().await;
    let editor = attached["params"]["editor"].as_str().unwrap().to_string();
    assert!(ready.contains(&format!("editor={editor}")), "{ready}");
    let connected = daemon
        .wait_line(&["session connected", "cwd=/srv/proj/src"])
        .await;
    let session = connected
        .split_whitespace()
        .find(|w| w.starts_with("session="))
        .unwrap_or_else(|| panic!("no session id in {connected:?}"))
        .to_string();
    daemon
        .wait_line(&["session attached", &session, &format!("editor={editor}")])
        .await;
    a.close().await;
    daemon.wait_line(&["session closed", &session]).await;
    let spans: Vec<_> = daemon
        .seen
        .iter()
        .filter(|l| l.contains("session{") || l.contains("editor{"))
        .collect();
    assert!(spans.is_empty(), "span prefixes at info: {spans:?}");
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

/// 1 MiB calls pass through the daemon whole, one after another, on one session (the large
/// buffers `allocator` keeps for the next call are reused, never shared: each answer carries
/// its own call's payload). The page faults this saves are counted in `benches/` (memory).
#[tokio::test]
async fn megabyte_calls_pass_whole_one_after_another() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon_logging(&cfg, Some("info")).await;
    let (_editor, port) = start_editor(&root.join("pi-ide"), &["--folder", "/big"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let mut a =
        pi_ide_broker::testkit::agent::Agent::open(&root.join("run/sock"), "/big", None).await;
    a.attached().await;
    for i in 0..6 {
        // Each call's payload differs, so an answer built from a reused buffer shows.
        let pad = char::from(b'a' + i as u8).to_string().repeat(1 << 20);
        let r = a
            .call("echo", serde_json::json!({"i": i, "pad": pad}))
            .await;
        let text = text(&r);
        let echoed: Value = serde_json::from_str(text).expect("the echo's arguments");
        assert_eq!(echoed["i"], i, "call {i}");
        assert!(
            echoed["pad"] == pad.as_str(),
            "call {i}: the payload changed"
        );
    }
    a.close().await;
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

/// No token is ever written where a user or a log reader sees it: a compat client with a
/// wrong token is refused with a log line that names the refusal, not the token; `status`,
/// `doctor` (text and JSON) and the daemon's trace-level log never print the editor's token,
/// the compat door's or the wrong one.
#[tokio::test]
async fn tokens_are_never_printed_or_logged() {
    use pi_ide_broker::testkit::pi_client::PiClient;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "");
    let mut daemon = start_daemon(&cfg).await;
    let (_editor, port) = start_editor(&root.join("pi-ide"), &["--folder", "/tok"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let lock: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join(format!("pi-ide/{port}.lock"))).unwrap(),
    )
    .unwrap();
    let editor_token = lock["authToken"].as_str().unwrap().to_string();
    let compat = crate::common::compat_entry(&root.join("compat"), "/tok").await;
    let wrong = "wrong-token-0123456789abcdef";
    let refused = PiClient::connect_with(compat.port, "x-pi-ide-authorization", wrong, None).await;
    assert!(refused.is_err(), "a wrong token got in");
    daemon
        .wait_line(&["refused a compat connection with a wrong token"])
        .await;
    // The right token still works (the refusal cost nobody anything).
    let mut ok = PiClient::connect(&compat).await.expect("the right token");
    assert!(ok.call("initialize", serde_json::json!({})).await.is_ok());
    // The gemini door (and Qwen Code's lock file, which carries the same token): a request
    // with a wrong bearer token is refused and logged, without either token.
    let gemini = crate::common::gemini::one_discovery(&root.join("gemini"), "/tok").await;
    let wrong_bearer = "wrong-bearer-fedcba9876543210";
    let refusal = crate::common::gemini::initialize_request(
        gemini.port,
        &format!("127.0.0.1:{}", gemini.port),
        &format!("Authorization: Bearer {wrong_bearer}\r\n"),
    );
    assert_eq!(
        crate::common::gemini::raw_status(gemini.port, &refusal).await,
        401
    );
    daemon
        .wait_line(&["refused a gemini request with a wrong token"])
        .await;
    let secrets = [
        editor_token.as_str(),
        compat.token.as_str(),
        wrong,
        gemini.token.as_str(),
        wrong_bearer,
    ];
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["doctor", "--cwd", "/tok"],
        &["doctor", "--json", "--cwd", "/tok"],
    ] {
        let out = run_cli(&cfg, args).await;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            text.contains("/tok"),
            "{args:?} says nothing of the editor:\n{text}"
        );
        for s in secrets {
            assert!(!text.contains(s), "{args:?} printed a token:\n{text}");
        }
    }
    drop(ok);
    daemon.signal(Signal::TERM);
    assert!(daemon.wait_exit().await.success());
    let log = daemon.seen.join("\n");
    for s in secrets {
        assert!(!log.contains(s), "the daemon logged a token:\n{log}");
    }
}

/// `pi remove` deletes the binary a running daemon was started from (an upgrade replaces
/// it): the daemon notices, keeps serving while a diff is open in the editor, and stops
/// by itself once it is answered, saying why (issue 52).
#[tokio::test]
async fn a_daemon_whose_binary_is_removed_stops_once_nothing_is_pending() {
    use pi_ide_broker::testkit::agent::Agent;
    use pi_ide_broker::testkit::fake_editor::{FakeEditor, Options};
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let cfg = write_config(&root, "");
    let bin_dir = root.join("pkg");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let copy = bin_dir.join("pi-ide-broker");
    std::fs::copy(broker_bin(), &copy).expect("copy the binary");
    let mut cmd = tokio::process::Command::new(&copy);
    cmd.arg("--config")
        .arg(&cfg)
        .arg("daemon")
        .env("RUST_LOG", "info")
        .env_remove("PI_IDE_BROKER_SOCKET");
    isolate(&mut cmd, &root);
    let mut d = Proc::spawn(&mut cmd);
    d.wait_line(&["pi-ide-broker ready"]).await;
    let proj = root.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(root.join("pi-ide")).unwrap();
    let fe = FakeEditor::start_in(
        &root.join("pi-ide"),
        Options::pi(&[&proj.display().to_string()]),
    )
    .await
    .expect("editor");
    let mut a = Agent::open(&root.join("run/sock"), &proj.display().to_string(), None).await;
    a.attached().await;
    let file = proj.join("a.rs").display().to_string();
    a.call_tool(
        serde_json::json!("d"),
        "openDiff",
        pi_ide_broker::testkit::diff_args(&file, "new\n", "t"),
    )
    .await;
    pi_ide_broker::testkit::eventually("the diff open in the editor", || {
        fe.pending_diffs().contains(&"t".to_string()).then_some(())
    })
    .await;
    std::fs::remove_file(&copy).expect("remove the binary");
    d.wait_line(&["was removed", "stopping once no call is pending"])
        .await;
    assert!(
        d.child.try_wait().expect("try_wait").is_none(),
        "it must wait for the open diff"
    );
    assert!(fe.accept_diff("t", "new\n"));
    assert_eq!(text(&a.answer(&serde_json::json!("d")).await), "FILE_SAVED");
    // Not a success: the unit's Restart=on-failure starts the binary installed now.
    let status = d.wait_exit().await;
    assert_eq!(status.code(), Some(75), "{status:?}\n{}", d.seen.join("\n"));
    assert!(
        d.seen.iter().any(|l| l.contains("was removed: stopping")),
        "{}",
        d.seen.join("\n")
    );
}

/// `remote` hands out each `[[remote]]`'s own socket for Docker, devcontainers and `ssh -R`,
/// never the main one (issue 51); with no remote it says what to add and exits 2.
#[tokio::test]
async fn remote_prints_the_remotes_socket_never_the_main_one() {
    let dir = tempfile::tempdir().unwrap();
    let none = write_config(dir.path(), "");
    let out = run_cli(&none, &["remote"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no [[remote]]") && err.contains("name = \"box\""),
        "{err}"
    );
    let cfg = write_config(
        dir.path(),
        "[[remote]]\nname = \"box\"\nagent = \"/workspaces/app\"\nhost = \"/home/me/src/app\"\n",
    );
    let out = run_cli(&cfg, &["remote"]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let main = dir.path().join("run/sock").display().to_string();
    let own = dir.path().join("run/remote/box").display().to_string();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains(&main), "hands out the main socket: {line}");
    }
    assert!(
        text.contains(&format!("docker run -v {own}:/run/pi-ide-broker")),
        "{text}"
    );
    assert!(
        text.contains(&format!("ssh -R /tmp/pi-ide-broker.sock:{own}/sock")),
        "{text}"
    );
    let out = run_cli(&cfg, &["remote", "nope"]).await;
    assert_eq!(out.status.code(), Some(2));
}
