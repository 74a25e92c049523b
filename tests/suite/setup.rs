//! `pi-ide-broker setup` in a fresh HOME with the real pi (installing this repository from a
//! real `git daemon`): `--dry-run` changes nothing, `--write` installs the extension and merges
//! the MCP entries into existing files beside their other entries, a second run changes
//! nothing, `--undo` takes back exactly what was done. The service step meets no user
//! service manager: a `systemctl` on the test's PATH fails as it does without a user bus
//! (this machine has no systemd user session to test against).

use crate::common::git_serve::{git_daemon_available, GitServer};
use crate::common::pi::{find_pi, path_with_node, PiInstall};
use crate::common::{cannot_run, process::broker_bin};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

const CODEX_BEFORE: &str =
    "# my settings\nmodel = \"o3\"\n\n[mcp_servers.other]\ncommand = \"other-server\"\n";
const GEMINI_BEFORE: &str = "{\n  \"theme\": \"dark\",\n  \"mcpServers\": {\n    \"other\": { \"command\": \"other-server\" }\n  }\n}\n";

/// A fresh HOME with a `pi` and a failing `systemctl` on its PATH.
pub struct Home {
    _dir: tempfile::TempDir,
    pub home: PathBuf,
    path: std::ffi::OsString,
    /// `$TMPDIR`: the default socket (`$TMPDIR/pi-ide-broker-<uid>/sock`, with no
    /// `XDG_RUNTIME_DIR`) lands in the test's own dir.
    tmp: PathBuf,
}

