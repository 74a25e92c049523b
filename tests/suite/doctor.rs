//! `pi-ide-broker doctor` and the rejected lockfiles in `status --json`, against a real daemon
//! (in process) and real files, with the CLI run as a process.

use crate::common::process::{broker_bin, write_config};
use crate::common::*;
use pi_ide_broker::testkit::within;
use serde_json::Value;
use std::path::Path;
use tokio::process::Command;

/// Runs `doctor --json` with the test broker's config; returns (exit ok, report).
pub(crate) async fn doctor(root: &Path, cwd: &str, extra: &str) -> (bool, Value) {
    let cfg = write_config(root, extra);
    let out = within(
        "doctor",
        Command::new(broker_bin())
            .args([
                "--config",
                cfg.to_str().unwrap(),
                "doctor",
                "--json",
                "--cwd",
                cwd,
            ])
            .env_remove("PI_IDE_BROKER_SOCKET")
            .env_remove("PI_IDE_LOCK_DIR")
            .output(),
    )
    .await
    .expect("run doctor");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(
        report["ok"],
        out.status.success(),
        "exit status and ok agree"
    );
    (out.status.success(), report)
}

/// The check of `report` about `what`.
pub(crate) fn check<'a>(report: &'a Value, what: &str) -> &'a Value {
    report["checks"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["what"].as_str().is_some_and(|w| w.contains(what)))
        })
        .unwrap_or_else(|| panic!("no check about {what}: {report:#}"))
}

