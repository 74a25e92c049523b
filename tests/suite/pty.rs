//! A command line run as a user pastes it into a terminal: through `/bin/sh` at a real
//! pseudo-terminal that `script` (util-linux) allocates, so a program that asks only when its
//! input is a terminal (npx's "Ok to proceed? (y)") asks here too. The terminal's input ends
//! at once: a question is answered by end of input, never by a `y`, and its text is in the
//! transcript. (A test that closes stdin instead sees npx say yes silently; at a terminal,
//! npx waits for an answer however its input ends.)

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
/// (its exit status was 0, what the terminal showed). A question (npx's) ends the run at
/// once, as a failure: nobody is there to answer it, and a user would be stuck. Bounded: a
/// line still running after `limit` is killed, and the test fails with what it showed.
pub async fn run(
    line: &str,
    cwd: &Path,
    env: &[(&str, &OsStr)],
    limit: Duration,
) -> (bool, String) {
    use tokio::io::AsyncReadExt;
    let mut child = tokio::process::Command::new("script")
        .args(["-q", "-e", "-c", line, "/dev/null"])
        .current_dir(cwd)
        .env_clear()
        .env("SHELL", "/bin/sh")
        .env("TERM", "dumb")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run script");
    let mut stdout = child.stdout.take().expect("script's stdout");
    let mut bytes = Vec::new();
    let shown = |b: &[u8]| String::from_utf8_lossy(b).replace("\r\n", "\n");
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match stdout.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            }
            if npx_asked(&shown(&bytes)) {
                return true;
            }
        }
    };
    let asked = tokio::time::timeout(limit, read).await;
    match asked {
        Ok(false) => {}
        Ok(true) => {
            let _ = child.kill().await;
            return (
                false,
                format!("{}\n[asked a question; nobody answers]", shown(&bytes)),
            );
        }
        Err(_) => panic!(
            "`{line}` at a terminal still ran after {limit:?}; it showed:\n{}",
            shown(&bytes)
        ),
    }
    let status = tokio::time::timeout(limit, child.wait())
        .await
        .unwrap_or_else(|_| panic!("`{line}` at a terminal did not end after its output did"))
        .expect("wait for script");
    (status.success(), shown(&bytes))
}

/// The words npx prints when it asks before fetching a package.
pub fn npx_asked(transcript: &str) -> bool {
    transcript.contains("Ok to proceed") || transcript.contains("Need to install the following")
}

#[tokio::test]
async fn the_command_sees_a_terminal_and_a_question_ends_the_run() {
    if !available() {
        return crate::common::cannot_run("`script` (util-linux) for a real terminal");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let (ok, out) = run(
        "test -t 0 && test -t 1 && echo at-a-terminal; printf 'Ok to proceed? (y) '; read answer; echo answered",
        dir.path(),
        &[("PATH", path.as_os_str())],
        Duration::from_secs(30),
    )
    .await;
    assert!(!ok, "a question must end the run as a failure: {out}");
    assert!(out.contains("at-a-terminal"), "{out}");
    assert!(npx_asked(&out), "{out}");
    let (ok, out) = run(
        "test -t 0 && echo at-a-terminal",
        dir.path(),
        &[("PATH", path.as_os_str())],
        Duration::from_secs(30),
    )
    .await;
    assert!(ok && out.contains("at-a-terminal"), "{out}");
}
