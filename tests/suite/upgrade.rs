//! Issue 62: a session outlives an upgrade. The daemon's binary replaced under it, the daemon
//! starts the new one, hands it the listening socket and steps down: no dial is refused in
//! between, an open diff is still answered by the reviewer, and sessions (a native one, the
//! `mcp` door) are attached again by the successor.

use crate::common::process::{broker_bin, isolate, write_config, DaemonReaper, Proc};
use crate::stdio::Mcp;
use pi_ide_broker::testkit::agent::Agent;
use pi_ide_broker::testkit::fake_editor::{FakeEditor, Options};
use pi_ide_broker::testkit::{eventually, text, within};
use serde_json::json;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Writes `from` over `to` as an installer does: a new file renamed over the path.
pub(crate) fn install_over(from: &Path, to: &Path) {
    let next = to.with_extension("new");
    std::fs::copy(from, &next).expect("copy the new binary");
    std::fs::rename(&next, to).expect("rename it over the old one");
}

/// (device, inode) of a file, or of the binary a pid runs.
fn identity(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).expect("stat");
    (m.dev(), m.ino())
}

/// The pid `running.json` in `state` names.
fn running_pid(state: &Path) -> Option<u32> {
    let record = std::fs::read_to_string(state.join("running.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&record).ok()?;
    u32::try_from(v["pid"].as_u64()?).ok()
}

/// The pi session's key in the handover test.
const PI_KEY: &str = "pi-session-upgrade";

/// A pi session as the extension opens it (protocol 2, followable), on `cwd`.
async fn pi_session(socket: &Path, cwd: &str) -> Agent {
    let q = format!(
        "cwd={}&session={PI_KEY}&client=pi-ide-broker-pi&client_version=0.1.0&protocol=2",
        pi_ide_broker::protocol::percent::encode_query(cwd)
    );
    within("the pi session's connect", Agent::connect(socket, &q))
        .await
        .expect("pi session")
}

/// Dials `socket` again and again until stopped, keeping every failure: a client arriving
/// during the handover must find a listener.
struct Dialler {
    stop: Arc<AtomicBool>,
    dials: Arc<AtomicUsize>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Dialler {
    fn start(socket: &Path) -> Dialler {
        let d = Dialler {
            stop: Arc::default(),
            dials: Arc::default(),
            refused: Arc::default(),
        };
        let (stop, dials, refused) = (d.stop.clone(), d.dials.clone(), d.refused.clone());
        let socket = socket.to_path_buf();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match tokio::net::UnixStream::connect(&socket).await {
                    Ok(s) => drop(s),
                    Err(e) => refused.lock().unwrap().push(e.to_string()),
                }
                dials.fetch_add(1, Ordering::Relaxed);
                // Pacing, not synchronisation: a dial every 2 ms over the whole handover.
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        });
        d
    }

    fn finish(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let refused = self.refused.lock().unwrap().clone();
        (self.dials.load(Ordering::Relaxed), refused)
    }
}

/// The daemon runs from a copy of the binary; a new file is renamed over that path while a
/// diff is open: the daemon waits for the reviewer (the diff is answered FILE_SAVED by the
/// old daemon), then starts the new file, which takes the socket over. A client dialling all
/// along is never refused; the old daemon exits 0, the successor runs the new file, and the
/// native session (same key, same editor), the `mcp` door and an ACP door following a pi
/// session are attached again at once.
/// Before the handover the daemon exited 75 and nobody listened until a new session started
/// one: the dialler saw ECONNREFUSED/ENOENT and no successor ran.
#[tokio::test]
async fn a_replaced_binary_hands_the_socket_to_the_new_one_and_sessions_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let cfg = write_config(&root, "");
    let state = root.join("state");
    let _reaper = DaemonReaper(state.clone());
    let bin_dir = root.join("pkg");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let installed = bin_dir.join("pi-ide-broker");
    std::fs::copy(broker_bin(), &installed).expect("copy the binary");
    let mut cmd = tokio::process::Command::new(&installed);
    cmd.arg("--config")
        .arg(&cfg)
        .arg("daemon")
        .env("RUST_LOG", "info")
        .env_remove("PI_IDE_BROKER_SOCKET");
    isolate(&mut cmd, &root);
    let mut d = Proc::spawn(&mut cmd);
    d.wait_line(&["pi-ide-broker ready"]).await;
    let old_pid = d.child.id().expect("pid");
    let socket = root.join("run/sock");
    let proj = root.join("proj");
    std::fs::create_dir_all(&proj).unwrap();
    std::fs::create_dir_all(root.join("pi-ide")).unwrap();
    let folder = proj.display().to_string();
    let fe = FakeEditor::start_in(&root.join("pi-ide"), Options::pi(&[&folder]))
        .await
        .expect("editor");
    let mut a = Agent::open(&socket, &folder, Some("pi-1")).await;
    let first = a.attached().await;
    let mut mcp_cmd = tokio::process::Command::new(broker_bin());
    mcp_cmd.args(["--config"]).arg(&cfg).args([
        "mcp",
        "--cwd",
        &folder,
        "--session",
        "claude-1",
        "--no-spawn",
    ]);
    isolate(&mut mcp_cmd, &root);
    let mut m = Mcp::spawn(&mut mcp_cmd);
    let init = m.request(json!(1), "initialize", json!({"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}})).await;
    assert_eq!(init["result"]["serverInfo"]["name"], "pi-ide-broker");
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    assert!(m
        .call("getDiagnostics", json!({}))
        .await
        .get("result")
        .is_some());
    // A pi session (as the extension opens it) and an ACP editor following it.
    let mut pi = pi_session(&socket, &folder).await;
    let mut acp_cmd = tokio::process::Command::new(broker_bin());
    acp_cmd.arg("--config").arg(&cfg).arg("acp");
    isolate(&mut acp_cmd, &root);
    let mut acp = pi_ide_broker::testkit::acp_client::AcpClient::spawn(&mut acp_cmd);
    acp.initialize(true, false).await;
    assert_eq!(
        acp.new_session(&folder).await["result"]["sessionId"],
        PI_KEY
    );
    pi.until("the follower", |m| m["method"] == "broker/followers")
        .await;

    let file = proj.join("a.rs").display().to_string();
    a.call_tool(
        json!("d"),
        "openDiff",
        pi_ide_broker::testkit::diff_args(&file, "new\n", "t"),
    )
    .await;
    eventually("the diff open in the editor", || {
        fe.pending_diffs().contains(&"t".to_string()).then_some(())
    })
    .await;
    let dialler = Dialler::start(&socket);
    install_over(&broker_bin(), &installed);
    d.wait_line(&["was replaced", "once no call is pending"])
        .await;
    assert!(
        d.child.try_wait().expect("try_wait").is_none(),
        "it must wait for the open diff"
    );
    assert!(fe.accept_diff("t", "new\n"));
    assert_eq!(text(&a.answer(&json!("d")).await), "FILE_SAVED");
    let status = d.wait_exit().await;
    let stepped_down = std::time::Instant::now();
    assert!(status.success(), "{status:?}\n{}", d.seen.join("\n"));
    let successor = eventually("the successor's running record", || {
        running_pid(&state).filter(|p| *p != old_pid)
    })
    .await;
    assert_eq!(
        identity(Path::new(&format!("/proc/{successor}/exe"))),
        identity(&installed),
        "the successor runs the file installed now"
    );
    // The old daemon told the session why it went, then closed it.
    let why = a
        .until("the detach notice", |v| v["method"] == "broker/detached")
        .await;
    assert!(
        why["params"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("shutting down") && r.contains("handing over")),
        "{why}"
    );
    // The same session key comes back to the same editor on the successor.
    let mut b = Agent::open(&socket, &folder, Some("pi-1")).await;
    let again = b.attached().await;
    assert_eq!(again["params"]["editor"], first["params"]["editor"]);
    // The mcp door reattached by itself: its next call is answered by the editor.
    let answer = within("the mcp door's call after the handover", async {
        loop {
            let r = m.call("getDiagnostics", json!({})).await;
            if r.get("result").is_some() {
                return r;
            }
        }
    })
    .await;
    assert!(answer.get("result").is_some(), "{answer}");
    // The pi session comes back (as the extension redials) and the ACP door follows it again
    // by itself: its next prompt reaches pi.
    let mut pi = pi_session(&socket, &folder).await;
    pi.until("the follower, again", |m| {
        m["method"] == "broker/followers" && m["params"]["count"] == 1
    })
    .await;
    eprintln!(
        "the ACP door followed the pi session again {} ms after the old daemon exited",
        stepped_down.elapsed().as_millis()
    );
    let prompt = acp.prompt(PI_KEY, "after the upgrade").await;
    let asked = pi
        .until("the prompt", |m| {
            m["method"] == "pi/prompt" && m.get("id").is_some()
        })
        .await;
    assert_eq!(asked["params"]["text"], "after the upgrade");
    pi.send_text(
        &json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"stopReason": "end_turn"}})
            .to_string(),
    )
    .await;
    assert_eq!(
        acp.answer(&prompt).await["result"]["stopReason"],
        "end_turn"
    );
    acp.close().await;
    let (dials, refused) = dialler.finish();
    assert!(dials > 10, "the dialler ran ({dials} dials)");
    assert!(
        refused.is_empty(),
        "{} of {dials} dials found nobody during the handover: {:?}",
        refused.len(),
        &refused[..refused.len().min(5)]
    );
    b.close().await;
}

