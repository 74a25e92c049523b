//! A command line run as a user pastes it into a terminal: through `/bin/sh` at a real
//! pseudo-terminal that `script` (util-linux) allocates, so a program that asks only when its
//! input is a terminal (npx's "Ok to proceed? (y)") asks here too. The terminal's input ends
//! at once: a question is answered by end of input, never by a `y`, and its text is in the
//! transcript. (A test that closes stdin instead sees npx say yes silently.)

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

/// Whether `script` is here (Debian's bsdutils, essential, has it).
pub fn available() -> bool {
    std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `line` with `/bin/sh` at a terminal in `cwd`, with only `env` in its environment;
/// (its exit status was 0, what the terminal showed). Bounded: a line still running after
/// `limit` is killed, and the test fails saying which.
pub async fn run(
    line: &str,
    cwd: &Path,
    env: &[(&str, &OsStr)],
    limit: Duration,
) -> (bool, String) {
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-q", "-e", "-c", line, "/dev/null"])
        .current_dir(cwd)
        .env_clear()
        .env("SHELL", "/bin/sh")
        .env("TERM", "dumb")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(limit, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("`{line}` at a terminal still ran after {limit:?}"))
        .expect("run script");
    let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
    (out.status.success(), text)
}

/// The words npx prints when it asks before fetching a package.
pub fn npx_asked(transcript: &str) -> bool {
    transcript.contains("Ok to proceed") || transcript.contains("Need to install the following")
}

#[tokio::test]
async fn the_command_sees_a_terminal_and_a_question_meets_end_of_input() {
    if !available() {
        return crate::common::cannot_run("`script` (util-linux) for a real terminal");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let (ok, out) = run(
        "test -t 0 && test -t 1 && echo at-a-terminal; printf 'Ok to proceed? (y) '; read answer || echo no-answer",
        dir.path(),
        &[("PATH", path.as_os_str())],
        Duration::from_secs(30),
    )
    .await;
    assert!(ok, "{out}");
    assert!(out.contains("at-a-terminal"), "{out}");
    assert!(out.contains("no-answer") && npx_asked(&out), "{out}");
}
