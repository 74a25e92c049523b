//! A real VS Code with the real Claude Code extension: code-server (VS Code in a browser, from
//! npm) on a temp workspace, HOME and user-data dir, with workspace trust off (the extension
//! stays inactive in Restricted Mode), its workbench opened by headless Chromium (the extension
//! host runs only while a browser is attached) through playwright-core, which also drives the
//! workbench where a user would act (`vscode_driver.mjs`). `.ci/run` installs all of it into its
//! cache and exports `PI_IDE_BROKER_VSCODE_NODE`, `PI_IDE_BROKER_CODE_SERVER`,
//! `PI_IDE_BROKER_CLAUDE_VSIX`, `PI_IDE_BROKER_PLAYWRIGHT` and `PI_IDE_BROKER_CHROMIUM`; without
//! them the VS Code tests skip, unless `PI_IDE_BROKER_REQUIRE_ALL=1` (CI), which makes a
//! missing tool a failure.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

/// Bound on each VS Code step (start-up, a lockfile, a driven action): a cold code-server and
/// Chromium take about 10 s on a busy 2-core machine.
pub const VSCODE_WAIT: Duration = Duration::from_secs(120);

/// One code-server + Chromium at a time: each takes a core while starting.
static GATE: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Where the tools are.
#[derive(Clone, Debug)]
pub struct VsCodeInstall {
    pub node: PathBuf,
    pub server: PathBuf,
    pub vsix: PathBuf,
    pub playwright: PathBuf,
    pub chromium: PathBuf,
}

/// The installed tools, or `None` (after saying why) when the test must be skipped.
pub fn find_vscode() -> Option<VsCodeInstall> {
    let var = |k: &str| {
        std::env::var_os(k)
            .map(PathBuf::from)
            .filter(|p| p.exists())
    };
    let found = (|| {
        Some(VsCodeInstall {
            node: var("PI_IDE_BROKER_VSCODE_NODE")?,
            server: var("PI_IDE_BROKER_CODE_SERVER")?,
            vsix: var("PI_IDE_BROKER_CLAUDE_VSIX")?,
            playwright: var("PI_IDE_BROKER_PLAYWRIGHT")?,
            chromium: var("PI_IDE_BROKER_CHROMIUM")?,
        })
    })();
    if found.is_none() {
        let msg = "code-server, the Claude Code vsix, playwright-core or chromium not found: set \
                   PI_IDE_BROKER_VSCODE_NODE, PI_IDE_BROKER_CODE_SERVER, PI_IDE_BROKER_CLAUDE_VSIX, \
                   PI_IDE_BROKER_PLAYWRIGHT and PI_IDE_BROKER_CHROMIUM (bash .ci/run does)";
        crate::common::cannot_run(msg);
    }
    found
}

/// The extension installed once per test process into a shared extensions dir.
fn extensions_dir(install: &VsCodeInstall) -> PathBuf {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("pi-ide-broker-vsc-ext-{}", std::process::id()));
        let data = dir.join("user-data");
        let out = std::process::Command::new(&install.node)
            .arg(&install.server)
            .arg("--extensions-dir")
            .arg(dir.join("ext"))
            .arg("--user-data-dir")
            .arg(&data)
            .arg("--install-extension")
            .arg(&install.vsix)
            .env("HOME", &dir)
            .output()
            .map_err(|e| format!("run code-server --install-extension: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "code-server --install-extension failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(dir.join("ext"))
    });
    r.clone().unwrap_or_else(|e| panic!("{e}"))
}

/// A running code-server with the extension and a browser on its workbench.
pub struct VsCode {
    /// The temp HOME (the extension writes `~/.claude/ide/<port>.lock` here).
    pub home: PathBuf,
    /// `home/.claude/ide`.
    pub lock_dir: PathBuf,
    /// The workspace folder.
    pub workspace: PathBuf,
    /// From spawning code-server to the extension's first lockfile.
    pub startup: Duration,
    server: Child,
    browser: Child,
    browser_in: ChildStdin,
    browser_out: mpsc::UnboundedReceiver<Value>,
    /// Everything code-server and the driver printed (for failure messages).
    log: Log,
    next_id: u64,
    _gate: tokio::sync::SemaphorePermit<'static>,
    /// Its turn among the tests that load the machine (`common::machine_heavy`).
    _heavy: tokio::sync::MutexGuard<'static, ()>,
}

