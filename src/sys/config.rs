//! The typed configuration: `config.example.toml` ⇄ `Config`, defaults and env overrides.
//!
//! `config.example.toml` ⇄ [`Config`], with a default for every key and the environment
//! overrides (`PI_IDE_LOCK_DIR`, `CLAUDE_CONFIG_DIR`, `PI_IDE_BROKER_SOCKET`).

use super::Error;
use crate::protocol::family::Family;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Everything the daemon can be told. A missing file means `Config::default()`.
///
/// An agent door's section (`[compat]`, `[copilot]`, …) is the door's own type, in its folder
/// ([`Section`]); the file's text of it is kept in `doors`, and [`Config::load`] refuses a
/// section that no door knows or that does not parse (a misspelt key included).
#[derive(Clone, Debug, Deserialize)]
#[serde(default)]
pub struct Config {
    /// The broker's Unix socket; `None` means `$XDG_RUNTIME_DIR/pi-ide-broker/sock` or a fallback.
    pub socket: Option<PathBuf>,
    /// Where the state file (sticky targets) lives; `None` means `$XDG_STATE_HOME/pi-ide-broker`.
    pub state_dir: Option<PathBuf>,
    /// The tracing filter, as in `RUST_LOG` (which wins when set).
    pub log: String,
    /// `text` or `json`.
    pub log_format: LogFormat,
    /// The largest WebSocket message accepted from any peer, in bytes.
    pub max_frame_bytes: usize,
    /// The most bytes of long messages (over 2 KiB) that readers may hold at once, across
    /// every connection (`wire::budget`): agents together half of it, one agent realm a
    /// quarter. `None`: four of the largest messages (`4 × max_frame_bytes`). Read at start.
    pub max_frames_in_flight_bytes: Option<usize>,
    /// The lock dirs to watch; `None` means the two default families.
    pub lock_dirs: Option<Vec<LockDirConfig>>,
    /// Link health checking.
    pub health: HealthConfig,
    /// Redial pacing.
    pub backoff: BackoffConfig,
    /// Per-call timeouts.
    pub timeouts: TimeoutConfig,
    /// How editors that keep one client at a time are treated.
    pub editors: EditorsConfig,
    /// How long a lost editor's id is remembered (in `state.json`, across broker restarts) so
    /// a restart of it, even days later, is recognised as its successor and inherits its
    /// sticky targets.
    pub successor_window_ms: u64,
    /// How long sessions stay attached to a vanished editor waiting for its restart.
    pub editor_grace_ms: u64,
    /// A full re-listing of every lock dir on this interval, a safety net for lost events.
    pub rescan_interval_ms: u64,
    /// At most this many connections per door (the native socket; the compat listeners
    /// together) may be in the handshake at once; more are closed at once. Read at start.
    pub max_handshakes: usize,
    /// At most this many sessions may be connected at once; more are refused. Read at start.
    pub max_sessions: usize,
    /// Agents that run elsewhere (a container, a dev box over `ssh -R`): each `[[remote]]`
    /// maps an agent-side prefix to a host folder. Each remote name gets a socket of its own
    /// ([`Config::remote_socket`]) that carries agent rights only.
    pub remote: Vec<crate::protocol::pathmap::RemoteConfig>,
    /// Other uids allowed on the sockets (a container's root reaching a bind-mounted
    /// socket), with an agent's rights. Default: only the owner.
    pub allow_uids: Vec<u32>,
    /// Other uids allowed on the main socket with the owner's rights (follow, prompt and
    /// review any session; the status of all). Default: none.
    pub owner_uids: Vec<u32>,
    /// A graceful stop (pending diffs rejected, sessions told, state flushed) takes at most this long.
    pub shutdown_timeout_ms: u64,
    /// The user's home, where an editor's workspace that is the home itself is a weak match;
    /// `$HOME` when unset. Never read from the file: for a broker a library user (a test)
    /// runs with a home of its own.
    #[serde(skip)]
    pub home: Option<PathBuf>,
    /// The lock dirs the doors that are on write editors' lockfiles into themselves
    /// (`frontdoor::with_door_lock_dirs`), watched beside [`Config::lock_dirs`]'s own.
    #[serde(skip)]
    pub door_lock_dirs: Vec<LockDirConfig>,
    /// Every other table or key of the file: the agent doors' sections, as written. A door
    /// reads its own with [`Config::section`].
    #[serde(flatten)]
    pub doors: toml::Table,
}

