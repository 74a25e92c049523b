//! The repository as a pi package: the real pi installs it from a `git:` source served by a
//! real `git daemon` (the extension has no dependencies; the platform packages, not on any
//! registry pi reaches here, are optional), the installed extension autoconnects, `pi remove`
//! takes it away; `npm pack` ships the extension, its binary lookup and launcher, nothing else;
//! and every npm package carries the crate's version.

use crate::common::fake_model::FakeModel;
use crate::common::git_serve::{git_daemon_available, GitServer};
use crate::common::pi::{find_pi, pi_cli, pi_home, Pi, PiInstall};
use crate::common::*;
use serde_json::{json, Value};
use std::path::Path;

fn settings(home: &Path) -> Value {
    let p = home.join(".pi").join("agent").join("settings.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_default()).unwrap_or(Value::Null)
}

/// pi and `git daemon` both here, or `None` after saying which is missing.
fn tools() -> Option<PiInstall> {
    let pi = find_pi()?;
    if !git_daemon_available() {
        cannot_run("`git daemon` not found (Debian: the git package has it; apt-get install git)");
        return None;
    }
    Some(pi)
}

#[tokio::test]
async fn pi_install_from_git_autoconnects_and_pi_remove_removes_it() {
    let Some(pi) = tools() else { return };
    let server = GitServer::start().await;
    let model = FakeModel::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let home = pi_home(dir.path(), &model.models_json());
    let source = server.pi_source();

    let (ok, out) = pi_cli(&pi, &home, &["install", &source]).await;
    assert!(ok, "pi install {source} failed:\n{out}");
    assert_eq!(settings(&home)["packages"], json!([source]), "{out}");
    let checkout = home.join(".pi/agent/git/127.0.0.1/local/pi-ide-broker");
    assert!(
        checkout.join("extensions/pi/index.ts").exists(),
        "pi did not check the repository out into {}:\n{out}",
        checkout.display()
    );

    // The installed copy (no -e) autoconnects through a running broker to the editor.
    let broker = TestBroker::start().await;
    let proj = std::fs::canonicalize(broker.dir.path()).expect("canonical dir");
    let (_ed, id) = broker.editor(&[&proj.display().to_string()]).await;
    let env = [
        ("PI_IDE_BROKER_SOCKET", broker.socket.as_os_str()),
        ("PI_IDE_BROKER_NO_SPAWN", std::ffi::OsStr::new("1")),
    ];
    let mut session = Pi::start_installed(&pi, &home, &proj, &env).await;
    session.toast(0, "Auto-connected to").await;
    let e = id.clone();
    broker
        .wait_status(
            "the installed extension's session on the editor",
            move |st| {
                st["sessions"].as_array().is_some_and(|s| {
                    s.iter().any(|s| {
                        s["editor"] == e.as_str()
                            && s["door"] == "native"
                            && s["client"]["name"] == "pi-ide-broker-pi"
                            && s["client"]["version"] == env!("CARGO_PKG_VERSION")
                    })
                })
            },
        )
        .await;
    session.quit().await;

    let (ok, out) = pi_cli(&pi, &home, &["remove", &source]).await;
    assert!(ok, "pi remove failed:\n{out}");
    assert_eq!(settings(&home)["packages"], json!([]), "{out}");
    assert!(!checkout.exists(), "pi remove left {}", checkout.display());
}

/// What `npm pack` would publish: the extension's sources and the docs the README links to,
/// plus what npm always adds.
#[tokio::test]
async fn npm_pack_ships_only_the_extension() {
    let Some(pi) = find_pi() else { return };
    let out = tokio::process::Command::new("npm")
        .args(["pack", "--dry-run", "--json", "--ignore-scripts"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("PATH", crate::common::pi::path_with_node(&pi))
        .env("npm_config_update_notifier", "false")
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), out)
        .await
        .expect("npm pack timed out")
        .expect("run npm pack");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("npm pack --json output");
    let files: Vec<String> = v[0]["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f["path"].as_str().map(String::from))
        .collect();
    let always = ["package.json", "README.md", "LICENSE"];
    // What the README links to (the packed README links to them on unpkg; issue 62).
    let linked = |f: &str| {
        (f.starts_with("docs/") && f.ends_with(".md"))
            || f == "ARCHITECTURE.md"
            || f == "benches/README.md"
    };
    for f in &files {
        let extension_source = f.starts_with("extensions/pi/")
            && (f.ends_with(".ts") || f.ends_with(".js"))
            && !f.contains("/test/")
            && !f.contains("node_modules");
        assert!(
            extension_source || always.contains(&f.as_str()) || linked(f),
            "npm pack would ship {f}: {files:?}"
        );
    }
    // Everything the extension loads is shipped.
    let ext = crate::common::pi::extension_dir();
    let mut needed = vec![
        "extensions/pi/index.ts".to_string(),
        "extensions/pi/bin/pi-ide-broker.js".to_string(),
    ];
    for e in std::fs::read_dir(ext.join("src")).expect("extension src") {
        let name = e
            .expect("dir entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        needed.push(format!("extensions/pi/src/{name}"));
    }
    for n in &needed {
        assert!(files.contains(n), "npm pack leaves out {n}: {files:?}");
    }
    // The license package.json declares ships with it (issue 52).
    assert!(
        files.iter().any(|f| f == "LICENSE"),
        "no LICENSE: {files:?}"
    );
}

/// The root manifest and the extension's own agree on what they ship and need.
#[test]
fn root_manifest_matches_the_extension() {
    let read = |p: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(p).expect("read manifest")).expect("json")
    };
    let root = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("package.json"));
    let ext = read(&crate::common::pi::extension_dir().join("package.json"));
    assert_eq!(
        root["pi"]["extensions"],
        json!(["./extensions/pi/index.ts"])
    );
    // No install step: neither has runtime dependencies (issue 41).
    assert!(root.get("dependencies").is_none(), "{root}");
    assert!(ext.get("dependencies").is_none(), "{ext}");
    assert_eq!(root["engines"], ext["engines"]);
    assert_eq!(
        root["bin"]["pi-ide-broker"],
        "extensions/pi/bin/pi-ide-broker.js"
    );
    assert_eq!(root["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(ext["version"], env!("CARGO_PKG_VERSION"));
    for (name, range) in root["peerDependencies"].as_object().expect("peers") {
        assert!(name.starts_with("@earendil-works/"), "{name}");
        assert_eq!(range, "*");
        assert!(root["dependencies"].get(name).is_none(), "{name} bundled");
        // Optional: `npx pi-ide-broker setup` must not fetch (and prompt for) all of pi
        // (issue 52); pi itself is there whenever pi loads the extension.
        assert_eq!(
            root["peerDependenciesMeta"][name]["optional"], true,
            "{name} must be an optional peer"
        );
    }
}

/// One version for every package: the crate, the pi package, the extension, and each platform
/// package, which the pi package names exactly in `optionalDependencies`; each platform
/// package's `os`/`cpu` and binary path agree with the extension's table (src/binary.js).
#[test]
fn every_npm_package_has_the_crates_version_and_its_platform() {
    let read = |p: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(p).expect("read manifest")).expect("json")
    };
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = read(&repo.join("package.json"));
    let version = env!("CARGO_PKG_VERSION");
    let optional = root["optionalDependencies"]
        .as_object()
        .expect("optionalDependencies");
    let table =
        std::fs::read_to_string(repo.join("extensions/pi/src/binary.js")).expect("binary.js");
    let mut dirs: Vec<String> = std::fs::read_dir(repo.join("packaging/npm"))
        .expect("packaging/npm")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("package.json").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    assert_eq!(
        dirs,
        [
            "darwin-arm64",
            "darwin-x64",
            "linux-arm64",
            "linux-x64",
            "win32-x64"
        ]
    );
    assert_eq!(optional.len(), dirs.len(), "{optional:?}");
    for key in &dirs {
        let pkg = read(&repo.join("packaging/npm").join(key).join("package.json"));
        let name = format!("pi-ide-broker-{key}");
        assert_eq!(pkg["name"], name.as_str());
        assert_eq!(pkg["version"], version, "{name}");
        assert_eq!(optional[&name], version, "the pi package's pin of {name}");
        let (os, cpu) = key.split_once('-').expect("os-cpu");
        assert_eq!(pkg["os"], json!([os]), "{name}");
        assert_eq!(pkg["cpu"], json!([cpu]), "{name}");
        assert_eq!(pkg["files"], json!(["vendor"]), "{name}");
        let triple = table
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("\"{key}\": \"")))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{key} missing from binary.js's PLATFORMS"));
        let description = pkg["description"].as_str().unwrap_or_default();
        assert!(
            description.contains(&format!("vendor/{triple}/bin/pi-ide-broker")),
            "{name}: {description}"
        );
    }
}