/// Keeps each line of `r` in `log`, tagged; JSON lines go to `json_to` instead, when given.
fn keep_lines(
    r: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    tag: &'static str,
    log: Log,
    json_to: Option<mpsc::UnboundedSender<Value>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(r).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if let Some(tx) = &json_to {
                if let Ok(v) = serde_json::from_str::<Value>(&l) {
                    let _ = tx.send(v);
                    continue;
                }
            }
            if let Ok(mut g) = log.lock() {
                g.push(format!("{tag}: {l}"));
            }
        }
    })
}

impl VsCode {
    /// Starts code-server on a workspace under `root` holding `files` (path, contents), opens
    /// it in Chromium, and waits for the extension's lockfile.
    pub async fn start(install: &VsCodeInstall, root: &Path, files: &[(&str, &str)]) -> VsCode {
        let gate = GATE.acquire().await.expect("the VS Code gate");
        let heavy = super::machine_heavy().await;
        let home = root.join("vsc-home");
        let workspace = root.join("ws");
        for (p, text) in files {
            let path = workspace.join(p);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(path, text).expect("write a workspace file");
        }
        std::fs::create_dir_all(&home).expect("mkdir home");
        let log: Log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let t0 = Instant::now();
        let (server, base) = start_server(install, root, &home, &workspace, &log).await;
        let url = format!("{base}/?folder={}", workspace.display());
        let (browser, browser_in, browser_out) =
            open_browser(install, &root.join("chromium-profile"), &home, &url, &log).await;
        let lock_dir = home.join(".claude").join("ide");
        let mut vsc = VsCode {
            home,
            lock_dir,
            workspace,
            startup: Duration::ZERO,
            server,
            browser,
            browser_in,
            browser_out,
            log,
            next_id: 1,
            _gate: gate,
            _heavy: heavy,
        };
        vsc.wait_lockfile(None).await;
        vsc.startup = t0.elapsed();
        eprintln!(
            "VS Code start-up (code-server + Chromium + extension lockfile): {} ms",
            vsc.startup.as_millis()
        );
        vsc
    }

