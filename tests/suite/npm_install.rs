//! Issue 41, end to end: the npm packages `packaging/pack.sh` built (`PI_IDE_BROKER_PACKAGES`)
//! published to a real local registry (verdaccio, `PI_IDE_BROKER_VERDACCIO`), then, in a fresh
//! HOME whose `PATH` has no Rust toolchain, `pi install npm:pi-ide-broker` against it: the
//! extension autoconnects to an editor, the daemon it starts is the platform package's binary,
//! `pi-ide-broker doctor` through the npm launcher is green, and `pi remove` takes it all away
//! (the daemon stops by itself). Then the README's npm way, each line pasted at a real terminal
//! (issue 62): nothing asked, nothing fetched, the PATH line setup prints makes the next
//! command work, and after the README's uninstall the HOME holds nothing it did not hold.

use crate::common::fake_model::FakeModel;
use crate::common::pi::{find_pi, pi_home, Pi, PiInstall};
use crate::common::process::DaemonReaper;
use crate::common::*;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// The packed tarballs and the registry program, or `None` after saying what is missing.
pub(crate) fn find_tools() -> Option<(PathBuf, PathBuf)> {
    let packages = std::env::var_os("PI_IDE_BROKER_PACKAGES").map(PathBuf::from);
    let verdaccio = std::env::var_os("PI_IDE_BROKER_VERDACCIO").map(PathBuf::from);
    match (packages, verdaccio) {
        (Some(p), Some(v)) if p.join(tarball("pi-ide-broker")).exists() && v.exists() => {
            Some((p, v))
        }
        _ => {
            cannot_run("the npm packages and verdaccio: set PI_IDE_BROKER_PACKAGES (packaging/pack.sh's folder) and PI_IDE_BROKER_VERDACCIO (bash .ci/run does)");
            None
        }
    }
}

fn tarball(name: &str) -> String {
    format!("{name}-{}.tgz", env!("CARGO_PKG_VERSION"))
}

/// A verdaccio on a loopback port with an empty storage and no uplink: only what the test
/// publishes is there (also the upgrade suite's).
pub(crate) struct Registry {
    child: Child,
    pub(crate) url: String,
    npmrc: PathBuf,
}

impl Registry {
    pub(crate) async fn start(pi: &PiInstall, verdaccio: &Path, dir: &Path) -> Registry {
        let (_hold, port) = closed_port();
        drop(_hold);
        let config = dir.join("verdaccio.yaml");
        std::fs::write(
            &config,
            format!(
                "storage: {d}/storage\nauth:\n  htpasswd:\n    file: {d}/htpasswd\n    max_users: 10\nuplinks: {{}}\nmax_body_size: 500mb\npackages:\n  '**':\n    access: $all\n    publish: $authenticated\nlog: {{ type: stdout, format: pretty, level: warn }}\n",
                d = dir.display()
            ),
        )
        .expect("verdaccio config");
        let mut child = Command::new(&pi.node)
            .arg(verdaccio)
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn verdaccio");
        // It says where it listens once it does.
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        // A program's start (node loading verdaccio's 175 packages): a start's bound, not a
        // step's, on a loaded 2-core machine.
        tokio::time::timeout(pi_ide_broker::testkit::START, async {
            while let Ok(Some(l)) = lines.next_line().await {
                if l.contains("http address") {
                    return;
                }
            }
            panic!("verdaccio ended before it listened");
        })
        .await
        .expect("verdaccio did not listen within 60 s");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let url = format!("http://127.0.0.1:{port}");
        let token = add_user(port).await;
        let npmrc = dir.join("npmrc");
        std::fs::write(&npmrc, format!("//127.0.0.1:{port}/:_authToken={token}\n")).expect("npmrc");
        Registry { child, url, npmrc }
    }