/// A door's section of the config file: its type, in the door's folder, with a default for
/// every key, as the core's own sections have.
pub trait Section: serde::Serialize + serde::de::DeserializeOwned + Default {
    /// Its name in the file: `[NAME]`.
    const NAME: &'static str;
}

/// What [`Config::load`] checks a door's section with: its name and a parse of its text.
#[derive(Clone, Copy)]
pub struct SectionCheck {
    /// The section's name.
    pub name: &'static str,
    /// Parses the section's text as the door's type, or says why it does not.
    pub check: fn(&toml::Value) -> Result<(), String>,
}

impl SectionCheck {
    /// The check of `S`'s section.
    pub fn of<S: Section>() -> SectionCheck {
        SectionCheck {
            name: S::NAME,
            check: |text| {
                text.clone()
                    .try_into::<S>()
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        }
    }
}

/// One watched lock dir and the family whose editors write there.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LockDirConfig {
    /// The directory; `~` at the start is the home dir.
    pub path: PathBuf,
    /// Which family (and auth header) its editors use.
    pub family: Family,
}

/// What the broker does when a single-client editor (the Claude Code VS Code extension)
/// drops its link because another client connected.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum SingleClient {
    /// Mark the editor `taken` and leave the other client alone; connect again when a session
    /// calls the editor, or once the other client has left.
    #[default]
    Yield,
    /// Redial at once with backoff, as for any lost link (the two clients evict each other).
    Take,
}

/// `[editors]`: single-client editors.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EditorsConfig {
    /// The policy for every family without its own entry in `single_client_for`.
    pub single_client: SingleClient,
    /// Per-family policy, e.g. `{ claude = "take" }`.
    pub single_client_for: std::collections::HashMap<Family, SingleClient>,
    /// While an editor is `taken`, how often the broker looks (without connecting) whether
    /// the other client is still there.
    pub taken_probe_ms: u64,
}

impl Default for EditorsConfig {
    fn default() -> Self {
        EditorsConfig {
            single_client: SingleClient::Yield,
            single_client_for: std::collections::HashMap::new(),
            taken_probe_ms: 2_000,
        }
    }
}

impl EditorsConfig {
    /// The policy for editors of `family`.
    pub fn single_client(&self, family: Family) -> SingleClient {
        self.single_client_for
            .get(&family)
            .copied()
            .unwrap_or(self.single_client)
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Health-check settings for editor links.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// How often a WebSocket ping goes to each editor.
    pub interval_ms: u64,
    /// A link with no pong this long after a ping is `unhealthy`.
    pub timeout_ms: u64,
    /// An unhealthy link is dropped and redialled after this long (pending diffs then get
    /// `DIFF_REJECTED`); until then it may recover and nothing is lost.
    pub drop_after_ms: u64,
}

/// Capped exponential backoff with jitter for redials.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackoffConfig {
    /// The first delay.
    pub initial_ms: u64,
    /// The cap.
    pub max_ms: u64,
}

