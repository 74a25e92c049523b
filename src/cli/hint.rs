//! The command a hint names: what the user's shell runs this broker by.
//!
//! A hint naming a bare `pi-ide-broker` that is not on `PATH`, or `service install` where no
//! service manager answers, is a dead end. A leaf: `status`, `doctor`, `service` and `setup`
//! use it.

use std::path::{Path, PathBuf};

/// `args` after the command that runs this broker from the user's shell (see
/// [`shell_command`]): `pi-ide-broker daemon`, or for an npm install without setup, pi's own
/// launcher.
pub fn hint(args: &str) -> String {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("pi-ide-broker"));
    let launcher = std::env::var_os("PI_IDE_BROKER_LAUNCHER");
    let cmd = shell_command(
        std::env::var_os("PATH").as_deref(),
        &exe,
        launcher.as_deref(),
    );
    format!("{cmd} {args}")
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| crate::platform::user::is_executable(&m))
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
            .any(|d| is_executable(&d.join(exe_name())))
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
