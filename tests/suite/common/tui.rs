//! An interactive terminal program (Claude Code, Codex, Copilot CLI) driven through a pty that
//! `script` (util-linux) allocates, 160×50: what it drew is kept, its cursor-position queries
//! answered as a terminal would, keys typed into it; waits look at the drawn text, which is a
//! byte stream with no event to await (looked at every 50 ms, 60 s at most). The same bytes
//! also go through a terminal emulator (`vt100`), for what is on the screen now: Ink redraws
//! only the cells that changed, so a pointer moved one row up is a lone `❯` in the stream.
//!
//! (`crate::pty` runs a command line to its end at a terminal; this one stays and is talked to.)

use std::num::NonZeroU16;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::mpsc;

/// The terminal's rows.
const ROWS: NonZeroU16 = NonZeroU16::new(50).unwrap();
/// The terminal's columns.
const COLS: NonZeroU16 = NonZeroU16::new(160).unwrap();

/// How long a wait for the screen (or the log) lasts at most.
const WAIT: Duration = Duration::from_secs(60);

/// How [`Tui::type_line`] types.
#[derive(Clone, Copy)]
pub enum Typing {
    /// The whole line in one write (drawn at once), then `settle` before Enter: the input box
    /// takes Enter as a newline while a paste is being drawn.
    Burst { settle: Duration },
    /// A key at a time, `gap` apart (a burst would be read as a paste, whose Enter is a new
    /// line), then `settle` before Enter.
    KeyByKey { gap: Duration, settle: Duration },
}

/// One interactive program in a pty.
pub struct Tui {
    /// Its name in a failed wait's message ("Claude Code").
    name: &'static str,
    child: tokio::process::Child,
    keys: mpsc::UnboundedSender<Vec<u8>>,
    screen: Arc<Mutex<String>>,
    /// The same output rendered as a 160×50 terminal shows it.
    term: Arc<Mutex<vt100::Parser>>,
    typing: Typing,
    /// Where it writes its logs, if it does: shown when a wait fails, and [`Tui::wait_log`]'s.
    logs: Option<PathBuf>,
    /// Set when the pty's output ended: the program exited (a failed wait says so).
    ended: Arc<AtomicBool>,
    /// The screen (as [`Tui::rendered_plain`] gives it) at the last [`Tui::forget`].
    forgotten: Mutex<String>,
}