/// Stages and packs the pi package and the linux-x64 platform package at `version` into
/// `out`, as `packaging/pack.sh` lays them out, the platform binary being this build's: the
/// daemon an upgrade starts from and the one it upgrades to are both the code under test.
/// (root tarball, platform tarball)
async fn pack(version: &str, out: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let stage = out.join(format!("stage-{version}"));
    let platform = stage.join("linux-x64");
    let vendor = platform.join("vendor/x86_64-unknown-linux-musl/bin");
    std::fs::create_dir_all(&vendor).expect("mkdir vendor");
    let with_version = |from: &Path, to: &Path, pin_platform: bool| {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(from).expect("package.json"))
                .expect("package.json is JSON");
        v["version"] = json!(version);
        if pin_platform {
            // Only the platform package this machine installs is published here.
            v["optionalDependencies"] = json!({"pi-ide-broker-linux-x64": version});
        }
        std::fs::write(to, v.to_string()).expect("write package.json");
    };
    with_version(
        &repo.join("packaging/npm/linux-x64/package.json"),
        &platform.join("package.json"),
        false,
    );
    let bin = vendor.join("pi-ide-broker");
    std::fs::copy(broker_bin(), &bin).expect("copy the binary");
    // A debug build's symbols are most of its size; packed and published twice, they cost more
    // than the test. Without `strip` (binutils) the binary goes as it is.
    let _ = tokio::process::Command::new("strip")
        .arg("--strip-debug")
        .arg(&bin)
        .status()
        .await;
    let root = stage.join("pi-ide-broker");
    for rel in ["extensions/pi/src", "extensions/pi/bin"] {
        std::fs::create_dir_all(root.join(rel)).expect("mkdir");
        for e in std::fs::read_dir(repo.join(rel))
            .expect("read_dir")
            .flatten()
        {
            let name = e.file_name();
            let keep = [".ts", ".js"]
                .iter()
                .any(|x| name.to_string_lossy().ends_with(x));
            if keep {
                std::fs::copy(e.path(), root.join(rel).join(&name)).expect("copy");
            }
        }
    }
    std::fs::copy(
        repo.join("extensions/pi/index.ts"),
        root.join("extensions/pi/index.ts"),
    )
    .expect("copy index.ts");
    with_version(&repo.join("package.json"), &root.join("package.json"), true);
    let mut tarballs = Vec::new();
    for dir in [&root, &platform] {
        let out_dir = out.to_path_buf();
        let packed = tokio::process::Command::new("npm")
            .args(["pack", "--silent", "--ignore-scripts", "--pack-destination"])
            .arg(&out_dir)
            .current_dir(dir)
            .env("npm_config_update_notifier", "false")
            .output();
        let packed = pi_ide_broker::testkit::within_start("npm pack", packed)
            .await
            .expect("run npm pack");
        assert!(
            packed.status.success(),
            "npm pack in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&packed.stderr)
        );
        let name = String::from_utf8_lossy(&packed.stdout).trim().to_string();
        tarballs.push(out_dir.join(name));
    }
    (tarballs[0].clone(), tarballs[1].clone())
}