/// Timeouts for calls the broker makes or forwards.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutConfig {
    /// Any tool call but `openDiff` (which never times out) gets an error after this long.
    pub short_tool_ms: u64,
    /// TCP connect + WebSocket upgrade + `initialize` + `tools/list` must finish in this long.
    pub handshake_ms: u64,
    /// While a call that carries `_meta.progressToken` (every `openDiff` from pi, Claude Code,
    /// Codex) waits for the editor, the client gets `notifications/progress` this often, so its
    /// own request timeout never cuts a diff the user is still reading.
    pub progress_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: None,
            state_dir: None,
            log: "info".into(),
            log_format: LogFormat::Text,
            max_frame_bytes: 64 * 1024 * 1024,
            max_frames_in_flight_bytes: None,
            lock_dirs: None,
            health: HealthConfig::default(),
            backoff: BackoffConfig::default(),
            timeouts: TimeoutConfig::default(),
            editors: EditorsConfig::default(),
            successor_window_ms: 14 * 24 * 3600 * 1000,
            editor_grace_ms: 10_000,
            rescan_interval_ms: 30_000,
            shutdown_timeout_ms: 5_000,
            home: None,
            door_lock_dirs: Vec::new(),
            doors: toml::Table::new(),
            max_handshakes: 256,
            max_sessions: 4096,
            remote: Vec::new(),
            allow_uids: Vec::new(),
            owner_uids: Vec::new(),
        }
    }
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            interval_ms: 10_000,
            timeout_ms: 5_000,
            drop_after_ms: 60_000,
        }
    }
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial_ms: 200,
            max_ms: 30_000,
        }
    }
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            short_tool_ms: 5_000,
            handshake_ms: 15_000,
            progress_ms: 15_000,
        }
    }
}

