//! The `pi-ide-broker` command on the user's `PATH`, however the broker was installed: an
//! npm user's binary sits inside pi's npm folder, so setup links `~/.local/bin/pi-ide-broker`
//! to the binary it set up (issue 52: the README's commands must exist after either install).

use super::record::Record;
use super::{Env, Level, Line, Options};
use std::path::{Path, PathBuf};

/// Where the link goes: `~/.local/bin` (XDG's place for a user's executables).
pub(super) fn bin_dir(home: &Path) -> PathBuf {
    home.join(".local").join("bin")
}

/// Makes `pi-ide-broker` on `PATH` run `env.exe`: nothing when it already does; else a
/// symlink in [`bin_dir`], recorded for `--undo`, and a word when that dir is not on `PATH`.
pub(super) fn step(opts: &Options, env: &Env, rec: &mut Record) -> Line {
    // npx (and npm's scripts) put the package's own `node_modules/.bin` in front of PATH
    // while setup runs: that is no command the user's shell will find later.
    let on_path = env
        .which_all("pi-ide-broker")
        .into_iter()
        .find(|p| !p.components().any(|c| c.as_os_str() == "node_modules"))
        .and_then(|p| std::fs::canonicalize(p).ok());
    let exe = std::fs::canonicalize(&env.exe).unwrap_or_else(|_| env.exe.clone());
    if on_path.as_deref() == Some(exe.as_path()) {
        return Line::new(
            Level::Ok,
            "command",
            "`pi-ide-broker` on your PATH is this binary",
        );
    }
    let dir = bin_dir(&env.home);
    let link = dir.join("pi-ide-broker");
    let ours = rec.command_link.as_deref() == Some(link.as_path());
    if let Ok(meta) = std::fs::symlink_metadata(&link) {
        if !ours || !meta.file_type().is_symlink() {
            return Line::new(
                Level::Warn,
                "command",
                format!(
                    "{} exists and is not setup's; left as it is",
                    link.display()
                ),
            )
            .fix(format!(
                "remove it, or run this binary by its path: {}",
                env.exe.display()
            ));
        }
    }
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "command",
            format!("would link {} to {}", link.display(), env.exe.display()),
        );
    }
    if !dir.exists() && !rec.created_dirs.contains(&dir) {
        rec.created_dirs.push(dir.clone());
    }
    if let Err(e) = relink(&dir, &link, &env.exe) {
        return Line::new(
            Level::Fail,
            "command",
            format!(
                "cannot link {} to {}: {e}",
                link.display(),
                env.exe.display()
            ),
        )
        .fix(format!(
            "run this binary by its path: {}",
            env.exe.display()
        ));
    }
    rec.command_link = Some(link.clone());
    linked(env, &link, &dir, on_path.filter(|p| *p != exe))
}

/// The link is made: said so, with the `PATH` line to add when the shell would not find it.
fn linked(env: &Env, link: &Path, dir: &Path, other_first: Option<PathBuf>) -> Line {
    let line = Line::new(
        Level::Ok,
        "command",
        format!("{} → {}", link.display(), env.exe.display()),
    );
    let dir_on_path = env
        .path
        .as_ref()
        .is_some_and(|p| std::env::split_paths(p).any(|d| d == dir));
    let why = match other_first {
        None if dir_on_path => return line,
        Some(other) => format!(
            "another pi-ide-broker comes first on your PATH ({})",
            other.display()
        ),
        None => format!("{} is not on your PATH", dir.display()),
    };
    // `$HOME/…` as a profile line is written (and as the README shows it).
    let shown = match dir.strip_prefix(&env.home) {
        Ok(rel) if !env.home.as_os_str().is_empty() => format!("$HOME/{}", rel.display()),
        _ => dir.display().to_string(),
    };
    Line::new(Level::Warn, "command", format!("{}; {why}", line.message)).fix(format!(
        "add it in front: export PATH=\"{shown}:$PATH\" (in ~/.profile or your shell's rc file; for this shell, run it now)"
    ))
}

/// The link replaced atomically (a new name, then renamed over the old one).
fn relink(dir: &Path, link: &Path, target: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".pi-ide-broker.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    crate::platform::user::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
}

/// `--undo`: the link setup made goes (only while it is still a symlink).
pub(super) fn undo(opts: &Options, link: &Path, rec: &mut Record) -> Line {
    if opts.dry_run {
        return Line::new(
            Level::Info,
            "command",
            format!("would remove {}", link.display()),
        );
    }
    let is_link = std::fs::symlink_metadata(link).is_ok_and(|m| m.file_type().is_symlink());
    if is_link {
        if let Err(e) = std::fs::remove_file(link) {
            return Line::new(
                Level::Fail,
                "command",
                format!("cannot remove {}: {e}", link.display()),
            )
            .fix(format!("rm {}", link.display()));
        }
    }
    rec.command_link = None;
    Line::new(Level::Ok, "command", format!("removed {}", link.display()))
}