    pub(crate) async fn publish(&self, tarball: &Path) {
        let out = Command::new("npm")
            .arg("publish")
            .arg(tarball)
            .args(["--registry", &self.url, "--loglevel=error"])
            .env("NPM_CONFIG_USERCONFIG", &self.npmrc)
            .env("npm_config_update_notifier", "false")
            .output();
        let out = tokio::time::timeout(Duration::from_secs(120), out)
            .await
            .expect("npm publish timed out")
            .expect("run npm publish");
        assert!(
            out.status.success(),
            "npm publish {}: {}",
            tarball.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Creates a registry user (what `npm adduser` does) and returns its token.
async fn add_user(port: u16) -> String {
    let body = json!({"name": "ci", "password": "ci-password-1"}).to_string();
    let req = format!(
        "PUT /-/user/org.couchdb.user:ci HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = tokio::time::timeout(pi_ide_broker::testkit::START, async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect registry");
        s.write_all(req.as_bytes()).await.expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("read");
        out
    })
    .await
    .expect("the registry did not create its user within 60 s");
    let json_part = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: Value = serde_json::from_str(json_part.trim()).unwrap_or(Value::Null);
    v["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {answer}"))
        .to_string()
}

/// Every file and dir under `dir` (none when it is not there).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}

/// `PATH` with pi's node and the system's tools, and no Rust toolchain.
pub(crate) fn path_without_cargo(pi: &PiInstall) -> OsString {
    let node_dir = pi.node.parent().expect("node's dir").to_path_buf();
    let path = std::env::join_paths([node_dir, "/usr/bin".into(), "/bin".into()]).expect("PATH");
    let has_cargo = std::env::split_paths(&path).any(|d| d.join("cargo").exists());
    assert!(!has_cargo, "the test's PATH has a cargo");
    path
}

/// `pi <args>` (install, remove) in `home` against the registry at `registry`, with `path`;
/// (success, output, how long it took).
pub(crate) async fn pi_package_cmd(
    pi: &PiInstall,
    home: &Path,
    registry: &str,
    path: &OsString,
    args: &[&str],
) -> (bool, String, Duration) {
    let started = Instant::now();
    let out = Command::new(&pi.node)
        .arg(&pi.cli)
        .args(args)
        .current_dir(home)
        .env_clear()
        .env("HOME", home)
        .env("PATH", path)
        .env("npm_config_registry", registry)
        .env("npm_config_update_notifier", "false")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), out)
        .await
        .expect("pi timed out")
        .expect("run pi");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, started.elapsed())
}