impl Config {
    /// Loads `path`; a file that does not exist gives the defaults. `sections` are the doors'
    /// (`frontdoor::sections`): any other table or key of the file is refused.
    pub fn load(path: &Path, sections: &[SectionCheck]) -> Result<Config, Error> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(source) => {
                return Err(Error::Read {
                    path: path.into(),
                    source,
                })
            }
        };
        let config: Config = toml::from_str(&text).map_err(|e| Error::Parse {
            path: path.into(),
            message: one_line_error(&text, &e),
        })?;
        config.check().map_err(|message| Error::Invalid {
            path: path.into(),
            message,
        })?;
        config
            .check_sections(sections)
            .map_err(|message| Error::Parse {
                path: path.into(),
                message,
            })?;
        Ok(config)
    }

    /// Every door section is one of `sections` and parses as its door's type.
    pub fn check_sections(&self, sections: &[SectionCheck]) -> Result<(), String> {
        for (name, text) in &self.doors {
            let Some(known) = sections.iter().find(|s| s.name == name) else {
                let names: Vec<&str> = sections.iter().map(|s| s.name).collect();
                return Err(format!(
                    "unknown key `{name}` (the sections of the doors are: {})",
                    names.join(", ")
                ));
            };
            (known.check)(text).map_err(|e| format!("in [{name}]: {}", e.trim()))?;
        }
        Ok(())
    }

    /// A door's section: as the file has it, else its defaults (one that does not parse was
    /// refused by [`Config::load`]).
    pub fn section<S: Section>(&self) -> S {
        self.doors
            .get(S::NAME)
            .and_then(|text| text.clone().try_into().ok())
            .unwrap_or_default()
    }

    /// Changes a door's section (a test's or a library user's config).
    pub fn edit_section<S: Section>(&mut self, edit: impl FnOnce(&mut S)) {
        let mut section: S = self.section();
        edit(&mut section);
        if let Ok(toml::Value::Table(text)) = toml::Value::try_from(&section) {
            self.doors.insert(S::NAME.into(), toml::Value::Table(text));
        }
    }

    fn check(&self) -> Result<(), String> {
        if self.health.interval_ms == 0 || self.health.timeout_ms == 0 {
            return Err("health.interval_ms and health.timeout_ms must be > 0".into());
        }
        if self.backoff.initial_ms == 0 || self.backoff.max_ms < self.backoff.initial_ms {
            return Err("backoff.initial_ms must be > 0 and <= backoff.max_ms".into());
        }
        if self.max_frame_bytes < 1024 {
            return Err("max_frame_bytes must be at least 1024".into());
        }
        if self
            .max_frames_in_flight_bytes
            .is_some_and(|n| n < self.max_frame_bytes)
        {
            return Err(
                "max_frames_in_flight_bytes must be at least max_frame_bytes (else no message of the largest size could ever be read)"
                    .into(),
            );
        }
        if let Some(r) = self.remote.iter().find(|r| !remote_name_ok(&r.name)) {
            return Err(format!(
                "[[remote]] name {:?} must be 1 to 32 letters, digits, '-', '_' or '.' (it names the remote's socket dir)",
                r.name
            ));
        }
        Ok(())
    }

    /// The budget for long messages in flight: `max_frames_in_flight_bytes`, or four of the
    /// largest messages (two for agents together, one for one agent realm).
    pub fn frames_in_flight_bytes(&self) -> usize {
        self.max_frames_in_flight_bytes
            .unwrap_or_else(|| self.max_frame_bytes.saturating_mul(4))
    }

    /// The remote names, each once, in the order first given.
    pub fn remote_names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for r in &self.remote {
            if !names.contains(&r.name) {
                names.push(r.name.clone());
            }
        }
        names
    }

    /// The socket of the `[[remote]]` named `name`, beside the main socket `main`:
    /// `<main's dir>/remote/<name>/sock`, in a dir of its own so a container can mount the
    /// dir (which outlives a broker restart) without seeing the main socket.
    pub fn remote_socket(main: &Path, name: &str) -> PathBuf {
        main.parent()
            .unwrap_or(Path::new("/"))
            .join("remote")
            .join(name)
            .join("sock")
    }

    /// The default config file: `$XDG_CONFIG_HOME/pi-ide-broker/config.toml` (or the OS equivalent).
    pub fn default_path() -> Option<PathBuf> {
        directories::ProjectDirs::from("", "", "pi-ide-broker")
            .map(|d| d.config_dir().join("config.toml"))
    }

    /// The lock dirs to watch, with `~` expanded and the env overrides applied to the defaults.
    pub fn lock_dirs(&self) -> Vec<LockDirConfig> {
        let mut dirs = self.users_lock_dirs();
        for door in &self.door_lock_dirs {
            if !dirs.iter().any(|d| d.path == door.path) {
                dirs.push(door.clone());
            }
        }
        dirs
    }

    /// The lock dirs of the user's editors: the file's, else the defaults.
    fn users_lock_dirs(&self) -> Vec<LockDirConfig> {
        if let Some(dirs) = &self.lock_dirs {
            return dirs
                .iter()
                .map(|d| LockDirConfig {
                    path: expand_home(&d.path),
                    family: d.family,
                })
                .collect();
        }
        let home = home_dir();
        let pi = env_path("PI_IDE_LOCK_DIR").unwrap_or_else(|| home.join(".pi").join("ide"));
        let claude = env_path("CLAUDE_CONFIG_DIR")
            .map(|d| d.join("ide"))
            .unwrap_or_else(|| home.join(".claude").join("ide"));
        let mut dirs = vec![
            LockDirConfig {
                path: pi,
                family: Family::Pi,
            },
            LockDirConfig {
                path: claude,
                family: Family::Claude,
            },
        ];
        // Inside WSL, the Windows user's editors too (their lockfiles say `runningInWindows`).
        if let Some(win) = crate::sys::wsl::windows_home() {
            for (dir, family) in [(".pi", Family::Pi), (".claude", Family::Claude)] {
                let path = win.join(dir).join("ide");
                if !dirs.iter().any(|d| d.path == path) {
                    dirs.push(LockDirConfig { path, family });
                }
            }
        }
        dirs
    }

    /// The broker socket path: `PI_IDE_BROKER_SOCKET`, then the `socket` key, then
    /// on Windows the user's pipe (`\\.\pipe\pi-ide-broker-<SID>`), else
    /// `$XDG_RUNTIME_DIR/pi-ide-broker/sock`, else `$TMPDIR/pi-ide-broker-<uid>/sock`.
    pub fn socket_path(&self) -> PathBuf {
        if let Some(p) = env_path("PI_IDE_BROKER_SOCKET") {
            return p;
        }
        if let Some(p) = &self.socket {
            return expand_home(p);
        }
        if let Some(pipe) = crate::platform::local::default_path() {
            return pipe;
        }
        if let Some(dir) = env_path("XDG_RUNTIME_DIR") {
            return dir.join("pi-ide-broker").join("sock");
        }
        let uid = crate::platform::user::uid();
        // A client with a cleared environment (Codex starts MCP servers so) still finds the
        // runtime dir systemd-logind made for this user.
        let run_user = PathBuf::from(format!("/run/user/{uid}"));
        if std::fs::metadata(&run_user).is_ok_and(|m| {
            m.is_dir() && crate::platform::user::owner_and_mode(&m).is_some_and(|(o, _)| o == uid)
        }) {
            return run_user.join("pi-ide-broker").join("sock");
        }
        std::env::temp_dir()
            .join(format!("pi-ide-broker-{uid}"))
            .join("sock")
    }

    /// True when the socket path was chosen (`PI_IDE_BROKER_SOCKET` or the `socket` key), not
    /// derived from the environment's defaults.
    pub fn socket_is_explicit(&self) -> bool {
        env_path("PI_IDE_BROKER_SOCKET").is_some() || self.socket.is_some()
    }

    /// Where the running daemon records its socket and pid (`<state dir>/running.json`): a
    /// place that does not depend on `XDG_RUNTIME_DIR` or `TMPDIR`.
    pub fn running_record(&self) -> PathBuf {
        self.state_dir().join("running.json")
    }

    /// The socket to dial: the configured or default one, unless that does not exist and the
    /// running daemon of this user recorded another (it was started with another environment).
    pub fn socket_to_dial(&self) -> PathBuf {
        let socket = self.socket_path();
        if self.socket_is_explicit() || crate::platform::local::exists(&socket) {
            return socket;
        }
        crate::platform::local::running_socket(&self.running_record()).unwrap_or(socket)
    }

    /// The state dir: the `state_dir` key, else `$XDG_STATE_HOME/pi-ide-broker`
    /// (`~/.local/state/pi-ide-broker`), else the OS data-local dir.
    pub fn state_dir(&self) -> PathBuf {
        if let Some(p) = &self.state_dir {
            return expand_home(p);
        }
        user_dir(
            "XDG_STATE_HOME",
            directories::ProjectDirs::data_local_dir,
            "state",
        )
    }

    /// The data dir, for files the broker installs (the pi extension `setup` writes):
    /// `$XDG_DATA_HOME/pi-ide-broker` (`~/.local/share/pi-ide-broker`), or the OS data dir
    /// on macOS (`~/Library/Application Support/pi-ide-broker`).
    pub fn data_dir(&self) -> PathBuf {
        user_dir("XDG_DATA_HOME", directories::ProjectDirs::data_dir, "share")
    }
}

