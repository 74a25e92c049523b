//! The codex door per request (issue 66): how long Codex waits for `ide-context` once the
//! editor's selection is at the broker. Each request is what Codex 0.171 does: a new connection
//! to the hub socket, one frame, one answer. The daemon runs on a thread of its own (a
//! current-thread runtime, as `pi-ide-broker daemon`), the fake editor on another (it answers
//! the open-tabs call each request makes), the client here. Prints median, p99 and worst per
//! run and over all runs. `cargo bench --bench codex [-- --runs N --requests M]`.

#[cfg(unix)]
mod imp {
    use pi_ide_broker::protocol::family::Family;
    use pi_ide_broker::sys::config::{Config, LockDirConfig};
    use pi_ide_broker::testkit::fake_editor::{FakeEditor, Options};
    use serde_json::{json, Value};
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn arg(name: &str, default: usize) -> usize {
        let args: Vec<String> = std::env::args().collect();
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(default)
    }

    /// A runtime on a thread of its own, running `fut` until the process ends.
    fn on_thread<F>(fut: impl FnOnce() -> F + Send + 'static)
    where
        F: std::future::Future<Output = ()> + 'static,
    {
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(fut());
        });
    }

    async fn ask(socket: &Path, root: &str) -> Value {
        let mut s = tokio::net::UnixStream::connect(socket)
            .await
            .expect("connect");
        let body =
            json!({"type": "request", "requestId": "b", "sourceClientId": "codex-tui", "version": 0,
                          "method": "ide-context", "params": {"workspaceRoot": root}})
            .to_string();
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(body.as_bytes());
        s.write_all(&frame).await.expect("send");
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.expect("answer length");
        let mut buf = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut buf).await.expect("answer");
        serde_json::from_slice(&buf).expect("JSON answer")
    }

    fn stats(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
        v.sort();
        let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        (at(0.5), at(0.99), v[v.len() - 1])
    }

    pub fn main() {
        let runs = arg("--runs", 5);
        let requests = arg("--requests", 200);
        let dir = tempfile::tempdir().expect("tempdir");
        let root: PathBuf = std::fs::canonicalize(dir.path()).expect("canonical");
        let project = root.join("proj");
        std::fs::create_dir_all(project.join("src")).expect("mkdir");
        let file = project.join("src").join("lib.rs").display().to_string();
        let lock_dir = root.join("pi-ide");
        std::fs::create_dir_all(&lock_dir).expect("mkdir");
        let socket = root.join("codex-ipc").join("ipc.sock");
        let mut config = Config {
            lock_dirs: Some(vec![LockDirConfig {
                path: lock_dir.clone(),
                family: Family::Pi,
            }]),
            socket: Some(root.join("run").join("sock")),
            state_dir: Some(root.join("state")),
            log: "warn".into(),
            ..Config::default()
        };
        config.home = Some(root.join("home"));
        config.edit_section(|s: &mut pi_ide_broker::frontdoor::compat::CompatConfig| {
            s.enabled = false
        });
        config.edit_section(|s: &mut pi_ide_broker::frontdoor::gemini::GeminiConfig| {
            s.enabled = false
        });
        config.edit_section(|s: &mut pi_ide_broker::frontdoor::codex::CodexConfig| {
            s.socket = Some(socket.clone())
        });

        let (editor_tx, editor_rx) = std::sync::mpsc::channel();
        let (folder, sel_file) = (project.display().to_string(), file.clone());
        on_thread(move || async move {
            let fe = FakeEditor::start_in(&lock_dir, Options::pi(&[&folder]))
                .await
                .expect("fake editor");
            let _ = editor_tx.send(());
            // Selects once the broker is linked (the bench waits for the answer to carry it).
            loop {
                fe.select(&sel_file, "fn focus", 0);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        editor_rx.recv().expect("the editor started");
        on_thread(move || async move {
            let stop = tokio_util::sync::CancellationToken::new();
            let _ = pi_ide_broker::serve(config, stop, |_, _| {}).await;
        });

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let root = project.display().to_string();
            // Ready once an answer carries the editor's selection.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if socket.exists() {
                    let a = ask(&socket, &root).await;
                    if a["result"]["ideContext"]["activeFile"]["fsPath"] == file.as_str() {
                        break;
                    }
                }
                assert!(Instant::now() < deadline, "the hub never answered with the editor's selection");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            println!("\nCodex /ide: ide-context per request, the editor's selection known  (goal: within 5 ms)");
            println!("  {requests} requests a run, each on a new connection (as Codex makes them), open tabs asked of the editor each time");
            println!("  {:>5} {:>12} {:>12} {:>12}", "run", "median µs", "p99 µs", "worst µs");
            let mut all = Vec::new();
            for run in 1..=runs {
                let mut times = Vec::with_capacity(requests);
                for _ in 0..requests {
                    let t = Instant::now();
                    let a = ask(&socket, &root).await;
                    times.push(t.elapsed());
                    assert_eq!(a["resultType"], "success");
                }
                let (m, p, w) = stats(times.clone());
                println!("  {run:>5} {:>12.0} {:>12.0} {:>12.0}", m.as_secs_f64() * 1e6, p.as_secs_f64() * 1e6, w.as_secs_f64() * 1e6);
                all.extend(times);
            }
            let (m, p, w) = stats(all);
            println!("  {:>5} {:>12.0} {:>12.0} {:>12.0}", "all", m.as_secs_f64() * 1e6, p.as_secs_f64() * 1e6, w.as_secs_f64() * 1e6);
        });
    }
}

fn main() {
    #[cfg(unix)]
    imp::main();
    #[cfg(not(unix))]
    println!("the codex door serves a Unix socket; Codex's Windows pipe is not served yet");
}