#[tokio::test]
async fn pi_installs_the_npm_package_with_no_rust_and_it_autoconnects_then_pi_remove_cleans_up() {
    let Some(pi) = find_pi() else { return };
    let Some((packages, verdaccio)) = find_tools() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = Registry::start(&pi, &verdaccio, dir.path()).await;
    let platform = packages.join(tarball("pi-ide-broker-linux-x64"));
    assert!(
        platform.exists(),
        "packaging/pack.sh left no {}",
        platform.display()
    );
    registry.publish(&platform).await;
    registry
        .publish(&packages.join(tarball("pi-ide-broker")))
        .await;

    let model = FakeModel::start().await;
    let home = pi_home(dir.path(), &model.models_json());
    let home = home.canonicalize().expect("canonical home");
    // The HOME as its user had it: after the README's uninstall, nothing more of the broker.
    let before = tree(&home);
    let path = path_without_cargo(&pi);
    let (ok, out, took) = pi_package_cmd(
        &pi,
        &home,
        &registry.url,
        &path,
        &["install", "npm:pi-ide-broker"],
    )
    .await;
    assert!(ok, "pi install npm:pi-ide-broker: {out}");
    eprintln!(
        "pi install npm:pi-ide-broker from the local registry took {} ms",
        took.as_millis()
    );
    let npm_root = home.join(".pi/agent/npm/node_modules");
    let binary =
        npm_root.join("pi-ide-broker-linux-x64/vendor/x86_64-unknown-linux-musl/bin/pi-ide-broker");
    assert!(
        binary.exists(),
        "no platform binary after pi install: {out}"
    );
    let launcher = npm_root.join("pi-ide-broker/extensions/pi/bin/pi-ide-broker.js");

    // An editor on a project; pi started there autoconnects through a daemon the extension
    // starts from the platform package.
    let project = home.join("project");
    std::fs::create_dir_all(&project).expect("mkdir project");
    std::fs::create_dir_all(home.join(".pi/ide")).expect("mkdir lock dir");
    let _editor = FakeEditor::start_in(
        &home.join(".pi/ide"),
        Options::pi(&[&project.display().to_string()]),
    )
    .await
    .expect("fake editor");
    let state_dir = home.join(".local/state/pi-ide-broker");
    let _reaper = DaemonReaper(state_dir.clone());
    // The default socket is `$TMPDIR/pi-ide-broker-<uid>/sock`: one of the test's own, so no
    // other daemon of this user (another test's, the user's) is the one the extension finds.
    let tmp = home.join("tmp");
    std::fs::create_dir_all(&tmp).expect("mkdir tmp");
    let env = [("PATH", path.as_os_str()), ("TMPDIR", tmp.as_os_str())];
    let mut session = Pi::start_installed(&pi, &home, &project, &env).await;
    session.toast(0, "Auto-connected to").await;
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(state_dir.join("running.json")).expect("running.json"),
    )
    .expect("json");
    let pid = record["pid"].as_u64().expect("pid");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the daemon's exe");
    assert_eq!(
        exe, binary,
        "the daemon is not the platform package's binary"
    );

    let launch = |args: &'static [&'static str]| {
        let mut c = Command::new(&pi.node);
        c.arg(&launcher)
            .args(args)
            .env_clear()
            .env("HOME", &home)
            .env("PATH", &path)
            .env("TMPDIR", &tmp)
            .current_dir(&project);
        c
    };
    let out = within("doctor through the launcher", launch(&["doctor"]).output())
        .await
        .expect("doctor");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "doctor is not green:\n{report}");
    assert!(report.contains("Everything an agent needs"), "{report}");
    drop(session);
    // The license package.json declares ships in both packages (issue 52).
    for pkg in ["pi-ide-broker", "pi-ide-broker-linux-x64"] {
        assert!(
            npm_root.join(pkg).join("LICENSE").exists(),
            "{pkg} has no LICENSE"
        );
    }

    // `pi remove` while the daemon runs from the package it deletes: the daemon notices and
    // stops by itself (issue 52: it ran on from a deleted file).
    let (ok, out, _) = pi_package_cmd(
        &pi,
        &home,
        &registry.url,
        &path,
        &["remove", "npm:pi-ide-broker"],
    )
    .await;
    assert!(ok, "pi remove: {out}");
    let settings: Value = serde_json::from_str(
        &std::fs::read_to_string(home.join(".pi/agent/settings.json")).unwrap_or_default(),
    )
    .unwrap_or(Value::Null);
    assert_eq!(settings["packages"], json!([]), "{out}");
    for left in ["pi-ide-broker", "pi-ide-broker-linux-x64"] {
        assert!(!npm_root.join(left).exists(), "pi remove left {left}");
    }
    let gone = tokio::time::timeout(pi_ide_broker::testkit::START, async {
        while pi_ide_broker::platform::process::alive(pid as u32) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        gone.is_ok(),
        "the daemon (pid {pid}) runs on after pi remove deleted its binary"
    );

    readme_npm_way(&pi, &home, &tmp, &registry.url, &path, &binary, &before).await;
    drop(registry.child);
}

/// Every path under `home`, relative to it.
pub fn tree(home: &Path) -> BTreeSet<String> {
    walk(home)
        .into_iter()
        .filter_map(|p| p.strip_prefix(home).ok().map(|r| r.display().to_string()))
        .collect()
}

/// What is in `home` now that was not `before`, but for what others own: npm's cache (not
/// its npx copies), pi's own folder, the editor's lock dir, and the test's own dirs.
pub fn made_since(home: &Path, before: &BTreeSet<String>) -> Vec<String> {
    let others = [".npm/", ".pi/agent", ".pi/ide", "project", "shim", "tmp"];
    // The test's TMPDIR is others' too, but for the broker's socket dir in it.
    let brokers = |p: &str| p.starts_with(".npm/_npx") || p.starts_with("tmp/pi-ide-broker");
    tree(home)
        .into_iter()
        .filter(|p| !before.contains(p))
        .filter(|p| brokers(p) || !others.iter().any(|o| p.starts_with(o)))
        .filter(|p| p != ".npm" && p != ".pi")
        .collect()
}