impl Home {
    pub fn new(pi: &PiInstall) -> Home {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&home).expect("mkdir home");
        std::fs::create_dir_all(&bin).expect("mkdir bin");
        let tmp = dir.path().join("tmp");
        std::fs::create_dir_all(&tmp).expect("mkdir tmp");
        script(
            &bin.join("pi"),
            &format!("exec '{}' '{}' \"$@\"", pi.node.display(), pi.cli.display()),
        );
        script(
            &bin.join("systemctl"),
            "echo 'Failed to connect to bus: No medium found' >&2; exit 1",
        );
        let mut dirs = vec![bin];
        dirs.extend(std::env::split_paths(&path_with_node(pi)));
        let path = std::env::join_paths(dirs).expect("PATH");
        Home {
            _dir: dir,
            home,
            path,
            tmp,
        }
    }

    /// The environment a program started in this HOME by the test itself needs (pi): its
    /// `PATH` and `TMPDIR` (where the default socket lands).
    pub fn env(&self) -> [(&'static str, &std::ffi::OsStr); 2] {
        [
            ("PATH", self.path.as_os_str()),
            ("TMPDIR", self.tmp.as_os_str()),
        ]
    }

    /// Prepends `dir` to this HOME's PATH.
    pub fn path_prepend(&mut self, dir: &Path) {
        let mut dirs = vec![dir.to_path_buf()];
        dirs.extend(std::env::split_paths(&self.path));
        self.path = std::env::join_paths(dirs).expect("PATH");
    }

    /// Runs `pi-ide-broker <args>` (or another program) in this HOME; (success, output).
    pub async fn run(&self, program: &Path, args: &[&str]) -> (bool, String) {
        self.run_with(program, args, &[]).await
    }

    /// [`Home::run`] with these environment variables set too.
    pub async fn run_with(
        &self,
        program: &Path,
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> (bool, String) {
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(args)
            .current_dir(&self.home)
            .env("HOME", &self.home)
            .env("PATH", &self.path)
            .env("TMPDIR", &self.tmp)
            .env("npm_config_update_notifier", "false");
        for v in [
            "XDG_CONFIG_HOME",
            "XDG_STATE_HOME",
            "XDG_DATA_HOME",
            "XDG_RUNTIME_DIR",
            "CODEX_HOME",
            "PI_CODING_AGENT_DIR",
            "PI_IDE_BROKER_CONFIG",
            "PI_IDE_BROKER_SOCKET",
            "CARGO_TARGET_DIR",
        ] {
            cmd.env_remove(v);
        }
        cmd.envs(env.iter().copied());
        cmd.stdin(std::process::Stdio::null()).kill_on_drop(true);
        let what = format!("{} {}", program.display(), args.join(" "));
        let out = tokio::time::timeout(std::time::Duration::from_secs(600), cmd.output())
            .await
            .unwrap_or_else(|_| panic!("timed out after 600 s: {what}"))
            .expect("run");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    pub fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.home.join(rel)).ok()
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.home.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    /// The package sources in pi's settings.
    pub fn pi_packages(&self) -> Value {
        let text = self.read(".pi/agent/settings.json").unwrap_or_default();
        serde_json::from_str::<Value>(&text).unwrap_or(Value::Null)["packages"].clone()
    }
}

fn script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

pub fn tools() -> Option<PiInstall> {
    let pi = find_pi()?;
    if !git_daemon_available() {
        cannot_run("`git daemon` not found (Debian's git package has it)");
        return None;
    }
    Some(pi)
}

fn json_of(text: &Option<String>) -> Value {
    serde_json::from_str(text.as_deref().unwrap_or("null")).expect("valid JSON")
}

#[tokio::test]
async fn dry_run_write_again_and_undo_in_a_fresh_home() {
    let Some(pi) = tools() else { return };
    let server = GitServer::start().await;
    let h = Home::new(&pi);
    h.write(".codex/config.toml", CODEX_BEFORE);
    h.write(".gemini/settings.json", GEMINI_BEFORE);
    std::fs::create_dir_all(h.home.join(".config/opencode")).expect("mkdir opencode");
    let user_had = crate::npm_install::tree(&h.home);
    let source = server.pi_source();
    let bin = broker_bin();
    let setup = |extra: &'static [&'static str]| {
        let mut a = vec!["setup", "--pi-source", source.as_str()];
        a.extend_from_slice(extra);
        a
    };

    let mut dry = setup(&["--write"]);
    dry.push("--dry-run");
    dry_run_changes_nothing(&h, &bin, &dry, &source).await;

    // --write: the extension installed, the entries merged beside the others.
    let (ok, out) = h.run(&bin, &setup(&["--write"])).await;
    assert!(ok, "{out}");
    assert!(out.contains("started a daemon in the background"), "{out}");
    assert!(
        out.contains("✓ daemon: running"),
        "doctor sees no daemon:\n{out}"
    );
    assert_eq!(h.pi_packages(), json!([source]), "{out}");
    let codex = h.read(".codex/config.toml").expect("codex config");
    assert!(codex.starts_with(CODEX_BEFORE), "{codex}");
    let t: toml::Table = toml::from_str(&codex).expect("codex TOML");
    assert_eq!(
        t["mcp_servers"]["other"]["command"].as_str(),
        Some("other-server")
    );
    assert_eq!(
        t["mcp_servers"]["editor"]["args"],
        toml::Value::Array(vec!["mcp".into()])
    );
    let gemini = json_of(&h.read(".gemini/settings.json"));
    assert_eq!(gemini["theme"], "dark");
    assert_eq!(
        gemini["mcpServers"]["other"],
        json!({"command": "other-server"})
    );
    assert_eq!(gemini["mcpServers"]["editor"]["args"], json!(["mcp"]));
    let opencode = json_of(&h.read(".config/opencode/opencode.json"));
    assert_eq!(opencode["mcp"]["editor"]["type"], "local");
    assert_eq!(opencode["mcp"]["editor"]["command"][1], "mcp");

    // Again: nothing changes.
    let files = [
        ".codex/config.toml",
        ".gemini/settings.json",
        ".config/opencode/opencode.json",
        ".pi/agent/settings.json",
    ];
    let before: Vec<_> = files.iter().map(|f| h.read(f)).collect();
    let (ok, out) = h.run(&bin, &setup(&["--write"])).await;
    assert!(ok, "{out}");
    assert!(out.contains("the extension is installed"), "{out}");
    assert!(out.contains("a daemon is running on"), "{out}");
    assert!(out.contains("has the `editor` MCP server"), "{out}");
    let after: Vec<_> = files.iter().map(|f| h.read(f)).collect();
    assert_eq!(before, after, "{out}");

    undo_takes_back_exactly_that(&h, &bin).await;
    // Nothing the broker made is left: state, log, lock, the link and the dir setup made for
    // it (issue 62).
    let left = crate::npm_install::made_since(&h.home, &user_had);
    assert!(left.is_empty(), "setup --undo left: {left:#?}");
    // Nor the socket dir and its lock (`$TMPDIR/pi-ide-broker-<uid>`).
    let socket_dirs: Vec<_> = std::fs::read_dir(&h.tmp)
        .expect("read TMPDIR")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("pi-ide-broker"))
        .collect();
    assert!(
        socket_dirs.is_empty(),
        "setup --undo left {socket_dirs:?} in TMPDIR"
    );
}

