//! The last part of `setup --undo`, once everything setup recorded is taken back and no daemon
//! runs: what the broker itself made goes too (issue 62: the state, the log, the lock in the
//! state dir and in the socket dir, the compat entries' dir, and the dirs setup created), so
//! that an uninstall leaves nothing of the broker behind. Never the user's own: the config
//! file, a dir setup did not create, anything in a dir the configuration points elsewhere
//! but the broker's own file names.

use super::{background, Env, Level, Line, Options};
use std::path::{Path, PathBuf};

/// The files the daemon and setup write in their dirs (the state dir, the socket dir, the
/// data dir), by name: all that is removed from a dir the configuration chose.
const OWN_FILES: &[&str] = &[
    "daemon.lock",
    "running.json",
    "daemon.log",
    "state.json",
    "setup.json",
    "sock",
];

/// Removes what the broker made; `created` are the dirs setup recorded creating.
pub(super) fn purge(opts: &Options, env: &Env, created: &[PathBuf], emit: &mut impl FnMut(Line)) {
    if background::answering(env) {
        emit(
            Line::new(
                Level::Warn,
                "state",
                format!(
                    "a daemon still answers on {} (a pi session or an agent's `mcp` door started it again): its state, log and lock stay",
                    env.socket.display()
                ),
            )
            .fix(format!(
                "quit pi and the agents using the broker, then run `{}` again",
                super::hint("setup --undo")
            )),
        );
        return;
    }
    let mut gone = Vec::new();
    for dir in broker_dirs(env) {
        match remove_own(opts, &dir) {
            Ok(true) => gone.push(dir),
            Ok(false) => {}
            Err(e) => emit(
                Line::new(
                    Level::Fail,
                    "state",
                    format!("cannot remove {}: {e}", dir.display()),
                )
                .fix(format!("remove it by hand: rm -r {}", dir.display())),
            ),
        }
    }
    for dir in empty_parents(env, created) {
        if is_empty_dir(&dir) && (opts.dry_run || std::fs::remove_dir(&dir).is_ok()) {
            gone.push(dir);
        }
    }
    if !gone.is_empty() {
        let list: Vec<String> = gone.iter().map(|d| d.display().to_string()).collect();
        let (level, verb) = if opts.dry_run {
            (Level::Info, "would remove")
        } else {
            (Level::Ok, "removed")
        };
        emit(Line::new(
            level,
            "state",
            format!("{verb} what the broker made: {}", list.join(", ")),
        ));
    }
    if let Some(cache) = npx_copy(&env.exe, &env.home) {
        emit(
            Line::new(
                Level::Info,
                "npx",
                format!(
                    "npx keeps the copy of pi-ide-broker it fetched in its cache, {}",
                    cache.display()
                ),
            )
            .fix(format!(
                "rm -rf {} (npm's npx cache: npx fetches again when it is next used)",
                cache.display()
            )),
        );
    }
}

/// The broker's own dirs: the state dir, the data dir, each socket dir (the configured one,
/// the running daemon's, the default), and the compat entries' dir.
fn broker_dirs(env: &Env) -> Vec<PathBuf> {
    let mut dirs = vec![env.state_dir.clone(), env.data_dir.clone()];
    if !cfg!(windows) {
        for socket in [&env.socket, &env.default_socket] {
            if let Some(d) = socket.parent() {
                dirs.push(d.to_path_buf());
            }
        }
    }
    dirs.push(env.compat_dir.clone());
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let fresh = !seen.contains(d);
        seen.push(d.clone());
        fresh
    });
    dirs
}

/// Whether `dir` is the broker's by its name (`pi-ide-broker`, `pi-ide-broker-<uid>`, or the
/// compat dir `ide-broker` under `~/.pi`): all of it is the broker's.
fn named_ours(dir: &Path) -> bool {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let in_pi = dir
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|p| p == ".pi");
    name == "pi-ide-broker"
        || name
            .strip_prefix("pi-ide-broker-")
            .is_some_and(|uid| !uid.is_empty() && uid.chars().all(|c| c.is_ascii_digit()))
        || (name == "ide-broker" && in_pi)
}