/// The README's npm way, every line as pasted at a real terminal (`crate::pty`): the install
/// block asks nothing and fetches nothing (pi's copy is what setup copies), pi's launcher
/// before setup names itself in its hints, setup's PATH line makes the README's next command
/// work, and the README's npm uninstall block leaves nothing in the HOME that was not there.
async fn readme_npm_way(
    pi: &PiInstall,
    home: &Path,
    tmp: &Path,
    registry: &str,
    path: &OsString,
    binary: &Path,
    before: &BTreeSet<String>,
) {
    if !crate::pty::available() {
        return cannot_run("`script` (util-linux) for a real terminal");
    }
    // A user has `pi` on PATH: a shim stands for pi's own launcher.
    let shim = home.join("shim");
    std::fs::create_dir_all(&shim).expect("mkdir shim");
    let pi_shim = shim.join("pi");
    std::fs::write(
        &pi_shim,
        format!(
            "#!/bin/sh\nexec '{}' '{}' \"$@\"\n",
            pi.node.display(),
            pi.cli.display()
        ),
    )
    .expect("write the pi shim");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&pi_shim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let path =
        std::env::join_paths(std::iter::once(shim.clone()).chain(std::env::split_paths(path)))
            .expect("PATH");
    let env = [
        ("HOME", home.as_os_str()),
        ("PATH", path.as_os_str()),
        ("TMPDIR", tmp.as_os_str()),
        ("npm_config_registry", std::ffi::OsStr::new(registry)),
        ("npm_config_update_notifier", std::ffi::OsStr::new("false")),
    ];
    let limit = Duration::from_secs(300);
    let at_terminal = |line: String| async move {
        let started = Instant::now();
        let (ok, out) = crate::pty::run(&line, home, &env, limit).await;
        eprintln!(
            "`{line}` at a terminal took {} ms",
            started.elapsed().as_millis()
        );
        (ok, out)
    };
    let text = crate::readme::readme();
    let install = crate::readme::block(&text, "npm-block");
    let (ok, out) = at_terminal(install[0].clone()).await;
    assert!(ok, "`{}`: {out}", install[0]);
    // A binary that lost its exec bit (neither `pi install` nor `pi update` puts it back): the
    // launcher gives it back and runs it (issue 62).
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(binary, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }
    // Before setup, pi's launcher names itself, not a bare command the shell lacks (issue 62).
    let launcher = "~/.pi/agent/npm/node_modules/.bin/pi-ide-broker";
    let (running, out) = at_terminal(format!("{launcher} status")).await;
    assert!(!running, "a daemon runs before setup:\n{out}");
    assert!(
        !out.contains("EACCES"),
        "the launcher did not repair the exec bit:\n{out}"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(binary)
            .expect("the binary")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "the exec bit is not back");
    }
    assert!(
        out.contains(&format!("`{launcher} daemon`")) && !out.contains("`pi-ide-broker daemon`"),
        "the hint names a command this shell does not have:\n{out}"
    );
    let (ok, out) = at_terminal(install[1].clone()).await;
    assert!(ok, "`{}`: {out}", install[1]);
    assert!(!crate::pty::npx_asked(&out), "setup asked:\n{out}");
    assert!(
        !home.join(".npm/_npx").exists(),
        "setup fetched a second copy into npx's cache:\n{out}"
    );
    let copy = home.join(".local/share/pi-ide-broker/bin/pi-ide-broker");
    assert_eq!(
        std::fs::read(&copy).ok(),
        std::fs::read(binary).ok(),
        "setup's copy is not pi's binary:\n{out}"
    );
    assert!(
        out.contains("left as it is") && !out.contains("pi remove npm:"),
        "{out}"
    );
    // The PATH step: ~/.local/bin is not on this PATH, setup says so with the line to add,
    // and with it the README's next command runs.
    let export = out
        .split("export PATH=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .map(|p| format!("export PATH=\"{p}\""))
        .unwrap_or_else(|| panic!("setup did not say how to put the command on PATH:\n{out}"));
    assert!(
        text.contains(&format!("`{export}`")),
        "the README does not show setup's PATH line `{export}`"
    );
    let (ok, status) = at_terminal("pi-ide-broker status".into()).await;
    assert!(!ok, "pi-ide-broker ran without the PATH line:\n{status}");
    let (ok, status) = at_terminal(format!("{export}; pi-ide-broker status")).await;
    assert!(ok, "`{export}; pi-ide-broker status`:\n{status}");
    // The README's npm uninstall, as pasted; then nothing the broker made is left.
    for line in crate::readme::block(&text, "uninstall-npm") {
        let (ok, out) = at_terminal(line.clone()).await;
        assert!(ok, "`{line}`: {out}");
    }
    let left = made_since(home, before);
    assert!(
        left.is_empty(),
        "left in the HOME after the README's uninstall, and not there before: {left:#?}"
    );
}

