//! The `pi-ide-broker` command on the user's `PATH`, however the broker was installed: an
//! npm user's binary sits inside pi's npm folder, so setup links `~/.local/bin/pi-ide-broker`
//! to the binary it set up (issue 52: the README's commands must exist after either install).

use super::record::Record;
use super::{Env, Level, Line, Options};
use std::path::{Path, PathBuf};

/// Where the link goes: `~/.local/bin` (XDG's place for a user's executables).
pub fn bin_dir(home: &Path) -> PathBuf {
    home.join(".local").join("bin")
}

/// Makes `pi-ide-broker` on `PATH` run `env.exe`: nothing when it already does; else a
/// symlink in [`bin_dir`], recorded for `--undo`, and a word when that dir is not on `PATH`.
pub fn step(opts: &Options, env: &Env, rec: &mut Record) -> Line {
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
pub fn undo(opts: &Options, link: &Path, rec: &mut Record) -> Line {
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

/// How the user's shell runs this broker, for a hint: `pi-ide-broker` when one is on `path`
/// (npm's own `node_modules/.bin`, which npx puts in front only while it runs, does not count),
/// else the npm launcher that started this binary (`launcher`: `PI_IDE_BROKER_LAUNCHER`), else
/// this binary's path (issue 62: a hint naming a bare `pi-ide-broker` that is not there).
pub fn shell_command(
    path: Option<&std::ffi::OsStr>,
    exe: &Path,
    launcher: Option<&std::ffi::OsStr>,
) -> String {
    let on_path = path.is_some_and(|p| {
        std::env::split_paths(p)
            .filter(|d| !d.components().any(|c| c.as_os_str() == "node_modules"))
            .any(|d| super::is_executable(&d.join(exe_name())))
    });
    if on_path {
        return "pi-ide-broker".to_string();
    }
    match launcher.map(|l| l.to_string_lossy()) {
        Some(l) if !l.trim().is_empty() => l.into_owned(),
        _ => quoted(&exe.display().to_string()),
    }
}

/// `pi-ide-broker`, with Windows' `.exe`.
fn exe_name() -> &'static str {
    if cfg!(windows) {
        "pi-ide-broker.exe"
    } else {
        "pi-ide-broker"
    }
}

/// `s` as a shell word: as it is when nothing in it is special, else in single quotes.
fn quoted(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+,:@%=~\\".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(dir: &Path) {
        std::fs::create_dir_all(dir).expect("mkdir");
        let p = dir.join(exe_name());
        std::fs::write(&p, "#!/bin/sh\n").expect("write");
        crate::platform::user::set_mode(&p, 0o755).expect("chmod");
    }

    #[test]
    fn a_hint_names_the_command_the_shell_has() {
        let d = tempfile::tempdir().expect("tempdir");
        let npx_bin = d.path().join("_npx/ab/node_modules/.bin");
        let user_bin = d.path().join("bin");
        exec(&npx_bin);
        let exe = Path::new("/opt/my apps/pi-ide-broker");
        let launcher = std::ffi::OsStr::new("~/.pi/agent/npm/node_modules/.bin/pi-ide-broker");
        // Only npx's own bin dir on PATH: the launcher, not a bare name the shell lacks.
        let path = std::env::join_paths([&npx_bin]).expect("PATH");
        assert_eq!(
            shell_command(Some(&path), exe, Some(launcher)),
            "~/.pi/agent/npm/node_modules/.bin/pi-ide-broker"
        );
        assert_eq!(
            shell_command(Some(&path), exe, None),
            "'/opt/my apps/pi-ide-broker'"
        );
        exec(&user_bin);
        let path = std::env::join_paths([&npx_bin, &user_bin]).expect("PATH");
        assert_eq!(
            shell_command(Some(&path), exe, Some(launcher)),
            "pi-ide-broker"
        );
    }
}
