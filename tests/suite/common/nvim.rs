//! A headless Neovim the suite drives: started with plugins on its runtime path and a Lua
//! driver (`T`) loaded, called through `nvim --server <socket> --remote-expr "v:lua.T.<call>"`
//! (`acp_nvim::`, `claudecode_nvim::`, and the real editors of [`super::nvim_editor`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A headless Neovim listening on a socket, and the way to call the driver in it.
pub struct Nvim {
    bin: PathBuf,
    server: PathBuf,
    /// What Neovim printed (the plugins' messages and errors), beside its socket.
    log: PathBuf,
    child: tokio::process::Child,
}

impl Nvim {
    /// A headless Neovim listening on `server`: `rtp` on its runtime path, each of `scripts`
    /// run with `luafile`, in `cwd`, with `env`; once its socket is there. What it prints goes
    /// to a log beside the socket, told when a wait on it times out.
    pub async fn start(
        nvim: &Path,
        server: &Path,
        rtp: &[PathBuf],
        scripts: &[PathBuf],
        cwd: &Path,
        env: &[(&str, PathBuf)],
    ) -> Nvim {
        let mut cmd = tokio::process::Command::new(nvim);
        cmd.args(["--headless", "--clean", "--listen"]).arg(server);
        for d in rtp {
            cmd.arg("--cmd").arg(format!("set rtp+={}", d.display()));
        }
        for s in scripts {
            cmd.arg("-c").arg(format!("luafile {}", s.display()));
        }
        let log = server.with_extension("log");
        let out = std::fs::File::create(&log).expect("create nvim's log");
        cmd.stdout(out.try_clone().expect("dup nvim's log"))
            .stderr(out);
        cmd.current_dir(cwd).kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start nvim");
        pi_ide_broker::testkit::eventually("nvim's socket", || server.exists().then_some(())).await;
        Nvim {
            bin: nvim.to_path_buf(),
            server: server.to_path_buf(),
            log,
            child,
        }
    }

    /// The last 4000 bytes of what Neovim printed.
    pub fn printed(&self) -> String {
        let out = std::fs::read(&self.log).unwrap_or_default();
        String::from_utf8_lossy(&out[out.len().saturating_sub(4000)..]).into_owned()
    }

    /// `v:lua.T.<call>` evaluated in the Neovim (one `--remote-expr` client run, bounded).
    pub async fn call(&self, call: &str) -> String {
        let out = pi_ide_broker::testkit::within(
            &format!("nvim {call}"),
            tokio::process::Command::new(&self.bin)
                .arg("--server")
                .arg(&self.server)
                .arg("--remote-expr")
                .arg(format!("v:lua.T.{call}"))
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("run nvim --remote-expr");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Calls `call` until `done` holds for its answer (every 50 ms, at most 20 s: the chat
    /// buffer has no event a second process can wait on).
    pub async fn until(&self, what: &str, call: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.call(call).await;
            if done(&got) {
                return got;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}; last answer: {got}\nNeovim printed: {}",
                self.printed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A Lua string literal inside a Vim expression.
pub fn lua_str(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

impl Nvim {
    /// Kills Neovim at once (SIGKILL: no autocommand runs, its lockfile stays) and reaps it.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
    }

    /// Quits Neovim as a user does (`:qa!`: its `VimLeavePre` autocommands run) and waits for
    /// the exit (bounded).
    pub async fn quit(mut self) {
        let _ = tokio::process::Command::new(&self.bin)
            .arg("--server")
            .arg(&self.server)
            .arg("--remote-send")
            .arg("<C-\\><C-N>:qa!<CR>")
            .kill_on_drop(true)
            .output()
            .await;
        let _ = pi_ide_broker::testkit::within("nvim's exit", self.child.wait()).await;
    }
}