/// Issue 62's acceptance, with the real programs: pi installs `pi-ide-broker` from a local
/// registry (verdaccio), a pi session autoconnects (its daemon started by the extension from
/// the platform package) to a real Neovim with pi-ide.nvim; a newer version is published and
/// `pi install npm:pi-ide-broker` run while the session is open. The same session's next
/// write is reviewed in Neovim within 5 s of the install, served by a daemon running the new
/// file, with no new pi session; rejected there, the write is refused. Before the handover the
/// old daemon exited (75) and nothing started the new one: no diff came, the write was refused
/// as "not reachable".
#[tokio::test]
async fn pi_install_of_a_newer_version_under_an_open_session_keeps_its_writes_reviewed() {
    use crate::common::fake_model::{FakeModel, Reply};
    use crate::common::pi::{find_pi, pi_home, Pi};
    use crate::npm_install::{path_without_cargo, pi_package_cmd, Registry};
    let Some(pi) = find_pi() else { return };
    let Some((_, verdaccio)) = crate::npm_install::find_tools() else {
        return;
    };
    let Some((nvim, mut plugins)) =
        crate::common::nvim_plugins::neovim_with("upgrade", &["PI_IDE_BROKER_PI_IDE_NVIM"])
    else {
        return;
    };
    let plugin = plugins.pop().expect("pi-ide.nvim");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(dir.path()).expect("canonical");
    let registry = Registry::start(&pi, &verdaccio, &root).await;
    let (old_root, old_platform) = pack("0.0.1", &root).await;
    let (new_root, new_platform) = pack("0.0.2", &root).await;
    registry.publish(&old_platform).await;
    registry.publish(&old_root).await;

    let model = FakeModel::start().await;
    let home = pi_home(&root, &model.models_json());
    let path = path_without_cargo(&pi);
    // npm may answer a second install from its cached metadata, which a publish seconds ago
    // has not reached (pi says so itself): ask the registry every time, as a user's later
    // upgrade, minutes or days on, does.
    std::fs::write(home.join(".npmrc"), "prefer-online=true\n").expect("write .npmrc");
    // The newer version named: `npm install <name>` keeps the version its project already
    // depends on (`^0.0.1` is 0.0.1 alone).
    let install = |spec: &'static str| {
        let (pi, home, url, path) = (&pi, &home, registry.url.clone(), path.clone());
        async move {
            let (ok, out, took) = pi_package_cmd(pi, home, &url, &path, &["install", spec]).await;
            assert!(ok, "pi install {spec}: {out}");
            took
        }
    };
    install("npm:pi-ide-broker").await;
    let binary = home.join(
        ".pi/agent/npm/node_modules/pi-ide-broker-linux-x64/vendor/x86_64-unknown-linux-musl/bin/pi-ide-broker",
    );
    let first_binary = identity(&binary);

    let project = home.join("project");
    std::fs::create_dir_all(&project).expect("mkdir project");
    let file = project.join("a.txt");
    std::fs::write(&file, "original\n").expect("write");
    let lock_dir = home.join(".pi/ide");
    std::fs::create_dir_all(&lock_dir).expect("mkdir lock dir");
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crash/pi_ide.lua");
    let nv = crate::acp_nvim::Nvim::start(
        &nvim,
        &root.join("nvim.sock"),
        &[plugin],
        &[driver],
        &project,
        &[
            ("PI_IDE_LOCK_DIR", lock_dir.clone()),
            ("HOME", root.join("nvim-home")),
            ("XDG_STATE_HOME", root.join("nvim-state")),
            ("XDG_CACHE_HOME", root.join("nvim-cache")),
            ("XDG_CONFIG_HOME", root.join("nvim-config")),
        ],
    )
    .await;
    nv.until("pi-ide.nvim set up", "start()", |s| s == "ok")
        .await;
    nv.until("pi-ide.nvim's server", "port()", |s| !s.is_empty())
        .await;

    let state_dir = home.join(".local/state/pi-ide-broker");
    let _reaper = DaemonReaper(state_dir.clone());
    let tmp = home.join("tmp");
    std::fs::create_dir_all(&tmp).expect("mkdir tmp");
    let env = [("PATH", path.as_os_str()), ("TMPDIR", tmp.as_os_str())];
    let mut session = Pi::start_installed(&pi, &home, &project, &env).await;
    session.toast(0, "Auto-connected to").await;
    let first_daemon = running_pid(&state_dir).expect("the daemon's running record");

    let before_upgrade = session.mark();
    registry.publish(&new_platform).await;
    registry.publish(&new_root).await;
    let took = install("npm:pi-ide-broker@0.0.2").await;
    let installed = std::time::Instant::now();
    eprintln!(
        "pi install of the newer version took {} ms",
        took.as_millis()
    );
    let versions = ["pi-ide-broker", "pi-ide-broker-linux-x64"].map(|p| {
        std::fs::read_to_string(
            home.join(".pi/agent/npm/node_modules")
                .join(p)
                .join("package.json"),
        )
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|v| v["version"].to_string())
    });
    assert_ne!(
        identity(&binary),
        first_binary,
        "the second pi install did not replace the binary (installed: {versions:?}; npm's project: {})",
        std::fs::read_to_string(home.join(".pi/agent/npm/package.json")).unwrap_or_default()
    );

    // The session comes back by itself, on the successor (the old daemon reviews a write that
    // beats the handover, which then waits for it: that write would not show the upgrade).
    session.toast(before_upgrade, "Reconnected to").await;
    // The open session's next write: reviewed in Neovim, within 5 s of the install.
    model.push(Reply::Tool {
        name: "write".into(),
        args: json!({"path": file.display().to_string(), "content": "upgraded\n"}),
    });
    model.push(Reply::Text("turn done".into()));
    let from = session.mark();
    let r = session
        .command("prompt", json!({"message": "write upgraded"}))
        .await;
    assert_eq!(r["success"], true, "{r}");
    let shown = nv
        .until("the write's diff in Neovim", "diffs()", |s| !s.is_empty())
        .await;
    let reviewed_after = installed.elapsed();
    eprintln!(
        "the write after the upgrade was in Neovim {} ms after pi install returned",
        reviewed_after.as_millis()
    );
    assert!(
        reviewed_after <= std::time::Duration::from_secs(5),
        "the write's diff came {reviewed_after:?} after the install"
    );
    let successor = running_pid(&state_dir).expect("the successor's running record");
    assert_ne!(successor, first_daemon, "the old daemon still serves");
    assert_eq!(
        identity(Path::new(&format!("/proc/{successor}/exe"))),
        identity(&binary),
        "the daemon serving now runs the newly installed file"
    );
    assert_eq!(
        nv.call(&format!(
            "decide({}, \"reject\")",
            crate::acp_nvim::lua_str(&shown)
        ))
        .await,
        "ok"
    );
    session
        .until("the turn settled", from, |v| v["type"] == "agent_settled")
        .await;
    let (_, is_error, result) = session
        .tool_results(from)
        .into_iter()
        .find(|(name, _, _)| name == "write")
        .expect("the write's result");
    assert!(
        is_error && !result.contains("not reachable"),
        "the write was not refused by the reviewer: {result}"
    );
    assert_eq!(
        std::fs::read_to_string(&file).expect("the file"),
        "original\n"
    );
    // The user was told once, and nothing alarming: the session is back on its editor.
    let notices: Vec<&str> = session.log[before_upgrade..]
        .iter()
        .filter(|v| v["type"] == "extension_ui_request" && v["method"] == "notify")
        .filter_map(|v| v["message"].as_str())
        .collect();
    assert_eq!(
        notices
            .iter()
            .filter(|m| m.contains("Reconnected to"))
            .count(),
        1,
        "{notices:?}"
    );
    session.quit().await;
    drop(registry);
}