/// `--dry-run` shows every step and changes nothing.
async fn dry_run_changes_nothing(h: &Home, bin: &Path, args: &[&str], source: &str) {
    let (ok, out) = h.run(bin, args).await;
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("would run: pi install {source}")),
        "{out}"
    );
    assert!(
        out.contains("would add to") && out.contains(".codex/config.toml"),
        "{out}"
    );
    assert!(
        out.contains("no user service manager answers here"),
        "{out}"
    );
    assert!(out.contains("doctor:"), "{out}");
    assert!(
        out.contains("would start `pi-ide-broker daemon` in the background"),
        "{out}"
    );
    assert_eq!(h.pi_packages(), Value::Null, "{out}");
    assert_eq!(h.read(".codex/config.toml").as_deref(), Some(CODEX_BEFORE));
    assert!(h.read(".config/opencode/opencode.json").is_none());
    assert!(h.read(".local/state/pi-ide-broker/setup.json").is_none());
}

/// `--undo` after the runs above: what setup did is taken back, the rest is as it was.
async fn undo_takes_back_exactly_that(h: &Home, bin: &Path) {
    let (ok, out) = h.run(bin, &["setup", "--undo"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("stopped the daemon setup started"), "{out}");
    assert_eq!(h.pi_packages(), json!([]), "{out}");
    assert_eq!(
        h.read(".codex/config.toml").as_deref(),
        Some(CODEX_BEFORE),
        "{out}"
    );
    assert_eq!(
        h.read(".gemini/settings.json").as_deref(),
        Some(GEMINI_BEFORE),
        "{out}"
    );
    assert!(h.read(".config/opencode/opencode.json").is_none(), "{out}");
    assert!(
        h.read(".local/state/pi-ide-broker/setup.json").is_none(),
        "{out}"
    );
    let (ok, out) = h.run(bin, &["setup", "--undo"]).await;
    assert!(ok && out.contains("nothing to undo"), "{out}");
}

#[tokio::test]
async fn a_failed_step_says_why_and_the_others_still_run() {
    let Some(pi) = tools() else { return };
    let h = Home::new(&pi);
    // Not JSON (a comment): left alone, with the entry to add by hand.
    h.write(".gemini/settings.json", "// mine\n{}\n");
    h.write(".codex/config.toml", "");
    let bin = broker_bin();
    let (ok, out) = h
        .run(
            &bin,
            &[
                "setup",
                "--write",
                "--pi-source",
                "git:git://127.0.0.1:1/nobody/nothing.git",
            ],
        )
        .await;
    assert!(!ok, "a failed pi install must fail setup:\n{out}");
    assert!(
        out.contains("✗ pi: `pi install git:git://127.0.0.1:1/nobody/nothing.git` failed"),
        "{out}"
    );
    assert!(
        out.contains("cannot be edited safely") && out.contains("add by hand"),
        "{out}"
    );
    assert_eq!(
        h.read(".gemini/settings.json").as_deref(),
        Some("// mine\n{}\n")
    );
    assert!(
        h.read(".codex/config.toml")
            .is_some_and(|t| t.contains("[mcp_servers.editor]")),
        "{out}"
    );
    let (ok, out) = h.run(&bin, &["setup", "--undo"]).await;
    assert!(ok, "{out}");
    assert_eq!(h.read(".codex/config.toml").as_deref(), Some(""), "{out}");
}

/// A source pi installs but cannot load (the old trap: an extension whose import is missing,
/// as `ws` was) is a ✗ with pi's own error, never a ✓; the carried extension, by default, is
/// installed from the data dir and loads; `--undo` takes both back.
#[tokio::test]
async fn an_extension_pi_cannot_load_is_a_failure_with_pis_error_and_the_carried_one_loads() {
    let Some(pi) = find_pi() else { return };
    let h = Home::new(&pi);
    let broken = h.home.join("broken-extension");
    h.write(
        "broken-extension/package.json",
        &json!({"name": "broken", "type": "module", "pi": {"extensions": ["./index.ts"]}})
            .to_string(),
    );
    h.write(
        "broken-extension/index.ts",
        "import WebSocket from \"ws\";\nexport default function (pi: any) { void WebSocket; }\n",
    );
    let bin = broker_bin();
    let source = broken.display().to_string();
    let (ok, out) = h.run(&bin, &["setup", "--pi-source", &source]).await;
    assert!(
        !ok,
        "setup succeeded over an extension pi cannot load:\n{out}"
    );
    let line = out
        .lines()
        .find(|l| l.starts_with("✗ pi:"))
        .unwrap_or_else(|| panic!("no ✗ pi line:\n{out}"));
    assert!(
        line.contains("Failed to load extension") && line.contains("ws"),
        "the line does not carry pi's own error: {line}"
    );
    assert!(!out.contains("✓ pi"), "{out}");
    let (ok, out) = h.run(&bin, &["setup", "--undo"]).await;
    assert!(ok, "{out}");
    assert_eq!(h.pi_packages(), json!([]), "{out}");

    // The default: the extension the binary carries, loaded where setup wrote it.
    let (ok, out) = h.run(&bin, &["setup"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("pi loads it"), "{out}");
    let carried = h.home.join(".local/share/pi-ide-broker/pi-extension");
    let installed =
        pi_ide_broker::cli::setup::pi::installed(&h.home.join(".pi/agent/settings.json"));
    assert_eq!(installed, [carried.display().to_string()], "{out}");
    assert!(
        !carried.join("node_modules").exists(),
        "something ran npm in {}",
        carried.display()
    );
    let (ok, out) = h.run(&bin, &["setup", "--undo"]).await;
    assert!(ok, "{out}");
    assert!(
        !carried.exists(),
        "setup --undo left {}:\n{out}",
        carried.display()
    );
}

/// A binary npm installed (inside `node_modules`, which `pi update` replaces and `pi remove`
/// deletes) is copied to the data dir, and what setup starts and writes runs the copy; `--undo`
/// removes it.
#[tokio::test]
async fn an_npm_installed_binary_is_copied_out_of_node_modules_for_what_setup_starts() {
    let Some(pi) = find_pi() else { return };
    let h = Home::new(&pi);
    let in_npm = h
        .home
        .join(".pi/agent/npm/node_modules/pi-ide-broker-linux-x64/vendor/x86_64-unknown-linux-musl/bin/pi-ide-broker");
    std::fs::create_dir_all(in_npm.parent().expect("parent")).expect("mkdir");
    std::fs::copy(broker_bin(), &in_npm).expect("copy the binary");
    let (ok, out) = h
        .run(
            &in_npm,
            &["setup", "--pi-source", env!("CARGO_MANIFEST_DIR")],
        )
        .await;
    assert!(ok, "{out}");
    let copy = h.home.join(".local/share/pi-ide-broker/bin/pi-ide-broker");
    assert!(out.contains("copied from npm's package"), "{out}");
    assert_eq!(
        std::fs::read(&copy).ok(),
        std::fs::read(&in_npm).ok(),
        "{out}"
    );
    // The daemon setup started (no service manager here) runs the copy, and the entries name it.
    let record = h
        .read(".local/state/pi-ide-broker/setup.json")
        .expect("setup.json");
    let pid = json_of(&Some(record))["daemon_pid"]
        .as_u64()
        .expect("a daemon pid");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the daemon's exe");
    assert_eq!(exe, copy, "{out}");
    assert!(out.contains(&format!("{} mcp", copy.display())), "{out}");
    assert!(!out.contains("node_modules/pi-ide-broker-linux-x64/vendor/x86_64-unknown-linux-musl/bin/pi-ide-broker mcp"), "{out}");
    let (ok, out) = h
        .run(
            &in_npm,
            &["setup", "--pi-source", env!("CARGO_MANIFEST_DIR")],
        )
        .await;
    assert!(ok && out.contains("is up to date"), "{out}");
    // Without --pi-source, the checkout pi already loads is recognised as this package (by
    // its package.json), and setup installs no second copy beside it.
    let (ok, out) = h.run(&in_npm, &["setup"]).await;
    assert!(ok && out.contains("left as it is"), "{out}");
    // A hint to switch names a folder that is there (issue 52).
    for hint in out
        .lines()
        .filter_map(|l| l.split(" && pi install ").nth(1))
    {
        let dir = hint.split_whitespace().next().unwrap_or_default();
        assert!(
            Path::new(dir).is_dir(),
            "the hint names {dir}, which is not there:\n{out}"
        );
    }
    let (ok, out) = h.run(&in_npm, &["setup", "--undo"]).await;
    assert!(ok, "{out}");
    assert!(
        !copy.exists(),
        "setup --undo left {}:\n{out}",
        copy.display()
    );
}

/// An npm user's `npx pi-ide-broker setup`, with pi already loading `npm:pi-ide-broker`: the
/// same package, left as it is, and no hint to remove it (issue 52: following the old hint
/// removed the working extension and then failed on a folder the npm flow never writes).
#[tokio::test]
async fn setup_from_npm_leaves_the_npm_extension_alone_and_hints_nothing_that_breaks_it() {
    let Some(pi) = find_pi() else { return };
    let h = Home::new(&pi);
    let in_npm = h.home.join(
        ".npm/_npx/1a2b/node_modules/pi-ide-broker-linux-x64/vendor/x86_64-unknown-linux-musl/bin/pi-ide-broker",
    );
    std::fs::create_dir_all(in_npm.parent().expect("parent")).expect("mkdir");
    std::fs::copy(broker_bin(), &in_npm).expect("copy the binary");
    h.write(
        ".pi/agent/settings.json",
        r#"{"packages": ["npm:pi-ide-broker"]}"#,
    );
    let (ok, out) = h.run(&in_npm, &["setup"]).await;
    assert!(ok, "{out}");
    assert!(out.contains("npm:pi-ide-broker; left as it is"), "{out}");
    assert!(!out.contains("pi remove npm:pi-ide-broker"), "{out}");
    assert_eq!(h.pi_packages(), serde_json::json!(["npm:pi-ide-broker"]));
    // The README's bare `pi-ide-broker` exists now: linked in ~/.local/bin to setup's copy,
    // with the PATH line to add where that dir is not on PATH.
    let link = h.home.join(".local/bin/pi-ide-broker");
    let copy = h.home.join(".local/share/pi-ide-broker/bin/pi-ide-broker");
    assert_eq!(std::fs::read_link(&link).ok(), Some(copy.clone()), "{out}");
    assert!(out.contains("export PATH=\""), "{out}");
    // A daemon setup did not start (pi's extension starts one so): setup's own stopped, then
    // one started in the background as pi starts it.
    let setups = json_of(&h.read(".local/state/pi-ide-broker/running.json"))["pid"].as_u64();
    let (ok, out) = h.run(&link, &["stop"]).await;
    assert!(ok, "{out}");
    let start = format!("'{}' daemon >/dev/null 2>&1 </dev/null &", in_npm.display());
    let (ok, out) = h.run(Path::new("/bin/sh"), &["-c", &start]).await;
    assert!(ok, "{out}");
    let running = pi_ide_broker::testkit::eventually("the daemon pi would start", || {
        json_of(&h.read(".local/state/pi-ide-broker/running.json"))["pid"]
            .as_u64()
            .filter(|p| Some(*p) != setups && pi_ide_broker::platform::process::alive(*p as u32))
    })
    .await;
    let (ok, out) = h.run(&in_npm, &["setup", "--undo"]).await;
    assert!(ok, "{out}");
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "setup --undo left {}:\n{out}",
        link.display()
    );
    // And nothing of the daemon runs after the uninstall.
    assert!(
        !pi_ide_broker::platform::process::alive(running as u32),
        "the daemon (pid {running}) still runs after setup --undo:\n{out}"
    );
}

/// The real Claude Code CLI (`PI_IDE_BROKER_CLAUDE`, installed by `.ci/run`), or `None` after
/// saying it is missing.
fn find_claude() -> Option<PathBuf> {
    match std::env::var_os("PI_IDE_BROKER_CLAUDE").map(PathBuf::from) {
        Some(p) if p.exists() => Some(p),
        _ => {
            cannot_run("Claude Code CLI not found: set PI_IDE_BROKER_CLAUDE (bash .ci/run does)");
            None
        }
    }
}

/// With the real `claude` on PATH: `--write` adds the server through `claude mcp add` beside
/// one the user has, a second run leaves it, `--undo` removes only setup's.
#[tokio::test]
async fn claude_code_gets_the_server_through_its_own_cli_and_loses_only_that() {
    let Some(pi) = find_pi() else { return };
    let Some(claude) = find_claude() else { return };
    let mut h = Home::new(&pi);
    let bin_dir = h.home.join("claude-bin");
    std::fs::create_dir_all(&bin_dir).expect("mkdir");
    std::os::unix::fs::symlink(&claude, bin_dir.join("claude")).expect("link claude");
    h.path_prepend(&bin_dir);
    // pi already has the extension (this checkout, a local package it loads where it is):
    // the pi step installs nothing, only checks that pi loads it.
    let source = env!("CARGO_MANIFEST_DIR");
    h.write(
        ".pi/agent/settings.json",
        &json!({"packages": [source]}).to_string(),
    );
    let claude_cli = bin_dir.join("claude");
    let (ok, out) = h
        .run(
            &claude_cli,
            &[
                "mcp",
                "add",
                "--scope",
                "user",
                "other",
                "--",
                "other-server",
            ],
        )
        .await;
    assert!(ok, "{out}");
    let servers = || json_of(&h.read(".claude.json"))["mcpServers"].clone();

    let (ok, out) = h
        .run(&broker_bin(), &["setup", "--write", "--pi-source", source])
        .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("✓ Claude Code: added: claude mcp add --scope user editor --"),
        "{out}"
    );
    let s = servers();
    assert_eq!(
        s["editor"]["args"],
        json!(["mcp", "--dialect", "claude"]),
        "{s}"
    );
    assert_eq!(s["other"]["command"], "other-server", "{s}");
    let (ok, out) = h
        .run(&broker_bin(), &["setup", "--write", "--pi-source", source])
        .await;
    assert!(ok && out.contains("added by an earlier setup"), "{out}");

    let (ok, out) = h.run(&broker_bin(), &["setup", "--undo"]).await;
    assert!(ok, "{out}");
    let s = servers();
    assert!(s.get("editor").is_none(), "{s}");
    assert_eq!(s["other"]["command"], "other-server", "{s}");
    assert_eq!(
        h.pi_packages(),
        json!([source]),
        "undo removed an extension setup did not install"
    );
}

