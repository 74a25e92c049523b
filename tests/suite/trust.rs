//! Rights per connection (docs/security.md): a `[[remote]]`'s own socket, and a peer on the
//! main socket the broker can tell is not a local process of the user (another mount or pid
//! namespace, as in a container), get an agent's rights only: their own sessions on the editor
//! of their own folder, and nothing of the host's other sessions. Against a real pi (the fake
//! model) on the host; skipped where pi is not installed (`.ci/run` installs it).

use crate::acp_pi::{followed_pi_with, FollowedPi};
use crate::common::pi::Pi;
use crate::common::process::{broker_bin, isolate};
use crate::common::*;
use pi_ide_broker::frontdoor::client::{get_json, ClientError};
use pi_ide_broker::protocol::pathmap::RemoteConfig;
use pi_ide_broker::sys::config::Config;
use pi_ide_broker::testkit::acp_client::AcpClient;
use pi_ide_broker::testkit::fake_editor::next_tool_call;
use pi_ide_broker::testkit::{text, within};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use tokio::process::Command;

/// What the agent's side calls the project (it does not exist on this machine).
const AGENT_DIR: &str = "/workspaces/app";

/// `GET path` on `socket`: the document, or the broker's refusal (its reason).
pub(crate) async fn get(socket: &Path, path: &str) -> Result<Value, String> {
    match within(path, get_json(socket, path)).await {
        Ok(v) => Ok(v),
        Err(ClientError::Refused(why)) => Err(why),
        Err(e) => panic!("GET {path}: not a refusal but {e}"),
    }
}

/// Upgrades to `/v1/follow?session=key` on `socket`: `Ok` when the broker attached the
/// follower, else its refusal.
pub(crate) async fn follow(socket: &Path, key: &str) -> Result<(), String> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| e.to_string())?;
    let url = format!(
        "ws://localhost/v1/follow?session={}",
        pi_ide_broker::protocol::percent::encode_query(key)
    );
    match within(
        "follow upgrade",
        tokio_tungstenite::client_async(url, stream),
    )
    .await
    {
        Ok(_) => Ok(()),
        Err(e) => Err(pi_ide_broker::frontdoor::client::upgrade_refusal(&e)),
    }
}

/// `pi-ide-broker acp` on `socket`, initialized, optionally under `unshare ARGS…`.
pub(crate) async fn acp(b: &TestBroker, socket: &Path, unshare: &[&str]) -> AcpClient {
    let mut cmd = if unshare.is_empty() {
        Command::new(broker_bin())
    } else {
        let mut c = Command::new("unshare");
        c.args(unshare).arg("--").arg(broker_bin());
        c
    };
    cmd.arg("acp").env("PI_IDE_BROKER_SOCKET", socket);
    isolate(&mut cmd, b.dir.path());
    let mut c = AcpClient::spawn(&mut cmd);
    c.initialize(true, true).await;
    c
}

/// The error an ACP request got (it must fail).
pub(crate) async fn acp_error(c: &mut AcpClient, method: &str, params: Value) -> String {
    let id = c.request(method, params).await;
    let r = c.answer(&id).await;
    r["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{method} must be refused: {r}"))
        .to_string()
}

/// A broker with a real pi on the host in `proj`, `[[remote]] box` mapping `AGENT_DIR` to
/// `proj` (and `<root>/view`, a folder a second pi can run in, to `proj` too), and an editor
/// on `proj` and one on another folder.
struct Host {
    fp: FollowedPi,
    remote: PathBuf,
    editor: pi_ide_broker::testkit::fake_editor::FakeEditor,
    editor_id: String,
    /// The editor on another folder (kept running).
    _other: pi_ide_broker::testkit::fake_editor::FakeEditor,
    other_id: String,
    view: PathBuf,
}