/// `s` as one shell word.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Tui {
    /// Starts `program` with `args` in `cwd`, at a 160×50 terminal (`TERM=xterm-256color`,
    /// no HTTP proxy: its model is on 127.0.0.1); `env` sets the rest of its environment.
    pub fn start(
        name: &'static str,
        program: &Path,
        args: &[&str],
        cwd: &Path,
        typing: Typing,
        env: impl FnOnce(&mut Command),
    ) -> Tui {
        let mut line = format!(
            "stty cols {COLS} rows {ROWS}; exec {}",
            sh_quote(&program.to_string_lossy())
        );
        for a in args {
            line.push(' ');
            line.push_str(&sh_quote(a));
        }
        let mut cmd = Command::new("script");
        cmd.args(["-qfec", &line, "/dev/null"])
            .current_dir(cwd)
            .env("TERM", "xterm-256color")
            .env("NO_PROXY", "127.0.0.1,localhost")
            .env_remove("HTTP_PROXY")
            .env_remove("HTTPS_PROXY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        env(&mut cmd);
        let mut child = cmd.spawn().expect("spawn script");
        let mut stdin = child.stdin.take().expect("stdin");
        let (keys, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(k) = rx.recv().await {
                if stdin.write_all(&k).await.is_err() {
                    break;
                }
            }
        });
        let screen = Arc::new(Mutex::new(String::new()));
        let term = Arc::new(Mutex::new(vt100::Parser::new(ROWS, COLS, 0)));
        let ended = Arc::new(AtomicBool::new(false));
        // The pty's output is `script`'s stdout; its stderr (its own errors) is not rendered.
        for (mut out, render) in [
            (
                Box::new(child.stdout.take().expect("stdout"))
                    as Box<dyn tokio::io::AsyncRead + Unpin + Send>,
                Some(term.clone()),
            ),
            (Box::new(child.stderr.take().expect("stderr")), None),
        ] {
            let (screen, keys, ended) = (screen.clone(), keys.clone(), ended.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 8192];
                loop {
                    let n = out.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        if render.is_some() {
                            ended.store(true, Ordering::Relaxed);
                        }
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]);
                    // The program asks where the cursor is; a terminal answers.
                    if text.contains("\x1b[6n") {
                        let _ = keys.send(b"\x1b[1;1R".to_vec());
                    }
                    if let Some(term) = &render {
                        term.lock().expect("term").process(&buf[..n]);
                    }
                    screen.lock().expect("screen").push_str(&text);
                }
            });
        }
        Tui {
            name,
            child,
            keys,
            screen,
            term,
            typing,
            logs: None,
            ended,
            forgotten: Mutex::new(String::new()),
        }
    }

    /// The same, with its logs in folder `dir` (every file there read as one log).
    pub fn with_logs(mut self, dir: PathBuf) -> Tui {
        self.logs = Some(dir);
        self
    }

    /// What it drew so far (since the last [`Tui::forget`]), escape sequences left out.
    pub fn screen(&self) -> String {
        strip_escapes(&self.screen.lock().expect("screen"))
    }

    /// Forgets what was drawn so far: a later wait sees only what comes after (a line such as
    /// "Connected to" shown again). What the terminal shows now is noted: it counts again only
    /// once drawn anew.
    pub fn forget(&self) {
        self.screen.lock().expect("screen").clear();
        *self.forgotten.lock().expect("forgotten") = self.rendered_plain();
    }

    /// Whether `text` has been drawn, or is on its screen now (escapes and spaces left out:
    /// the program moves the cursor between words). Both are looked at: a line shown for a
    /// moment is only in the stream, and a line drawn over an older one is only on the screen,
    /// since Ink and ratatui redraw only the cells that change (`via` drawn over a row that had
    /// an `i` in that column is `va` in the stream).
    pub fn shown(&self, text: &str) -> bool {
        let needle = text.replace(' ', "");
        if unspaced(&self.screen()).contains(&needle) {
            return true;
        }
        self.rendered_plain().contains(&needle)
            && !self.forgotten.lock().expect("forgotten").contains(&needle)
    }

    /// The screen as [`Tui::rendered`] gives it, in one string without whitespace.
    fn rendered_plain(&self) -> String {
        unspaced(&self.rendered().concat())
    }

    /// The rows of its screen as a terminal shows them now (trailing spaces left out); unlike
    /// [`Tui::screen`], untouched by [`Tui::forget`].
    pub fn rendered(&self) -> Vec<String> {
        let term = self.term.lock().expect("term");
        term.screen()
            .rows(0, COLS.get())
            .map(|r| r.trim_end().to_string())
            .collect()
    }

    /// Presses ↑, as the terminal's cursor-key mode (which the program sets) spells it.
    pub fn key_up(&self) {
        let application = self
            .term
            .lock()
            .expect("term")
            .screen()
            .application_cursor();
        self.keys(if application { b"\x1bOA" } else { b"\x1b[A" });
    }

    /// Waits until the screen has shown `text`.
    pub async fn wait_for(&self, text: &str) {
        self.poll(&format!("showed {text:?}"), || {
            self.shown(text).then_some(())
        })
        .await;
    }

    /// Waits until the screen has shown one of `texts`; the first of them seen (in the order
    /// given when several are).
    pub async fn wait_any(&self, texts: &[&str]) -> usize {
        self.poll(&format!("showed any of {texts:?}"), || {
            texts.iter().position(|t| self.shown(t))
        })
        .await
    }

    /// Polls `check` every 50 ms until it gives a value, for at most [`WAIT`]; else fails with
    /// what it `never` did and the end of its screen and log.
    pub async fn poll<T>(&self, never: &str, mut check: impl FnMut() -> Option<T>) -> T {
        let polled = tokio::time::timeout(WAIT, async {
            loop {
                if let Some(v) = check() {
                    return v;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        match polled {
            Ok(v) => v,
            Err(_) => panic!("{} never {never}; {}", self.name, self.ends()),
        }
    }

    /// What it logged so far (empty without logs).
    pub fn log(&self) -> String {
        let Some(dir) = &self.logs else {
            return String::new();
        };
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect()
    }

    /// Waits until it has logged `text` `n` times (what it does not draw; its log files read
    /// every 50 ms).
    pub async fn wait_log(&self, text: &str, n: usize) {
        self.poll(&format!("logged {text:?} {n} times"), || {
            (self.log().matches(text).count() >= n).then_some(())
        })
        .await;
    }

    /// Whether it still runs, what it shows now (runs of empty rows folded), the end of what
    /// it drew, and the end of its log if it has one: what a failed wait shows, the most
    /// telling first (CI keeps a panic's first lines).
    pub fn ends(&self) -> String {
        let mut s = String::from(if self.ended.load(Ordering::Relaxed) {
            "it has exited; "
        } else {
            ""
        });
        s.push_str("it shows:\n");
        let mut empty = 0;
        for row in self.rendered() {
            if row.is_empty() {
                empty += 1;
                continue;
            }
            if empty > 0 {
                s.push_str(&format!("[{empty} empty rows]\n"));
                empty = 0;
            }
            s.push_str(&row);
            s.push('\n');
        }
        s.push_str(&format!(
            "its drawing ends:\n{}",
            tail(&self.screen(), 4000)
        ));
        if self.logs.is_some() {
            s.push_str(&format!("\nits log ends:\n{}", tail(&self.log(), 6000)));
        }
        s
    }

    /// Sends `k` as typed.
    pub fn keys(&self, k: &[u8]) {
        let _ = self.keys.send(k.to_vec());
    }

    /// Types `text` (as its [`Typing`] says), waits until it shows, then presses Enter.
    pub async fn type_line(&self, text: &str) {
        let settle = match self.typing {
            Typing::Burst { settle } => {
                self.keys(text.as_bytes());
                settle
            }
            Typing::KeyByKey { gap, settle } => {
                for c in text.chars() {
                    self.keys(c.to_string().as_bytes());
                    tokio::time::sleep(gap).await;
                }
                settle
            }
        };
        self.wait_for(text).await;
        tokio::time::sleep(settle).await;
        self.keys(b"\r");
    }

    /// Ends it.
    pub async fn quit(mut self) {
        let _ = self.child.kill().await;
    }
}

/// `s` without its whitespace.
fn unspaced(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The last `n` bytes of `s` at most (from a character's start).
pub fn tail(s: &str, n: usize) -> &str {
    let mut at = s.len().saturating_sub(n);
    while !s.is_char_boundary(at) {
        at += 1;
    }
    &s[at..]
}

/// `s` without its CSI (`ESC [ … final`) and OSC (`ESC ] … BEL|ST`) sequences.
pub fn strip_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('[') => {
                for d in chars.by_ref() {
                    if ('@'..='~').contains(&d) {
                        break;
                    }
                }
            }
            Some(']') => {
                while let Some(d) = chars.next() {
                    if d == '\x07' || (d == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{Tui, Typing};
    use std::path::Path;
    use std::time::Duration;

    /// `sh -c script` at the test terminal.
    fn sh(script: &str) -> Tui {
        let typing = Typing::Burst {
            settle: Duration::ZERO,
        };
        Tui::start(
            "sh",
            Path::new("sh"),
            &["-c", script],
            Path::new("/"),
            typing,
            |_| {},
        )
    }

    /// Text finished over an older row (only the changed cell drawn, as Ink does) is seen on
    /// the screen though the stream never holds it whole; after a forget, a line still on the
    /// screen counts again only once drawn anew.
    #[tokio::test]
    async fn text_drawn_cell_by_cell_is_seen_and_a_forget_needs_it_drawn_anew() {
        let line = "Neovim (via pi-ide-broker)";
        let tui = sh(
            r#"printf 'Neovim (vXa pi-ide-broker)\033[1;10Hi'; read x; printf '\033[1;1HNeovim (via pi-ide-broker)'; sleep 30"#,
        );
        tui.wait_for(line).await;
        let drawn = super::unspaced(&tui.screen());
        assert!(!drawn.contains("Neovim(viapi"), "{drawn}");
        tui.forget();
        assert!(!tui.shown(line), "on the screen before the forget");
        tui.keys(b"x\r");
        tui.wait_for(line).await;
        tui.quit().await;
    }
}
