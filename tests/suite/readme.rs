//! The README is the user's guide: its user path stays short, and its install block is what a
//! test runs (`install_block_as_written` in `setup`'s tests).

use pi_ide_broker::testkit::START;
use std::path::{Path, PathBuf};

/// The README's text.
pub fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md")
}

/// The commands of the block between the `install-block` markers, one per line.
pub fn install_commands(readme: &str) -> Vec<String> {
    block(readme, "install-block")
}

/// The commands of the ```sh block between `<!-- NAME:begin … -->` and `<!-- NAME:end -->`,
/// one per line, comments and blank lines left out: what a user pastes.
pub fn block(readme: &str, name: &str) -> Vec<String> {
    let begin = format!("<!-- {name}:begin");
    let end_marker = format!("<!-- {name}:end -->");
    let start = readme
        .find(&begin)
        .unwrap_or_else(|| panic!("README has no {begin} marker"));
    let end = readme[start..]
        .find(&end_marker)
        .unwrap_or_else(|| panic!("README has no {end_marker} marker"))
        + start;
    let body = readme[start..end]
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("a ```sh block between the {name} markers"));
    body.lines()
        .map(|l| l.split(" #").next().unwrap_or(l).trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// The README's npm install block: pi installs the package, then setup runs from pi's copy.
pub const README_NPM_SETUP: &str = "~/.pi/agent/npm/node_modules/.bin/pi-ide-broker setup";

#[test]
fn every_install_way_has_its_blocks_and_none_runs_a_tool_of_another_way() {
    let text = readme();
    assert_eq!(
        block(&text, "npm-block"),
        ["pi install npm:pi-ide-broker", README_NPM_SETUP]
    );
    // The npm uninstall never names cargo (an npm user has none), the cargo one never npm.
    let npm = block(&text, "uninstall-npm");
    assert!(npm.iter().all(|c| !c.contains("cargo")), "{npm:?}");
    assert!(
        npm.contains(&"pi remove npm:pi-ide-broker".to_string()),
        "{npm:?}"
    );
    assert_eq!(npm[0], format!("{README_NPM_SETUP} --undo"));
    let cargo = block(&text, "uninstall-cargo");
    assert_eq!(
        cargo,
        [
            "pi-ide-broker setup --undo",
            "cargo uninstall pi-ide-broker"
        ]
    );
    // No bare `npx pi-ide-broker` command: outside pi's folder it prompts and fetches the
    // registry's newest version, not pi's.
    for line in text.lines().filter(|l| !l.starts_with("<!--")) {
        for cmd in line.split('`').skip(1).step_by(2) {
            assert!(
                !cmd.starts_with("npx pi-ide-broker "),
                "the README tells a user to run `{cmd}`"
            );
        }
    }
}

/// The git URL the README's install block names (what a test substitutes).
/// The install block's first line; the test runs it from a clone instead (`--path`).
pub const README_CARGO_INSTALL: &str = "cargo install --locked pi-ide-broker";

#[test]
fn user_path_is_at_most_300_lines() {
    let text = readme();
    let end = text
        .find("<!-- user-path:end")
        .expect("README marks the end of its user path with <!-- user-path:end");
    let lines = text[..end].lines().count();
    assert!(
        lines <= 300,
        "the README's user path is {lines} lines (at most 300)"
    );
}

#[test]
fn install_block_is_two_commands_with_nothing_to_edit() {
    let text = readme();
    let cmds = install_commands(&text);
    assert_eq!(cmds, [README_CARGO_INSTALL, "pi-ide-broker setup"]);
    assert!(
        !text.contains("OWNER"),
        "the README has a placeholder to edit"
    );
    assert!(text.contains("pi install npm:pi-ide-broker"), "no npm path");
}

#[test]
fn every_docs_link_in_the_readme_exists() {
    let text = readme();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for part in text.split("](").skip(1) {
        let target = part.split([')', '#']).next().unwrap_or_default();
        if target.starts_with("http") || target.is_empty() {
            continue;
        }
        assert!(
            root.join(target).exists(),
            "README links to missing {target}"
        );
    }
}

/// The README's two install commands as written, the URL replaced by a `git daemon` serving
/// this repository: `cargo install` builds the release binary from it (minutes: only with
/// `PI_IDE_BROKER_INSTALL_TEST=1`, which `.ci/run` sets), and its `setup` installs the pi
/// extension of the very commit cargo built.
#[tokio::test]
async fn install_block_as_written() {
    // A release build: the flood test's bound does not run beside it.
    let _heavy = crate::common::machine_heavy().await;
    if std::env::var("PI_IDE_BROKER_INSTALL_TEST").as_deref() != Ok("1") {
        crate::common::cannot_run(
            "the README's install block builds a release binary (minutes): set PI_IDE_BROKER_INSTALL_TEST=1 (bash .ci/run does)",
        );
        return;
    }
    let Some(pi) = crate::setup::tools() else {
        return;
    };
    let server = crate::common::git_serve::GitServer::start().await;
    let mut h = crate::setup::Home::new(&pi);
    let user_had = crate::npm_install::tree(&h.home);
    let root = h.home.join("cargo-root");
    h.path_prepend(&root.join("bin"));
    // The build's target dir is kept between runs, so a rerun compiles only this crate. Cargo
    // takes a git package's artifacts for fresh whatever commit they were built from (a
    // commit is assumed never to change), so this crate's own are removed first.
    // (Under CARGO_TARGET_DIR when one is set: `.ci/run` keeps it in its cache.)
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("readme-install");
    forget_this_crate(&target.join("release"));
    let cargo_home = std::env::var_os("CARGO_HOME")
        .unwrap_or_else(|| dirs_home().join(".cargo").into_os_string());
    let env = [
        ("CARGO_INSTALL_ROOT", root.as_os_str()),
        ("CARGO_TARGET_DIR", target.as_os_str()),
        ("CARGO_HOME", cargo_home.as_os_str()),
    ];
    // A clone, as a user has one: installed from with `--path`, and left as it was.
    let clone = h.home.join("src/pi-ide-broker");
    let (ok, out) = h
        .run_with(
            Path::new("git"),
            &["clone", "-q", &server.url, &clone.to_string_lossy()],
            &env,
        )
        .await;
    assert!(ok, "git clone: {out}");
    let from_clone = format!("cargo install --locked --path {}", clone.display());
    for cmd in install_commands(&readme()) {
        let cmd = cmd.replace(README_CARGO_INSTALL, &from_clone);
        let (ok, out) = h.run_with(Path::new("sh"), &["-c", &cmd], &env).await;
        assert!(ok, "`{cmd}` failed:\n{out}");
        if cmd.ends_with("setup") {
            assert!(
                out.contains("pi loads it"),
                "setup did not see pi load the extension:\n{out}"
            );
        }
    }
    // pi started in a project an editor holds autoconnects, through the daemon setup started.
    let model = crate::common::fake_model::FakeModel::start().await;
    h.write(".pi/agent/models.json", &model.models_json());
    let project = h.home.join("project");
    std::fs::create_dir_all(h.home.join(".pi/ide")).expect("mkdir lock dir");
    std::fs::create_dir_all(&project).expect("mkdir project");
    let editor = crate::common::FakeEditor::start_in(
        &h.home.join(".pi/ide"),
        crate::common::Options::pi(&[&project.display().to_string()]),
    )
    .await
    .expect("fake editor");
    let mut session =
        crate::common::pi::Pi::start_installed(&pi, &h.home, &project, &h.env()).await;
    session.toast(0, "Auto-connected to").await;
    drop(session);
    drop(editor);
    let (_, status) = h
        .run_with(
            Path::new("git"),
            &[
                "-C",
                &clone.to_string_lossy(),
                "status",
                "--porcelain",
                "--ignored",
            ],
            &env,
        )
        .await;
    let left: Vec<&str> = status.lines().filter(|l| !l.ends_with("target/")).collect();
    assert!(
        left.is_empty(),
        "the install left files in the clone: {left:?}"
    );
    let (_, version) = h
        .run_with(&root.join("bin/pi-ide-broker"), &["--version"], &env)
        .await;
    assert!(
        version.contains(&server.head[..12]),
        "cargo installed a build of another commit than {}: {version}",
        server.head
    );
    let carried = h.home.join(".local/share/pi-ide-broker/pi-extension");
    assert_eq!(
        pi_ide_broker::cli::setup::pi::installed(&h.home.join(".pi/agent/settings.json")),
        [carried.display().to_string()],
        "setup did not install the extension the binary carries"
    );
    // The README's cargo uninstall, each line as pasted at a terminal; then the HOME holds
    // nothing the broker made (issue 62): what is there was there before, or is cargo's, pi's,
    // npm's, the clone or the test's project.
    let home_env = [("HOME", h.home.as_os_str())];
    // rustup's own settings live in the real HOME (rustup passes where, and which toolchain,
    // to the tests it runs): the terminal's cargo needs them as a user's shell has them.
    let rustup: Vec<(&str, std::ffi::OsString)> = ["RUSTUP_HOME", "RUSTUP_TOOLCHAIN"]
        .into_iter()
        .filter_map(|v| std::env::var_os(v).map(|val| (v, val)))
        .collect();
    let term_env: Vec<(&str, &std::ffi::OsStr)> = h
        .env()
        .into_iter()
        .chain(env)
        .chain(home_env)
        .chain(rustup.iter().map(|(k, v)| (*k, v.as_os_str())))
        .collect();
    for line in block(&readme(), "uninstall-cargo") {
        let (ok, out) = crate::pty::run(&line, &h.home, &term_env, START).await;
        assert!(ok, "`{line}` at a terminal:\n{out}");
    }
    assert_eq!(h.pi_packages(), serde_json::json!([]));
    assert!(!carried.exists(), "setup --undo left {}", carried.display());
    assert!(
        !root.join("bin/pi-ide-broker").exists(),
        "cargo uninstall left the binary"
    );
    let left: Vec<String> = crate::npm_install::made_since(&h.home, &user_had)
        .into_iter()
        .filter(|p| !p.starts_with("cargo-root") && !p.starts_with("src"))
        .collect();
    assert!(left.is_empty(), "the README's uninstall left: {left:#?}");
}

/// Removes this crate's fingerprints and artifacts from a cargo profile dir (dependencies stay).
fn forget_this_crate(profile: &Path) {
    for (dir, prefixes) in [
        (profile.join(".fingerprint"), &["pi-ide-broker-"][..]),
        (
            profile.join("deps"),
            &["pi_ide_broker-", "libpi_ide_broker-"][..],
        ),
    ] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if prefixes.iter().any(|p| name.starts_with(p)) {
                let p = e.path();
                let _ = if p.is_dir() {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
            }
        }
    }
}

/// The real user's home (for cargo's registry cache), not the test's.
fn dirs_home() -> std::path::PathBuf {
    std::env::var_os("HOME")
        .map(Into::into)
        .unwrap_or_else(|| "/".into())
}
