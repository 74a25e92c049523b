//! Who may use the copilot door's sockets (docs/security.md): a process of the user in other
//! namespaces (a container the socket is mounted into) gets an agent's rights only; another
//! uid is refused (`copilot::another_uid_is_refused_by_the_copilot_socket`).

use super::{broker, copilot_dir, lockfile, Copilot};
use crate::common::process::{example_bin, Proc};
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// `unix_relay` under `unshare ARGS`: a socket in `dir` whose connections reach `target` from
/// the relay's namespaces, as a container's do through a mounted socket.
async fn relay(dir: &Path, target: &Path, unshare: &[&str]) -> (Proc, PathBuf) {
    let listen = dir.join(format!("relay-{}.sock", unshare.join("")));
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(unshare)
        .arg("--")
        .arg(example_bin("unix_relay"))
        .arg(&listen)
        .arg(target);
    let mut p = Proc::spawn(&mut cmd);
    p.wait_line(&["ready"]).await;
    (p, listen)
}

/// The copilot session on editor `id` whose origin `origin` accepts, from the owner's status.
fn session<'a>(st: &'a Value, id: &str, origin: impl Fn(&Value) -> bool) -> Option<&'a Value> {
    st["sessions"]
        .as_array()?
        .iter()
        .find(|s| s["door"] == "copilot" && s["editor"] == id && origin(&s["origin"]))
}

/// A Copilot CLI in another mount namespace (`unshare --mount`, as a container's processes
/// are), or another pid namespace, that dials an editor's copilot socket gets an agent's
/// rights only: its session carries its realm (`container:…`), stays pinned to that editor
/// (its tools answer from there) and holds a place of the realm's connection budget, and the
/// socket serves nothing but MCP (no status, nothing only the owner may do). The same user's
/// process in the broker's own namespaces is the owner (no origin).
#[tokio::test]
async fn a_copilot_cli_in_another_namespace_gets_an_agents_rights_only() {
    if !rustix::process::getuid().is_root() || !crate::trust::unshare_works() {
        crate::common::cannot_run(
            "copilot namespace test: needs root and unshare (bash .ci/run runs as root)",
        );
        return;
    }
    let b = broker().await;
    let (fe, id) = b.editor(&["/c/ns"]).await;
    let (_, lock) = lockfile(&copilot_dir(&b), "/c/ns").await;
    let socket = PathBuf::from(lock["socketPath"].as_str().expect("socketPath"));

    let mut own = Copilot::new(&lock);
    own.initialize().await;
    let _own_events = own.stream().await;
    b.wait_status("the owner's copilot session", |st| {
        session(st, &id, Value::is_null).is_some()
    })
    .await;

    for ns in [&["--mount"][..], &["--pid", "--fork", "--kill-child"][..]] {
        let (relay, through) = relay(b.dir.path(), &socket, ns).await;
        let mut c = Copilot {
            socket: through,
            ..Copilot::new(&lock)
        };
        c.initialize().await;
        let mut events = c.stream().await;
        // `container:mnt:[…]` or `container:pid:[…]`, as the namespace it runs in.
        let kind = if ns[0] == "--mount" {
            "container:mnt:"
        } else {
            "container:pid:"
        };
        let mine = |o: &Value| o.as_str().is_some_and(|r| r.starts_with(kind));
        let st = b
            .wait_status("the namespaced copilot session", |st| {
                session(st, &id, mine).is_some()
            })
            .await;
        let realm = session(&st, &id, mine)
            .and_then(|s| s["origin"].as_str())
            .expect("its realm")
            .to_string();
        assert!(
            b.handle.registry().limits.agent_budget().held_by(&realm) >= 1,
            "{ns:?}: its connections count against the agents' budget"
        );
        // Its editor is the one its lockfile names: the selection made there reaches it.
        let file = format!("/c/ns/{}.rs", kind.trim_matches(':').replace(':', "-"));
        fe.select(&file, "x", 0);
        while events.next("selection_changed").await["filePath"] != file.as_str() {}
        let sel = c.tool(3, "get_selection", json!({})).await;
        assert_eq!(sel["filePath"], file.as_str(), "{ns:?}: {sel}");
        // Only MCP: no status document, no broker method, nothing of the owner's.
        let status = within(
            "GET /v1/status on the copilot socket",
            pi_ide_broker::frontdoor::client::get_json(&c.socket, "/v1/status"),
        )
        .await;
        assert!(status.is_err(), "{ns:?}: {status:?}");
        for (n, method) in [(4, "broker/editors"), (5, "broker/attach")] {
            let (code, v) = c.rpc(n, method, json!({"editor": "other"})).await;
            assert_eq!(
                (code, &v["error"]["code"]),
                (200, &json!(-32601)),
                "{ns:?}: {v}"
            );
        }
        drop(relay);
    }
    b.stop().await;
}