/// `os.tmpdir()` as node computes it on Unix: `$TMPDIR` (`$TMP`, `$TEMP`) without a trailing
/// slash, else `/tmp`; on Windows `%TEMP%` (`%TMP%`, `%SystemRoot%\temp`) without a trailing
/// backslash.
pub fn node_tmpdir() -> PathBuf {
    if cfg!(windows) {
        let dir = ["TEMP", "TMP"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
            .or_else(|| {
                std::env::var("SystemRoot")
                    .ok()
                    .map(|r| format!("{r}\\temp"))
            })
            .unwrap_or_else(|| "C:\\Windows\\temp".into());
        let trimmed = dir.trim_end_matches('\\');
        return PathBuf::from(if trimmed.ends_with(':') {
            dir.as_str()
        } else {
            trimmed
        });
    }
    let dir = ["TMPDIR", "TMP", "TEMP"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "/tmp".into());
    let trimmed = dir.trim_end_matches('/');
    PathBuf::from(if trimmed.is_empty() { "/" } else { trimmed })
}

/// toml's multi-line error as one log-friendly line: "line L, column C: what (at `source`)".
fn one_line_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    let Some(span) = e.span() else { return message };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
    let source = text.lines().nth(line - 1).unwrap_or("").trim();
    format!("line {line}, column {column}: {message} (at `{source}`)")
}

