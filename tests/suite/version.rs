//! The version rule on the native door: a session announcing another protocol revision than
//! the broker's gets one `broker/notice` naming the update, right after its handshake, and
//! its calls still work; the same revision gets none; `broker/attached` carries the broker's
//! version and revision, and `status` the client's.

use crate::common::*;
use pi_ide_broker::protocol::version::PROTOCOL;
use serde_json::{json, Value};

/// Connects announcing `protocol`, calls `echo`; the session, and every message up to its
/// answer.
async fn session_with(b: &TestBroker, protocol: u32) -> (Agent, Vec<Value>) {
    let q = format!(
        "cwd=/p&session=k{protocol}&client=test-client&client_version=9.9.9&protocol={protocol}"
    );
    let mut a = Agent::connect(&b.socket, &q).await.expect("connect");
    let mut seen = Vec::new();
    a.until("broker/attached", |v| {
        seen.push(v.clone());
        v["method"] == "broker/attached"
    })
    .await;
    a.call_tool(json!(7), "echo", json!({"x": 1})).await;
    let answer = a
        .until("the echo answer", |v| {
            seen.push(v.clone());
            v["id"] == 7 && v.get("method").is_none()
        })
        .await;
    assert!(answer.get("result").is_some(), "the call failed: {answer}");
    (a, seen)
}

fn notices(seen: &[Value]) -> Vec<String> {
    seen.iter()
        .filter(|v| v["method"] == "broker/notice")
        .map(|v| {
            v["params"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

#[tokio::test]
async fn a_newer_client_is_told_once_to_update_the_daemon_and_keeps_working() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/p"]).await;
    let (_a, seen) = session_with(&b, PROTOCOL + 1).await;
    let n = notices(&seen);
    assert_eq!(n.len(), 1, "{seen:?}");
    assert!(
        n[0].contains("update the daemon") && n[0].contains("cargo install --locked"),
        "{}",
        n[0]
    );
    assert!(n[0].contains("test-client 9.9.9"), "{}", n[0]);
    let att = seen
        .iter()
        .find(|v| v["method"] == "broker/attached")
        .expect("attached");
    assert_eq!(
        att["params"]["broker"],
        json!({"version": env!("CARGO_PKG_VERSION"), "protocol": PROTOCOL})
    );
    b.stop().await;
}

#[tokio::test]
async fn an_older_client_is_told_once_to_update_itself_and_keeps_working() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/p"]).await;
    let (_a, seen) = session_with(&b, PROTOCOL - 1).await;
    let n = notices(&seen);
    assert_eq!(n.len(), 1, "{seen:?}");
    assert!(
        n[0].contains("pi-ide-broker setup")
            && n[0].contains("older than the pi-ide-broker daemon"),
        "{}",
        n[0]
    );
    b.stop().await;
}

#[tokio::test]
async fn the_same_revision_gets_no_notice_and_status_names_the_client() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/p"]).await;
    let (_a, seen) = session_with(&b, PROTOCOL).await;
    assert!(notices(&seen).is_empty(), "{seen:?}");
    let st = b.status().await;
    let s = st["sessions"]
        .as_array()
        .and_then(|s| s.first())
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        s["client"],
        json!({"name": "test-client", "version": "9.9.9", "protocol": PROTOCOL})
    );
    b.stop().await;
}

#[tokio::test]
async fn a_protocol_that_is_not_a_number_is_refused_with_the_reason() {
    let b = TestBroker::start().await;
    let r =
        pi_ide_broker::testkit::agent::Agent::connect_raw(&b.socket, "cwd=/p&protocol=two").await;
    let err = r.err().unwrap_or_default();
    assert!(err.contains("400"), "{err}");
    b.stop().await;
}

/// The extension's own constants follow the crate's version and the broker's revision.
#[test]
fn the_extension_speaks_this_builds_version_and_revision() {
    let ts = std::fs::read_to_string(crate::common::pi::extension_dir().join("src/version.ts"))
        .expect("version.ts");
    assert!(
        ts.contains(&format!(
            "CLIENT_VERSION = \"{}\"",
            env!("CARGO_PKG_VERSION")
        )),
        "{ts}"
    );
    assert!(ts.contains(&format!("PROTOCOL = {PROTOCOL};")), "{ts}");
}

/// A copy of the extension that speaks protocol `revision` (its `node_modules` linked).
fn extension_speaking(dir: &std::path::Path, revision: u32) -> std::path::PathBuf {
    let src = crate::common::pi::extension_dir();
    let ext = dir.join("ext");
    std::fs::create_dir_all(ext.join("src")).expect("mkdir ext");
    for f in ["index.ts", "package.json"] {
        std::fs::copy(src.join(f), ext.join(f)).expect("copy");
    }
    for e in std::fs::read_dir(src.join("src")).expect("src") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, ext.join("src").join(p.file_name().expect("name"))).expect("copy");
    }
    std::os::unix::fs::symlink(src.join("node_modules"), ext.join("node_modules")).expect("link");
    let v = ext.join("src/version.ts");
    let text = std::fs::read_to_string(&v).expect("version.ts");
    let ours = format!("PROTOCOL = {PROTOCOL};");
    assert!(text.contains(&ours), "{text}");
    std::fs::write(&v, text.replace(&ours, &format!("PROTOCOL = {revision};"))).expect("write");
    ext
}

/// The real pi with an extension a revision ahead: one toast naming the daemon's update, the
/// session attached and working, and no second toast after a reconnect.
#[tokio::test]
async fn the_real_extension_shows_a_skew_once_and_keeps_working() {
    let Some(pi) = crate::common::pi::find_pi() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let ext = extension_speaking(dir.path(), PROTOCOL + 1);
    let model = crate::common::fake_model::FakeModel::start().await;
    let home = crate::common::pi::pi_home(dir.path(), &model.models_json());
    let broker_dir = tempfile::tempdir().expect("tempdir");
    let proj = std::fs::canonicalize(broker_dir.path()).expect("canonical");
    let mut broker = TestBroker::start_in(broker_dir, |_| {}).await;
    let (_ed, id) = broker.editor(&[&proj.display().to_string()]).await;
    let env = [
        (
            "PI_IDE_BROKER_SOCKET",
            broker.socket.clone().into_os_string(),
        ),
        ("PI_IDE_BROKER_NO_SPAWN", "1".into()),
    ];
    let env: Vec<(&str, &std::ffi::OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    let mut p = crate::common::pi::Pi::start_with_extension(&pi, &home, &proj, &env, &ext).await;
    p.toast(0, "update the daemon").await;
    p.toast(0, "Auto-connected to").await;
    let e = id.clone();
    broker
        .wait_status("the session attached", move |st| {
            st["sessions"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["editor"] == e.as_str() && s["client"]["protocol"] == PROTOCOL + 1)
            })
        })
        .await;
    let kept = broker.stop_keep_dir().await;
    broker = TestBroker::start_in(kept, |_| {}).await;
    p.toast(0, "Reconnected to").await;
    // The prompt's round trip comes after the new broker's notice would have.
    p.prompt("still here").await;
    let skews = p
        .log
        .iter()
        .filter(|v| {
            v["method"] == "notify"
                && v["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("update the daemon"))
        })
        .count();
    assert_eq!(skews, 1, "the skew was told {skews} times");
    p.quit().await;
    broker.stop().await;
}