/// The Windows package as packaging/pack.sh packs it: the `.exe` at the path the launcher and
/// the extension look for (`vendor/x86_64-pc-windows-gnu/bin/pi-ide-broker.exe`, the layout
/// `extensions/pi/test/options.test.ts` resolves), `os`/`cpu` so npm installs it on Windows x64
/// only, a real PE executable, and the root package asking for it.
#[tokio::test]
async fn the_win32_package_holds_the_exe_where_the_launcher_looks() {
    let Some(packages) = std::env::var_os("PI_IDE_BROKER_PACKAGES").map(PathBuf::from) else {
        return cannot_run("the npm packages: set PI_IDE_BROKER_PACKAGES (bash .ci/run does)");
    };
    let tgz = packages.join(tarball("pi-ide-broker-win32-x64"));
    if !tgz.exists() {
        return cannot_run("the win32-x64 package: `bash packaging/pack.sh --only win32-x64`");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(&tgz)
        .arg("-C")
        .arg(dir.path())
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let pkg = dir.path().join("package");
    let exe = pkg.join("vendor/x86_64-pc-windows-gnu/bin/pi-ide-broker.exe");
    let head = std::fs::read(&exe).expect("the .exe where the launcher looks");
    assert_eq!(&head[..2], b"MZ", "a Windows executable");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(pkg.join("package.json")).unwrap()).unwrap();
    assert_eq!(manifest["name"], "pi-ide-broker-win32-x64");
    assert_eq!(manifest["os"], serde_json::json!(["win32"]));
    assert_eq!(manifest["cpu"], serde_json::json!(["x64"]));
    assert!(pkg.join("LICENSE").exists());
    let root: Value = serde_json::from_str(include_str!("../../package.json")).unwrap();
    assert_eq!(
        root["optionalDependencies"]["pi-ide-broker-win32-x64"],
        env!("CARGO_PKG_VERSION")
    );
}

/// The pi package's README as the registry shows it (issue 62): every link to one of the
/// repository's own files is absolute, to this version on unpkg, and names a file the package
/// ships; the repository's README keeps its relative links (right on a clone).
#[tokio::test]
async fn the_packed_readme_links_only_to_files_the_package_ships() {
    let Some(packages) = std::env::var_os("PI_IDE_BROKER_PACKAGES").map(PathBuf::from) else {
        return cannot_run("the npm packages: set PI_IDE_BROKER_PACKAGES (bash .ci/run does)");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let unpacked = tokio::process::Command::new("tar")
        .arg("-xzf")
        .arg(packages.join(tarball("pi-ide-broker")))
        .arg("-C")
        .arg(dir.path())
        .status();
    let unpacked = tokio::time::timeout(Duration::from_secs(60), unpacked)
        .await
        .expect("tar timed out")
        .expect("run tar");
    assert!(unpacked.success(), "tar -xzf failed");
    let root = dir.path().join("package");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("the packed README");
    let base = format!(
        "https://unpkg.com/pi-ide-broker@{}/",
        env!("CARGO_PKG_VERSION")
    );
    let mut own = 0;
    for link in readme.split("](").skip(1) {
        let target = link.split(')').next().unwrap_or_default();
        assert!(
            target.starts_with("https://") || target.starts_with("http://"),
            "a relative link in the packed README (broken on the registry's page): {target}"
        );
        if let Some(path) = target.strip_prefix(&base) {
            let file = path.split('#').next().unwrap_or_default();
            assert!(
                root.join(file).is_file(),
                "the packed README links to {file}, not shipped"
            );
            own += 1;
        }
    }
    assert!(own >= 10, "only {own} links to the package's own docs");
    let source = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    assert!(
        source.contains("](docs/protocol.md)"),
        "the repository's README keeps relative links"
    );
}