/// The broker's folder of one XDG kind: `$<var>/pi-ide-broker`, else on macOS the OS's dir of
/// that kind (`mac`), else `~/.local/<local>/pi-ide-broker`.
fn user_dir(var: &str, mac: fn(&directories::ProjectDirs) -> &Path, local: &str) -> PathBuf {
    if let Some(p) = env_path(var) {
        return p.join("pi-ide-broker");
    }
    if cfg!(any(target_os = "macos", windows)) {
        if let Some(d) = directories::ProjectDirs::from("", "", "pi-ide-broker") {
            return mac(&d).to_path_buf();
        }
    }
    home_dir().join(".local").join(local).join("pi-ide-broker")
}

/// A `[[remote]]` name that can name a dir: 1–32 of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn remote_name_ok(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The user's home dir (`$HOME`; on Windows `%USERPROFILE%`, as node's `os.homedir()` and
/// so the editors' lockfile writers; else the OS's idea of it, else `/`).
pub fn home_dir() -> PathBuf {
    env_path(if cfg!(windows) { "USERPROFILE" } else { "HOME" })
        .or_else(|| directories::BaseDirs::new().map(|b| b.home_dir().to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("/"))
}

/// A non-empty environment variable as a path (empty means unset, like pi-ide does).
pub fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(|v| expand_home(Path::new(&v)))
}