    /// What code-server and the driver printed so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|g| g.join("\n")).unwrap_or_default()
    }

    /// Waits for a lockfile of the extension other than `not` (a reloaded window writes a new
    /// one); returns its path and JSON.
    pub async fn wait_lockfile(&self, not: Option<&Path>) -> (PathBuf, Value) {
        let found = tokio::time::timeout(VSCODE_WAIT, async {
            loop {
                if let Ok(rd) = std::fs::read_dir(&self.lock_dir) {
                    for e in rd.flatten() {
                        let p = e.path();
                        if p.extension().is_some_and(|x| x == "lock") && Some(p.as_path()) != not {
                            if let Ok(v) = serde_json::from_str::<Value>(
                                &std::fs::read_to_string(&p).unwrap_or_default(),
                            ) {
                                return (p, v);
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        found.unwrap_or_else(|_| {
            panic!(
                "no lockfile of the extension in {}:\n{}",
                self.lock_dir.display(),
                self.log()
            )
        })
    }

    /// Has the driver do `cmd` (see `vscode_driver.mjs`); its error, if it failed.
    pub async fn drive(&mut self, mut cmd: Value) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        cmd["id"] = json!(id);
        self.browser_in
            .write_all(format!("{cmd}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(VSCODE_WAIT, async {
            while let Some(v) = self.browser_out.recv().await {
                if v["id"] == id {
                    return Some(v);
                }
            }
            None
        })
        .await;
        match answer {
            Ok(Some(v)) if v["ok"] == true => Ok(()),
            Ok(Some(v)) => Err(v["error"].as_str().unwrap_or("failed").to_string()),
            Ok(None) => Err(format!("the driver ended:\n{}", self.log())),
            Err(_) => Err(format!("the driver did not answer {cmd}")),
        }
    }
}

impl Drop for VsCode {
    /// Each was started as its own process group (code-server's extension host, Chromium's
    /// renderers): the whole group goes.
    fn drop(&mut self) {
        for child in [&mut self.browser, &mut self.server] {
            if let Some(pid) = child
                .id()
                .and_then(|p| rustix::process::Pid::from_raw(p as i32))
            {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.start_kill();
        }
    }
}

/// What the children printed, kept for failure messages.
type Log = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// Settings for a fresh user-data dir: workspace trust off (the extension stays inactive in
/// Restricted Mode), nothing that reaches the network or opens on its own.
fn write_settings(data: &Path) {
    std::fs::create_dir_all(data.join("User")).expect("mkdir user data");
    std::fs::write(
        data.join("User").join("settings.json"),
        json!({
            "security.workspace.trust.enabled": false,
            "workbench.startupEditor": "none",
            "extensions.autoUpdate": false,
            "extensions.autoCheckUpdates": false,
            "telemetry.telemetryLevel": "off",
            "workbench.tips.enabled": false,
        })
        .to_string(),
    )
    .expect("settings.json");
}

/// code-server on a port of its own choosing (its process group, HOME `home`); returns it and
/// the address it printed.
async fn start_server(
    install: &VsCodeInstall,
    root: &Path,
    home: &Path,
    workspace: &Path,
    log: &Log,
) -> (Child, String) {
    let data = root.join("vsc-data");
    write_settings(&data);
    let mut server = Command::new(&install.node);
    server
        .arg(&install.server)
        .args(["--bind-addr", "127.0.0.1:0", "--auth", "none"])
        .args([
            "--disable-telemetry",
            "--disable-update-check",
            "--disable-workspace-trust",
        ])
        .args(["--disable-getting-started-override"])
        .arg("--extensions-dir")
        .arg(extensions_dir(install))
        .arg("--user-data-dir")
        .arg(&data)
        .arg(workspace)
        .env("HOME", home)
        .env_remove("CLAUDE_CONFIG_DIR")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut server = server.spawn().expect("spawn code-server");
    let (url_tx, mut url_rx) = mpsc::unbounded_channel::<String>();
    let out = server.stdout.take().expect("stdout");
    let l2 = log.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(out).lines();
        while let Ok(Some(l)) = lines.next_line().await {
            if let Some(i) = l.find("http://127.0.0.1:") {
                let _ = url_tx.send(l[i..].trim().trim_end_matches('/').to_string());
            }
            if let Ok(mut g) = l2.lock() {
                g.push(format!("code-server: {l}"));
            }
        }
    });
    keep_lines(
        server.stderr.take().expect("stderr"),
        "code-server",
        log.clone(),
        None,
    );
    let base = tokio::time::timeout(VSCODE_WAIT, url_rx.recv())
        .await
        .ok()
        .flatten();
    let base = base.unwrap_or_else(|| {
        panic!(
            "code-server printed no address: {:?}",
            log.lock().map(|g| g.clone())
        )
    });
    (server, base)
}

/// The playwright driver with Chromium on `url` (a fresh `profile`), once the workbench shows.
async fn open_browser(
    install: &VsCodeInstall,
    profile: &Path,
    home: &Path,
    url: &str,
    log: &Log,
) -> (Child, ChildStdin, mpsc::UnboundedReceiver<Value>) {
    let mut browser = Command::new(&install.node);
    browser
        .arg(driver_script())
        .env("PLAYWRIGHT", &install.playwright)
        .env("CHROMIUM", &install.chromium)
        .env("URL", url)
        .env("PROFILE", profile)
        .env("HOME", home)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut browser = browser.spawn().expect("spawn the playwright driver");
    let (tx, mut out) = mpsc::unbounded_channel();
    keep_lines(
        browser.stdout.take().expect("stdout"),
        "driver",
        log.clone(),
        Some(tx),
    );
    keep_lines(
        browser.stderr.take().expect("stderr"),
        "driver",
        log.clone(),
        None,
    );
    let stdin = browser.stdin.take().expect("stdin");
    let ready = tokio::time::timeout(VSCODE_WAIT, out.recv()).await;
    assert!(
        matches!(&ready, Ok(Some(v)) if v["ready"] == true),
        "the workbench did not open: {ready:?}; {:?}",
        log.lock().map(|g| g.clone())
    );
    (browser, stdin, out)
}

/// `tests/suite/common/vscode_driver.mjs`.
fn driver_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("suite")
        .join("common")
        .join("vscode_driver.mjs")
}