/// pi on a node older than it needs (the system's node 20, first on PATH): setup's ✗ names
/// that node's version and node's own error, and the repair, where it used to show only the
/// stack's tail and `Node.js v20…` (issue 62).
#[tokio::test]
async fn pi_on_an_old_node_is_named_with_the_version_it_needs() {
    let Some(pi) = find_pi() else { return };
    let old = Path::new("/usr/bin/node");
    let version = std::process::Command::new(old)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(u32::MAX);
    if major >= 22 {
        // Nothing to show with this machine's node ({version}); the parsing is a lib test.
        eprintln!(
            "note: no node older than 22 at {} ({version:?})",
            old.display()
        );
        return;
    }
    let mut h = Home::new(&pi);
    let shim = h.home.join("old-node-bin");
    std::fs::create_dir_all(&shim).expect("mkdir");
    script(
        &shim.join("pi"),
        &format!("exec '{}' '{}' \"$@\"", old.display(), pi.cli.display()),
    );
    h.path_prepend(&shim);
    let (ok, out) = h
        .run(
            &broker_bin(),
            &["setup", "--pi-source", env!("CARGO_MANIFEST_DIR")],
        )
        .await;
    assert!(!ok, "setup passed with pi unable to run:\n{out}");
    assert!(
        out.contains(&format!("✗ pi: pi cannot run on node {version}")),
        "{out}"
    );
    assert!(
        out.contains("Error: "),
        "node's own error is not shown:\n{out}"
    );
    assert!(out.contains("→ install node 22"), "{out}");
    let (ok, out) = h.run(&broker_bin(), &["setup", "--undo"]).await;
    assert!(ok, "{out}");
}

/// Where no user service manager answers (a container: `systemctl --user` cannot reach a
/// bus), neither `service status` nor doctor's daemon line offers `service install`, and the
/// command they name instead is one this shell has: the binary's path, as no `pi-ide-broker`
/// is on PATH (issue 62).
#[tokio::test]
async fn without_a_service_manager_no_hint_offers_the_service() {
    let Some(pi) = find_pi() else { return };
    let h = Home::new(&pi);
    let bin = broker_bin();
    let (ok, out) = h.run(&bin, &["service", "status"]).await;
    assert!(!ok, "{out}");
    assert!(
        out.contains("no user service manager answers here") && !out.contains("service install"),
        "{out}"
    );
    assert!(
        out.contains(&format!("`{} daemon`", bin.display())),
        "{out}"
    );
    let (ok, out) = h.run(&bin, &["doctor"]).await;
    assert!(!ok, "{out}");
    let daemon_line: String = out
        .lines()
        .skip_while(|l| !l.contains("daemon:"))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(daemon_line.contains("not running"), "{out}");
    assert!(!daemon_line.contains("service install"), "{daemon_line}");
    assert!(
        daemon_line.contains(&format!("`{} daemon`", bin.display())),
        "{daemon_line}"
    );
}