/// `~` and `~/x` become paths under the home dir; anything else is returned as is.
pub fn expand_home(p: &Path) -> PathBuf {
    match p.strip_prefix("~") {
        Ok(rest) => home_dir().join(rest),
        Err(_) => p.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remote_name_names_a_dir_beside_the_main_socket_and_nothing_else() {
        assert!(remote_name_ok("box") && remote_name_ok("dev-box_1.x"));
        for bad in ["", ".", "..", "a/b", "a b", "é", &"x".repeat(33)] {
            assert!(!remote_name_ok(bad), "{bad:?}");
        }
        assert_eq!(
            Config::remote_socket(Path::new("/run/u/pi-ide-broker/sock"), "box"),
            PathBuf::from("/run/u/pi-ide-broker/remote/box/sock")
        );
        let c: Config =
            toml::from_str("[[remote]]\nname = \"../x\"\nagent = \"/a\"\nhost = \"/b\"\n").unwrap();
        assert!(c.check().unwrap_err().contains("\"../x\""));
        let c: Config = toml::from_str(
            "[[remote]]\nname = \"b\"\nagent = \"/a\"\nhost = \"/b\"\n[[remote]]\nname = \"b\"\nagent = \"/c\"\nhost = \"/d\"\n",
        )
        .unwrap();
        assert_eq!(c.remote_names(), vec!["b".to_string()]);
    }

    #[test]
    fn the_budget_for_frames_in_flight_is_four_of_the_largest_or_at_least_one() {
        let d = Config::default();
        assert_eq!(d.frames_in_flight_bytes(), 256 * 1024 * 1024);
        let c: Config = toml::from_str("max_frame_bytes = 1048576\n").unwrap();
        assert_eq!(
            c.frames_in_flight_bytes(),
            4 << 20,
            "follows max_frame_bytes"
        );
        let c: Config =
            toml::from_str("max_frame_bytes = 1048576\nmax_frames_in_flight_bytes = 1048576\n")
                .unwrap();
        assert!(c.check().is_ok());
        assert_eq!(c.frames_in_flight_bytes(), 1 << 20);
        let c: Config =
            toml::from_str("max_frame_bytes = 1048576\nmax_frames_in_flight_bytes = 1048575\n")
                .unwrap();
        assert!(c
            .check()
            .unwrap_err()
            .contains("max_frames_in_flight_bytes must be at least max_frame_bytes"));
    }

    #[test]
    fn example_config_parses_and_equals_defaults() {
        let text = include_str!("../../config.example.toml");
        let parsed: Config = toml::from_str(text).unwrap();
        let d = Config::default();
        assert_eq!(parsed.log, d.log);
        assert_eq!(parsed.max_frame_bytes, d.max_frame_bytes);
        assert_eq!(
            parsed.max_frames_in_flight_bytes,
            d.max_frames_in_flight_bytes
        );
        assert_eq!(parsed.health.interval_ms, d.health.interval_ms);
        assert_eq!(parsed.health.timeout_ms, d.health.timeout_ms);
        assert_eq!(parsed.health.drop_after_ms, d.health.drop_after_ms);
        assert_eq!(parsed.backoff.initial_ms, d.backoff.initial_ms);
        assert_eq!(parsed.backoff.max_ms, d.backoff.max_ms);
        assert_eq!(parsed.timeouts.short_tool_ms, d.timeouts.short_tool_ms);
        assert_eq!(parsed.timeouts.handshake_ms, d.timeouts.handshake_ms);
        assert_eq!(parsed.successor_window_ms, d.successor_window_ms);
        assert_eq!(parsed.editor_grace_ms, d.editor_grace_ms);
        assert_eq!(parsed.rescan_interval_ms, d.rescan_interval_ms);
        assert_eq!(parsed.shutdown_timeout_ms, d.shutdown_timeout_ms);
        assert_eq!(parsed.editors.single_client, d.editors.single_client);
        assert_eq!(
            parsed.editors.single_client_for,
            d.editors.single_client_for
        );
        assert_eq!(parsed.editors.taken_probe_ms, d.editors.taken_probe_ms);
    }

    #[test]
    fn the_single_client_policy_is_per_family_with_a_default() {
        let c: Config = toml::from_str(
            "[editors]\nsingle_client = \"yield\"\nsingle_client_for = { claude = \"take\" }\n",
        )
        .unwrap();
        assert_eq!(c.editors.single_client(Family::Claude), SingleClient::Take);
        assert_eq!(c.editors.single_client(Family::Pi), SingleClient::Yield);
        assert_eq!(
            Config::default().editors.single_client(Family::Claude),
            SingleClient::Yield
        );
        assert!(toml::from_str::<Config>("[editors]\nsingle_client = \"fight\"\n").is_err());
    }

    #[test]
    fn missing_file_means_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let c = Config::load(&dir.path().join("nope.toml"), &[]).unwrap();
        assert_eq!(c.health.interval_ms, 10_000);
    }

    #[test]
    fn parse_error_names_line_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "log = \"info\"\n[health]\ninterval_ms = \"soon\"\n").unwrap();
        let e = Config::load(&p, &[]).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        assert!(e.contains("interval_ms"), "{e}");
        std::fs::write(&p, "colour = 1\n").unwrap();
        let e = Config::load(&p, &[]).unwrap_err().to_string();
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn lock_dirs_from_file_expand_home() {
        let c: Config =
            toml::from_str("[[lock_dirs]]\npath = \"~/x\"\nfamily = \"claude\"\n").unwrap();
        let dirs = c.lock_dirs();
        assert_eq!(dirs.len(), 1);
        assert_eq!(dirs[0].path, home_dir().join("x"));
        assert_eq!(dirs[0].family, Family::Claude);
    }
}