async fn host() -> Option<Host> {
    let fp = followed_pi_with(|c, proj| {
        let view = proj.parent().unwrap_or(proj).join("view");
        c.remote = vec![
            RemoteConfig {
                name: "box".into(),
                agent: AGENT_DIR.into(),
                host: proj.to_path_buf(),
            },
            RemoteConfig {
                name: "box".into(),
                agent: view,
                host: proj.to_path_buf(),
            },
        ];
    })
    .await?;
    let proj = fp.proj.display().to_string();
    let (editor, editor_id) = fp.b.editor(&[&proj]).await;
    let other = fp.b.dir.path().join("elsewhere");
    std::fs::create_dir_all(&other).expect("mkdir");
    let (other_editor, other_id) = fp.b.editor(&[&other.display().to_string()]).await;
    let remote = Config::remote_socket(&fp.b.socket, "box");
    let view = fp.proj.parent().expect("parent").join("view");
    std::fs::create_dir_all(&view).expect("mkdir view");
    Some(Host {
        fp,
        remote,
        editor,
        editor_id,
        _other: other_editor,
        other_id,
        view,
    })
}

/// Through a remote's socket, each thing only the owner may do is refused with its reason
/// (listing pi sessions, following one, hence prompting and reviewing it, explaining routes,
/// the status of others), while the same asks on the main socket are served.
#[tokio::test(flavor = "current_thread")]
async fn a_remotes_socket_cannot_list_follow_prompt_or_see_the_hosts_sessions() {
    let Some(mut h) = host().await else { return };
    let before = h.fp.model.received().len();
    let (b, key, proj) = (&h.fp.b, &h.fp.key, &h.fp.proj);
    // The socket: 0600, in a 0700 dir of its own.
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&h.remote), 0o600);
    assert_eq!(mode(h.remote.parent().expect("dir")), 0o700);
    let cwd = pi_ide_broker::protocol::percent::encode_query(&proj.display().to_string());
    let list = format!("/v1/pi-sessions?cwd={cwd}");

    // Listing: the owner sees the host's pi session; the remote is told why not.
    let owner = get(&b.socket, &list).await.expect("the owner lists");
    assert_eq!(owner["sessions"][0]["session"], key.as_str(), "{owner}");
    let why = get(&h.remote, &list)
        .await
        .expect_err("a remote may not list");
    assert!(why.contains("agent") && why.contains("\"box\""), "{why}");

    // Following (the door to prompting and reviewing): the same.
    follow(&b.socket, key).await.expect("the owner follows");
    let why = follow(&h.remote, key)
        .await
        .expect_err("a remote may not follow");
    assert!(why.contains("403") && why.contains("following"), "{why}");
    let why = get(&h.remote, &format!("/v1/route?cwd={cwd}"))
        .await
        .expect_err("a remote may not explain routes");
    assert!(why.contains("routes"), "{why}");

    // What an ACP editor on the remote's side meets: every step refused, with the reason.
    let mut c = acp(b, &h.remote, &[]).await;
    let why = acp_error(&mut c, "session/list", json!({"cwd": AGENT_DIR})).await;
    assert!(why.contains("agent"), "session/list: {why}");
    let why = acp_error(
        &mut c,
        "session/new",
        json!({"cwd": AGENT_DIR, "mcpServers": []}),
    )
    .await;
    assert!(why.contains("agent"), "session/new: {why}");
    let why = acp_error(
        &mut c,
        "session/prompt",
        json!({"sessionId": key, "prompt": [{"type": "text", "text": "Call the tool bash"}]}),
    )
    .await;
    assert!(!why.is_empty(), "session/prompt: {why}");
    c.close().await;

    // Status: its own realm only, and it is told why.
    let st = get(&h.remote, "/v1/status").await.expect("status");
    assert_eq!(st["connection"]["rights"], "agent", "{st}");
    assert_eq!(
        st["sessions"],
        json!([]),
        "the host's pi session is hidden: {st}"
    );
    assert_eq!(st["editors"], json!([]), "and the host's editors: {st}");
    let owner = get(&b.socket, "/v1/status").await.expect("status");
    assert_eq!(owner["connection"]["rights"], "owner");
    assert_eq!(owner["sessions"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        owner["broker"]["remote_sockets"][0]["path"],
        json!(h.remote)
    );
    assert_eq!(
        h.fp.model.received().len(),
        before,
        "nothing the remote sent reached the host's model"
    );
    h.fp.b.stop().await;
}