#[tokio::test]
async fn every_refused_lockfile_is_explained_in_status_and_doctor() {
    let b = TestBroker::start().await;
    let dir = b.pi_dir.clone();
    let me = std::process::id();
    // Stale: a pid that does not run.
    std::fs::write(
        dir.join("1001.lock"),
        r#"{"pid": 999999, "authToken": "0123456789abcdef"}"#,
    )
    .unwrap();
    // Bad JSON, with its line and column.
    std::fs::write(dir.join("1002.lock"), "{\"pid\": 12,\n  oops}").unwrap();
    // Too big.
    std::fs::write(dir.join("1003.lock"), vec![b' '; 70 * 1024]).unwrap();
    // A symlink.
    let target = b.dir.path().join("elsewhere.json");
    std::fs::write(
        &target,
        format!(r#"{{"pid": {me}, "authToken": "0123456789abcdef"}}"#),
    )
    .unwrap();
    std::os::unix::fs::symlink(&target, dir.join("1004.lock")).unwrap();
    // A recycled pid: a live process that started after the file was written.
    let recycled = dir.join("1005.lock");
    std::fs::write(
        &recycled,
        format!(r#"{{"pid": {me}, "authToken": "0123456789abcdef"}}"#),
    )
    .unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&recycled)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    // Not ours (only root can make one; elsewhere this part is said to be skipped).
    let root = rustix::process::getuid().is_root();
    if !root {
        crate::common::cannot_run("the foreign-owner lockfile: chown needs root");
    }
    let foreign = root.then(|| {
        let p = dir.join("1006.lock");
        std::fs::write(
            &p,
            format!(r#"{{"pid": {me}, "authToken": "0123456789abcdef"}}"#),
        )
        .unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        p
    });
    let expect = 5 + usize::from(foreign.is_some());
    let st = b
        .wait_status("every refused file in status", |st| {
            st["lockfiles_rejected"]
                .as_array()
                .is_some_and(|r| r.len() == expect)
        })
        .await;
    let reason = |port: u16| -> String {
        st["lockfiles_rejected"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| {
                r["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with(&format!("{port}.lock")))
            })
            .map(|r| r["reason"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    assert!(reason(1001).contains("not running"), "{}", reason(1001));
    assert!(reason(1002).contains("line 2 column"), "{}", reason(1002));
    assert!(reason(1003).contains("over the"), "{}", reason(1003));
    assert!(reason(1004).contains("symlink"), "{}", reason(1004));
    assert!(reason(1005).contains("recycled"), "{}", reason(1005));
    if foreign.is_some() {
        assert!(
            reason(1006).contains("owned by uid 65534"),
            "{}",
            reason(1006)
        );
    }
    // Port closed: a live pid (ours) but nothing listens on the port.
    let closed = FakeEditor::start(Options::pi(&["/closed"])).await.unwrap();
    let closed_port = closed.port;
    closed.write_lockfile(&dir).unwrap();
    b.wait_editor(closed_port, "ready").await;
    closed.crash().await;
    b.wait_editor(closed_port, "backoff").await;
    // Refused by now: held so no concurrent test's listener can open it again.
    let _held = hold_closed(closed_port).expect("the crashed editor's port is free to hold");
    // Token refused: the lockfile's token is not the editor's.
    let liar = FakeEditor::start(Options::pi(&["/liar"])).await.unwrap();
    let mut lie: Value = serde_json::from_str(&liar.lockfile_json()).unwrap();
    lie["authToken"] = "not-the-editors-token".into();
    std::fs::write(dir.join(format!("{}.lock", liar.port)), lie.to_string()).unwrap();
    b.wait_editor(liar.port, "backoff").await;

    let (ok, report) = doctor(b.dir.path(), "/nowhere", "").await;
    assert!(!ok, "refused lockfiles and no route: exit 1");
    let verdict = |port: u16| check(&report, &format!("{port}.lock")).clone();
    assert_eq!(verdict(1001)["level"], "warn", "a stale file is harmless");
    assert!(verdict(1001)["fix"].as_str().unwrap().contains("rm "));
    assert!(verdict(1002)["message"]
        .as_str()
        .unwrap()
        .contains("line 2 column"));
    assert_eq!(verdict(1002)["level"], "fail");
    assert!(verdict(1003)["message"]
        .as_str()
        .unwrap()
        .contains("over the"));
    assert!(verdict(1004)["message"]
        .as_str()
        .unwrap()
        .contains("symlink"));
    assert!(verdict(1005)["message"]
        .as_str()
        .unwrap()
        .contains("recycled"));
    if foreign.is_some() {
        assert!(verdict(1006)["fix"].as_str().unwrap().contains("chown"));
    }
    assert!(
        verdict(closed_port)["message"]
            .as_str()
            .unwrap()
            .contains("port")
            && verdict(closed_port)["message"]
                .as_str()
                .unwrap()
                .contains("closed"),
        "{}",
        verdict(closed_port)
    );
    assert!(
        verdict(liar.port)["message"]
            .as_str()
            .unwrap()
            .contains("token"),
        "{}",
        verdict(liar.port)
    );
    // The table says how many were ignored.
    let cfg = write_config(b.dir.path(), "");
    let out = Command::new(broker_bin())
        .args(["--config", cfg.to_str().unwrap(), "status"])
        .env_remove("PI_IDE_BROKER_SOCKET")
        .output()
        .await
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    // (The command named is the one this shell has: here, with no pi-ide-broker on PATH,
    // the binary's path.)
    assert!(
        table.contains(&format!("{expect} lockfiles ignored — run `"))
            && table.contains(" doctor`"),
        "{table}"
    );
    drop(liar);
    b.stop().await;
}

#[tokio::test]
async fn the_route_is_explained_nested_home_symlinked_and_ambiguous() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let proj = root.join("proj");
    let sub = proj.join("sub");
    std::fs::create_dir_all(sub.join("deep")).unwrap();
    let link = root.join("link-to-sub");
    std::os::unix::fs::symlink(&sub, &link).unwrap();
    let b = TestBroker::start_in(dir, |_| {}).await;
    let (_outer, outer_id) = b.editor(&[&proj.display().to_string()]).await;
    let (_inner, inner_id) = b.editor(&[&sub.display().to_string()]).await;
    // The broker's home (a dir of the test's own, never the real $HOME).
    let home = b
        .handle
        .registry()
        .config()
        .home
        .clone()
        .expect("the test broker's home");
    let (_home_ed, home_id) = b.editor(&[&home.display().to_string()]).await;

    // Nested: the deeper folder wins; both are listed, deepest first.
    let cwd = sub.join("deep").display().to_string();
    let (_, r) = doctor(b.dir.path(), &cwd, "").await;
    assert_eq!(r["route"]["decision"]["editor"], inner_id.as_str(), "{r:#}");
    let ids: Vec<&str> = r["route"]["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert_eq!(ids, vec![inner_id.as_str(), outer_id.as_str()], "{r:#}");
    assert!(r["route"]["candidates"][0]["why"][0]
        .as_str()
        .unwrap()
        .contains("contains the cwd"));

    // A symlinked cwd is resolved before matching.
    let (_, r) = doctor(b.dir.path(), &link.display().to_string(), "").await;
    assert_eq!(r["route"]["decision"]["editor"], inner_id.as_str(), "{r:#}");

    // $HOME opened as a workspace: a weak match, used only when nothing else matches.
    let elsewhere = home.join("pi-ide-broker-doctor-test-no-such-dir");
    let (ok, r) = doctor(b.dir.path(), &elsewhere.display().to_string(), "").await;
    assert_eq!(r["route"]["decision"]["editor"], home_id.as_str(), "{r:#}");
    assert!(r["route"]["candidates"][0]["why"][0]
        .as_str()
        .unwrap()
        .contains("weak match"));
    assert!(ok, "a healthy setup exits 0: {r:#}");

    // Two editors on the same folder, neither touched: ambiguous, with the command that settles it.
    let (_twin, _) = b.editor(&[&proj.display().to_string()]).await;
    let (ok, r) = doctor(b.dir.path(), &proj.display().to_string(), "").await;
    assert!(!ok);
    assert_eq!(
        r["route"]["decision"]["ambiguous"].as_array().map(Vec::len),
        Some(2),
        "{r:#}"
    );
    assert!(
        r["route"]["settle"].as_str().unwrap().contains("/ide"),
        "{r:#}"
    );
    b.stop().await;
}

#[tokio::test]
async fn doctor_exits_1_without_a_daemon_and_with_a_broken_config() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, r) = doctor(dir.path(), "/", "").await;
    assert!(!ok);
    assert_eq!(check(&r, "daemon")["level"], "fail");
    assert!(check(&r, "daemon")["fix"]
        .as_str()
        .unwrap()
        .contains("pi-ide-broker daemon"));
    // Which source shows a single-client editor's other client (issue 39).
    let one = check(&r, "single-client editors");
    assert_eq!(one["level"], "ok", "{one}");
    assert!(
        one["message"].as_str().unwrap().contains("/proc/net/tcp"),
        "{one}"
    );
    let (ok, r) = doctor(dir.path(), "/", "health = 12\n").await;
    assert!(!ok);
    let c = check(&r, "config");
    assert_eq!(c["level"], "fail");
    assert!(c["message"].as_str().unwrap().contains("health"), "{c}");
}

/// `status --watch` in a pipe: a line per change, as it happens, driven by `/v1/events`.
#[tokio::test]
async fn status_watch_prints_each_change_as_it_happens() {
    use crate::common::process::Proc;
    let b = TestBroker::start().await;
    let cfg = write_config(b.dir.path(), "");
    let mut cmd = Command::new(broker_bin());
    cmd.args(["--config", cfg.to_str().unwrap(), "status", "--watch"])
        .env_remove("PI_IDE_BROKER_SOCKET");
    let mut w = Proc::spawn(&mut cmd);
    w.wait_line(&["watching pi-ide-broker", "0 editors"]).await;
    let t0 = std::time::Instant::now();
    let fe = FakeEditor::start_in(&b.pi_dir, Options::pi(&["/watched"]))
        .await
        .unwrap();
    w.wait_line(&["editor", "appeared", &format!("port {}", fe.port)])
        .await;
    let appeared = t0.elapsed();
    w.wait_line(&["editor", "ready", &format!("port {}", fe.port)])
        .await;
    let t1 = std::time::Instant::now();
    let mut a = Agent::open(&b.socket, "/watched", None).await;
    a.attached().await;
    w.wait_line(&["session", "attached to"]).await;
    let attached = t1.elapsed();
    eprintln!(
        "status --watch: editor line {} ms after its lockfile, attach line {} ms after the connect",
        appeared.as_millis(),
        attached.as_millis()
    );
    a.close().await;
    w.wait_line(&["session", "closed"]).await;
    b.stop().await;
    // The daemon stopping ends the stream and the watch, with a word about it.
    assert!(w.wait_exit().await.success());
    assert!(
        w.seen.iter().any(|l| l == "pi-ide-broker stopped"),
        "{:?}",
        w.seen
    );
}

/// A client that opens `/v1/events` and never reads costs nothing and blocks nobody: the
/// daemon goes on answering, and the stalled client still gets the latest state later.
#[tokio::test]
async fn the_events_stream_survives_a_client_that_stops_reading() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/busy"]).await;
    let mut stalled = tokio::net::UnixStream::connect(&b.socket).await.unwrap();
    stalled
        .write_all(b"GET /v1/events HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Plenty of changes while it does not read.
    for i in 0..300 {
        let a = Agent::open(&b.socket, "/busy", Some(&format!("k{i}"))).await;
        a.close().await;
    }
    let st = b.status().await;
    assert_eq!(st["editors"].as_array().map(Vec::len), Some(1));
    // It reads now: the stream is alive and carries status lines.
    let mut buf = vec![0u8; 64 * 1024];
    let n = within("stalled client reads", stalled.read(&mut buf))
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(
        text.contains("200 OK") && text.contains("\"seq\""),
        "{text}"
    );
    // The first read could be the stream's opening event alone: the stream must still carry
    // what happens now, after the stall.
    let late = Agent::open(&b.socket, "/busy", Some("after-the-stall")).await;
    let mut seen = text.to_string();
    within("an event after the stall", async {
        while !seen.contains("after-the-stall") {
            let n = stalled.read(&mut buf).await.unwrap();
            assert!(n > 0, "the event stream ended");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
    .await;
    late.close().await;
    b.stop().await;
}

#[tokio::test]
async fn doctor_says_an_editor_without_a_token_uses_none() {
    let b = TestBroker::start().await;
    let (fe, _) = b.start_editor(Options::emacs(&["/el"])).await;
    let (ok, report) = doctor(b.dir.path(), "/el", "").await;
    let c = check(&report, &format!("{}.lock", fe.port));
    assert_eq!(c["level"], "ok", "{report:#}");
    assert!(
        c["message"]
            .as_str()
            .is_some_and(|d| d.contains("no token")),
        "{c:#}"
    );
    assert!(ok, "{report:#}");
    b.stop().await;
}
