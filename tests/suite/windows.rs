//! The Windows build under wine: the daemon on its named pipe, `status` and `stop` reaching it,
//! a Claude-family editor (the test kit's fake editor, built for Windows) announcing itself
//! with a Windows lockfile, and a native session (`pi-ide-broker.exe mcp`, stdio) with a `C:\`
//! cwd routed to it, a diff accepted and one rejected, the daemon restarted and the session
//! back. `.ci/run` cross-builds the binaries (x86_64-pc-windows-gnu), puts them beside the
//! one DLL wine 8 lacks, and names wine and that dir in `PI_IDE_BROKER_WINE` and
//! `PI_IDE_BROKER_WINDOWS_BIN`.

use crate::common::process::Proc;
use crate::common::*;
use pi_ide_broker::testkit::within_start;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

/// Wine, the Windows binaries' dir, and a fresh prefix of the test's own.
struct Wine {
    wine: PathBuf,
    bin: PathBuf,
    prefix: PathBuf,
}

impl Wine {
    fn find(root: &Path) -> Option<Wine> {
        let wine = PathBuf::from(std::env::var_os("PI_IDE_BROKER_WINE")?);
        let bin = PathBuf::from(std::env::var_os("PI_IDE_BROKER_WINDOWS_BIN")?);
        Some(Wine {
            wine,
            bin,
            prefix: root.join("prefix"),
        })
    }

    /// `exe args…` under wine, in this test's prefix.
    fn command(&self, exe: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.wine);
        cmd.arg(self.bin.join(exe))
            .args(args)
            .env("WINEPREFIX", &self.prefix)
            .env("WINEDEBUG", "-all")
            .env_remove("RUST_LOG")
            .env_remove("PI_IDE_BROKER_SOCKET")
            .env_remove("PI_IDE_BROKER_CONFIG")
            .kill_on_drop(true);
        cmd
    }

    /// Runs a command of the broker to its end; what it printed (stdout, then stderr).
    async fn run(&self, args: &[&str]) -> String {
        let out = within_start(
            "a broker command under wine",
            self.command("pi-ide-broker.exe", args).output(),
        )
        .await
        .expect("run wine");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

/// One MCP client on the stdio door: lines in, lines out, each awaited with a bound.
struct Stdio_ {
    _proc: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Stdio_ {
    async fn send(&mut self, v: Value) {
        let line = format!("{v}\n");
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    /// The answer to request `id` (notifications on the way are skipped).
    async fn answer(&mut self, id: u64) -> Value {
        within_start("an answer on the stdio door", async {
            loop {
                let line = self.lines.next_line().await.unwrap().expect("door closed");
                let v: Value = serde_json::from_str(&line).unwrap();
                if v["id"] == id {
                    return v;
                }
            }
        })
        .await
    }

    async fn diff(&mut self, id: u64, file: &str) -> Value {
        self.send(
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
            "name": "openDiff", "arguments": {"old_file_path": file, "new_file_path": file,
            "new_file_contents": "x\n", "tab_name": format!("t{id}")}}}),
        )
        .await;
        self.answer(id).await
    }
}

fn first_text(v: &Value) -> &str {
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn under_wine_a_windows_editor_and_session_meet_on_the_pipe_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let Some(w) = Wine::find(dir.path()) else {
        return cannot_run(
            "wine and the Windows build (PI_IDE_BROKER_WINE, PI_IDE_BROKER_WINDOWS_BIN)",
        );
    };
    let _turn = machine_heavy().await;
    // The prefix is made by the first program (about 10 s); later starts take about 1 s.
    let boot = w.run(&["--version"]).await;
    assert!(boot.contains("pi-ide-broker"), "{boot}");

    let mut daemon = Proc::spawn(&mut w.command("pi-ide-broker.exe", &["daemon"]));
    daemon
        .wait_line(&["pi-ide-broker ready", r"\\.\pipe\pi-ide-broker-S-1-5-"])
        .await;
    let st = w.run(&["status"]).await;
    assert!(
        st.contains("No editors found"),
        "status reaches the pipe: {st}"
    );

    // A Claude-family editor on Windows: its lockfile in %USERPROFILE%\.claude\ide.
    let user = std::fs::read_dir(w.prefix.join("drive_c/users"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n != "Public")
        .expect("the wine user's profile");
    let lock_dir = format!(r"C:\users\{user}\.claude\ide");
    let mut editor = Proc::spawn(&mut w.command(
        "fake_editor.exe",
        &[
            "--dir",
            &lock_dir,
            "--family",
            "claude",
            "--folder",
            r"C:\proj",
            "--name",
            "Visual Studio Code",
            "--auto-accept",
            "--reject-named",
            "reject",
        ],
    ));
    let port = editor.wait_line(&["ready "]).await;
    let lock = w.prefix.join(format!(
        "drive_c/users/{user}/.claude/ide/{}.lock",
        port.trim_start_matches("ready ").trim()
    ));
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(text.contains("\"runningInWindows\":true"), "{text}");
    daemon.wait_line(&["editor ready"]).await;

    // A native session whose cwd is a C:\ path, spelt otherwise than the editor's folder.
    let mut door = {
        let mut cmd = w.command(
            "pi-ide-broker.exe",
            &[
                "mcp",
                "--cwd",
                r"c:\Proj\sub",
                "--session",
                "win-1",
                "--dialect",
                "claude",
                "--no-spawn",
            ],
        );
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Stdio_ {
            _proc: child,
            stdin,
            lines,
        }
    };
    door.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
        .await;
    door.answer(1).await;
    door.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    assert_eq!(
        first_text(&door.diff(2, r"C:\proj\keep.txt").await),
        "FILE_SAVED"
    );
    assert_eq!(
        first_text(&door.diff(3, r"C:\proj\reject.txt").await),
        "DIFF_REJECTED"
    );
    let st = w.run(&["status"]).await;
    assert!(
        st.contains(r"C:\proj") && st.contains("win-1"),
        "the route in status: {st}"
    );
    // Reload without a signal: the daemon's reload event.
    let asked = w.run(&["reload"]).await;
    assert!(asked.contains("asked the daemon"), "{asked}");
    daemon.wait_line(&["config reloaded"]).await;

    // Restarted: `stop` reaches it by its stop event, a new daemon starts, and the same
    // session is back on the same editor.
    let stopped = w.run(&["stop"]).await;
    assert!(stopped.contains("stopped the daemon"), "{stopped}");
    assert!(daemon.wait_exit().await.success(), "{:?}", daemon.seen);
    let mut daemon = Proc::spawn(&mut w.command("pi-ide-broker.exe", &["daemon"]));
    daemon.wait_line(&["pi-ide-broker ready"]).await;
    assert_eq!(
        first_text(&door.diff(4, r"C:\proj\again.txt").await),
        "FILE_SAVED"
    );
    let st = w.run(&["status"]).await;
    assert!(st.contains("win-1"), "the session is back: {st}");
    let stopped = w.run(&["stop"]).await;
    assert!(stopped.contains("stopped the daemon"), "{stopped}");
}