/// The remote agent's own session works through its socket: routed by its mapped cwd to the
/// editor of that folder, tools listed, diagnostics and a diff relayed with paths mapped; it
/// may not attach to another folder's editor, its keys are its own (the host pi's key names
/// a different session there), a cwd outside the remote's folders reaches nothing, and a
/// `remote=` that is not the socket's is refused. The owner may follow a pi session that came
/// in through the remote socket.
#[tokio::test(flavor = "current_thread")]
async fn a_remote_agents_own_session_works_on_its_folders_editor_and_nowhere_else() {
    let Some(h) = host().await else { return };
    let (b, key) = (&h.fp.b, &h.fp.key);
    let mut ev = h.editor.events();
    let q = format!(
        "cwd={AGENT_DIR}/src&session={}",
        pi_ide_broker::protocol::percent::encode_query(key)
    );
    let mut a = Agent::connect(&h.remote, &q)
        .await
        .expect("a remote session");
    let att = a.attached().await;
    assert_eq!(att["params"]["editor"], h.editor_id.as_str(), "{att}");
    let tools = a.request(json!("t"), "tools/list", json!({})).await;
    assert!(
        tools["result"]["tools"]
            .as_array()
            .is_some_and(|t| !t.is_empty()),
        "{tools}"
    );
    let host_s = h.fp.proj.display().to_string();
    let r = a
        .call(
            "getDiagnostics",
            json!({"uri": format!("file://{AGENT_DIR}/src/a.rs")}),
        )
        .await;
    let args = next_tool_call(&mut ev, "getDiagnostics").await;
    assert_eq!(args["uri"], format!("file://{host_s}/src/a.rs"));
    assert!(r.get("result").is_some(), "{r}");
    a.call_tool(
        json!("d"),
        "openDiff",
        pi_ide_broker::testkit::diff_args(&format!("{AGENT_DIR}/src/a.rs"), "x\n", "rt"),
    )
    .await;
    let args = next_tool_call(&mut ev, "openDiff").await;
    assert_eq!(args["new_file_path"], format!("{host_s}/src/a.rs"));
    assert!(h.editor.accept_diff("rt", "x\n"));
    assert_eq!(text(&a.answer(&json!("d")).await), "FILE_SAVED");

    // Another folder's editor: not listed, not attachable.
    let eds = a.request(json!("e"), "broker/editors", json!({})).await;
    let ids: Vec<&str> = eds["result"]["editors"]
        .as_array()
        .map(|l| l.iter().filter_map(|e| e["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, vec![h.editor_id.as_str()], "{eds}");
    let r = a
        .request(json!("x"), "broker/attach", json!({"editor": h.other_id}))
        .await;
    let why = r["error"]["message"].as_str().unwrap_or_default();
    assert!(why.contains("its own folder"), "{r}");

    // Its key is its realm's: the host's pi session keeps its own, and the follow door still
    // finds the host's pi under it.
    let st = b.status().await;
    let remote_s = st["sessions"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["remote"] == "box"))
        .cloned()
        .expect("the remote session");
    assert_eq!(remote_s["key"], format!("remote:box/{key}"));
    assert_eq!(remote_s["origin"], "remote:box");
    let list = get(
        &b.socket,
        &format!(
            "/v1/pi-sessions?cwd={}",
            pi_ide_broker::protocol::percent::encode_query(&host_s)
        ),
    )
    .await
    .expect("list");
    assert_eq!(list["sessions"][0]["session"], key.as_str(), "{list}");
    // Its own status: its session, its editor.
    let mine = get(&h.remote, "/v1/status").await.expect("status");
    assert_eq!(mine["sessions"].as_array().map(Vec::len), Some(1), "{mine}");
    assert_eq!(mine["editors"][0]["id"], h.editor_id.as_str());

    // A cwd outside every folder of the remote, or another remote's name: refused, saying why.
    let why = Agent::connect_raw(&h.remote, "cwd=/etc")
        .await
        .err()
        .expect("an unmapped cwd is refused");
    assert!(
        why.contains("403") && why.contains("/workspaces/app"),
        "{why}"
    );
    let why = Agent::connect_raw(&h.remote, &format!("cwd={AGENT_DIR}&remote=other"))
        .await
        .err()
        .expect("another remote's name is refused");
    assert!(why.contains("403") && why.contains("\"box\""), "{why}");
    a.close().await;

    // A pi session in the "container" (through the remote socket, in a folder mapped to the
    // project): the owner follows it from the host by naming its key (it is never listed:
    // attacks::a_remote_agent_cannot_take_the_owners_acp_thread).
    let install = crate::common::pi::find_pi().expect("pi");
    let home = b.dir.path().join("pi-home");
    let mut inside = Pi::start(&install, &home, &h.view, &h.remote, &[]).await;
    let inner_key = inside.command("get_state", json!({})).await["data"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_string();
    let scoped = format!("remote:box/{inner_key}");
    b.wait_status("the container's pi session", |st| {
        st["sessions"]
            .as_array()
            .is_some_and(|l| l.iter().any(|s| s["key"] == scoped.as_str()))
    })
    .await;
    follow(&b.socket, &scoped)
        .await
        .expect("the owner follows the container's pi session");
    drop(inside);
    h.fp.b.stop().await;
}

/// A peer on the main socket in another mount namespace (`unshare --mount`, as a container's
/// processes are) or another pid namespace gets an agent's rights only: its status shows
/// none of the host's sessions and its ACP door cannot list them; the same commands outside
/// the namespace are the owner's. The owner's `status` and `doctor` then say what was seen.
#[tokio::test(flavor = "current_thread")]
async fn a_peer_in_another_namespace_is_an_agent_on_the_main_socket() {
    if !rustix::process::getuid().is_root() || !unshare_works() {
        crate::common::cannot_run(
            "namespace test: needs root and unshare (bash .ci/run runs as root)",
        );
        return;
    }
    let Some(fp) = followed_pi_with(|_, _| {}).await else {
        return;
    };
    let b = &fp.b;
    let status_json = |unshare: &'static [&'static str]| {
        let mut cmd = if unshare.is_empty() {
            Command::new(broker_bin())
        } else {
            let mut c = Command::new("unshare");
            c.args(unshare).arg("--").arg(broker_bin());
            c
        };
        cmd.args(["status", "--json"])
            .env("PI_IDE_BROKER_SOCKET", &b.socket)
            .env("HOME", b.dir.path().join("home"));
        async move {
            // The broker runs on this test's thread: the child is awaited, never blocked on.
            let out = within("status --json", cmd.output())
                .await
                .expect("run status");
            serde_json::from_slice::<Value>(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "status --json ({e}): {}",
                    String::from_utf8_lossy(&out.stdout)
                )
            })
        }
    };
    let owner = status_json(&[]).await;
    assert_eq!(owner["connection"]["rights"], "owner", "{owner}");
    assert_eq!(owner["sessions"].as_array().map(Vec::len), Some(1));
    for ns in [&["--mount"][..], &["--pid", "--fork"][..]] {
        let st = status_json(ns).await;
        assert_eq!(st["connection"]["rights"], "agent", "{ns:?}: {st}");
        assert!(
            st["connection"]["why"]
                .as_str()
                .is_some_and(|w| w.contains("namespace")),
            "{st}"
        );
        assert_eq!(st["sessions"], json!([]), "{ns:?}: {st}");
    }
    let mut c = acp(b, &b.socket, &["--mount"]).await;
    let proj = fp.proj.display().to_string();
    let why = acp_error(&mut c, "session/list", json!({"cwd": proj})).await;
    assert!(
        why.contains("namespace") && why.contains("pi-ide-broker remote"),
        "{why}"
    );
    c.close().await;
    let mut c = acp(b, &b.socket, &[]).await;
    let id = c.request("session/list", json!({"cwd": proj})).await;
    let r = c.answer(&id).await;
    assert_eq!(
        r["result"]["sessions"][0]["sessionId"],
        fp.key.as_str(),
        "{r}"
    );
    c.close().await;

    // The owner is told, once per namespace, with what to do.
    let owner = status_json(&[]).await;
    let seen = owner["agents_on_main_socket"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        seen.iter().any(|s| s["realm"]
            .as_str()
            .is_some_and(|r| r.starts_with("container:mnt:"))),
        "{owner}"
    );
    let mut doctor = Command::new(broker_bin());
    doctor
        .arg("doctor")
        .env("PI_IDE_BROKER_SOCKET", &b.socket)
        .env("HOME", b.dir.path().join("home"));
    let out = within("doctor", doctor.output()).await.expect("run doctor");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("main socket") && said.contains("pi-ide-broker remote"),
        "doctor: {said}"
    );
    fp.b.stop().await;
}

/// True where `unshare --mount` runs (root, util-linux).
pub(crate) fn unshare_works() -> bool {
    std::process::Command::new("unshare")
        .args(["--mount", "true"])
        .status()
        .is_ok_and(|s| s.success())
}