/// Removes `dir` whole when it is the broker's by name, else only the broker's files in it
/// (and `dir` when that leaves it empty); whether anything went.
fn remove_own(opts: &Options, dir: &Path) -> std::io::Result<bool> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(false);
    }
    if named_ours(dir) {
        if !opts.dry_run {
            std::fs::remove_dir_all(dir)?;
        }
        return Ok(true);
    }
    let mut any = false;
    for name in OWN_FILES {
        let p = dir.join(name);
        if std::fs::symlink_metadata(&p).is_ok() {
            if !opts.dry_run {
                std::fs::remove_file(&p)?;
            }
            any = true;
        }
    }
    Ok(any)
}

/// Dirs to remove when empty, deepest first: those setup created, and the parents the
/// broker's default dirs sit in (`~/.local/state`, `~/.local/share`, `~/.local`) and `~/.pi`,
/// which a cargo user without pi has only from the broker's compat dir. An empty dir holds
/// nothing of the user's; one with anything in it stays.
fn empty_parents(env: &Env, created: &[PathBuf]) -> Vec<PathBuf> {
    let home = &env.home;
    let mut dirs: Vec<PathBuf> = created.to_vec();
    for (dir, parent) in [
        (&env.state_dir, home.join(".local/state")),
        (&env.data_dir, home.join(".local/share")),
        (&env.compat_dir, home.join(".pi")),
    ] {
        if dir.parent() == Some(parent.as_path()) {
            dirs.push(parent);
        }
    }
    dirs.push(home.join(".local"));
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs.dedup();
    dirs
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none())
}

/// The npx cache entry this binary runs from (`~/.npm/_npx/<hash>`), if it does.
fn npx_copy(exe: &Path, home: &Path) -> Option<PathBuf> {
    let npx = home.join(".npm").join("_npx");
    let rest = exe.strip_prefix(&npx).ok()?;
    rest.components().next().map(|c| npx.join(c.as_os_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_brokers_dirs_count_as_its_own_by_name() {
        assert!(named_ours(Path::new("/h/.local/state/pi-ide-broker")));
        assert!(named_ours(Path::new("/tmp/pi-ide-broker-1000")));
        assert!(named_ours(Path::new("/h/.pi/ide-broker")));
        assert!(!named_ours(Path::new("/h/ide-broker")));
        assert!(!named_ours(Path::new("/tmp/pi-ide-broker-backup")));
        assert!(!named_ours(Path::new("/h")));
        assert!(!named_ours(Path::new("/tmp")));
    }

    #[test]
    fn a_dir_the_config_chose_loses_only_the_brokers_files() {
        let d = tempfile::tempdir().expect("tempdir");
        let mine = d.path().join("notes.txt");
        std::fs::write(&mine, "mine").expect("write");
        std::fs::write(d.path().join("daemon.log"), "log").expect("write");
        std::fs::write(d.path().join("running.json"), "{}").expect("write");
        let removed = remove_own(&Options::default(), d.path()).expect("remove");
        assert!(removed);
        assert!(mine.exists(), "the user's file went");
        assert!(!d.path().join("daemon.log").exists());
        assert!(!d.path().join("running.json").exists());
    }

    #[test]
    fn an_npx_copy_is_named_by_its_cache_entry() {
        let home = Path::new("/h");
        let exe = home
            .join(".npm/_npx/1a2b/node_modules/pi-ide-broker-linux-x64/vendor/x/bin/pi-ide-broker");
        assert_eq!(npx_copy(&exe, home), Some(home.join(".npm/_npx/1a2b")));
        assert_eq!(npx_copy(Path::new("/usr/bin/pi-ide-broker"), home), None);
    }
}
