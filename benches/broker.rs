//! `cargo bench`: the broker against the direct path, side by side in one run, against the
//! same fake editor. Prints one table per measurement (p50/p99 and the broker's overhead).
//! The broker runs as its own (release) process, as it does for users; the fake editor and
//! the clients run in this process.

use pi_ide_broker::testkit::agent::Agent;
use pi_ide_broker::testkit::fake_editor::{FakeEditor, Options};
use pi_ide_broker::testkit::pi_client::{find_candidates, PiClient};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;

const CALLS: usize = 10_000;

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Row {
    name: String,
    direct: Vec<Duration>,
    broker: Vec<Duration>,
}

fn print_table(title: &str, rows: &mut [Row], goal: &str) {
    println!("\n{title}  (goal: {goal})");
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>7}",
        "path",
        "direct p50",
        "direct p99",
        "broker p50",
        "broker p99",
        "added p50",
        "added p99",
        "ratio"
    );
    for r in rows.iter_mut() {
        r.direct.sort();
        r.broker.sort();
        let (d50, d99, b50, b99) = (
            pct(&r.direct, 0.5),
            pct(&r.direct, 0.99),
            pct(&r.broker, 0.5),
            pct(&r.broker, 0.99),
        );
        println!(
            "{:<34} {:>8.1}µs {:>8.1}µs {:>8.1}µs {:>8.1}µs {:>8.1}µs {:>8.1}µs {:>6.2}x",
            r.name,
            us(d50),
            us(d99),
            us(b50),
            us(b99),
            us(b50) - us(d50),
            us(b99) - us(d99),
            us(b50) / us(d50).max(0.001)
        );
    }
}

struct Daemon {
    /// Killed on drop.
    _child: tokio::process::Child,
    root: PathBuf,
    pid: u32,
}

impl Daemon {
    async fn start(root: &Path) -> Daemon {
        std::fs::create_dir_all(root.join("pi-ide")).unwrap();
        let cfg = root.join("config.toml");
        std::fs::write(
            &cfg,
            format!(
                "socket = \"{r}/run/sock\"\nstate_dir = \"{r}/state\"\nlog = \"warn\"\n[compat]\nlock_dir = \"{r}/compat\"\n[[lock_dirs]]\npath = \"{r}/pi-ide\"\nfamily = \"pi\"\n",
                r = root.display()
            ),
        )
        .unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pi-ide-broker"))
            .arg("--config")
            .arg(&cfg)
            .arg("daemon")
            .env_remove("RUST_LOG")
            .env_remove("PI_IDE_BROKER_SOCKET")
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the broker (cargo bench builds it)");
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        tokio::spawn(async move {
            while let Ok(Some(l)) = lines.next_line().await {
                eprintln!("broker: {l}")
            }
        });
        let pid = child.id().unwrap();
        let sock = root.join("run/sock");
        let t = Instant::now();
        while pi_ide_broker::client::get_json(&sock, "/v1/status")
            .await
            .is_err()
        {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "broker did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Daemon {
            _child: child,
            root: root.to_path_buf(),
            pid,
        }
    }

    fn socket(&self) -> PathBuf {
        self.root.join("run/sock")
    }

    async fn wait_ready(&self, n: usize) {
        let t = Instant::now();
        loop {
            let st = pi_ide_broker::client::get_json(&self.socket(), "/v1/status")
                .await
                .unwrap();
            let ready = st["editors"]
                .as_array()
                .map(|a| a.iter().filter(|e| e["state"] == "ready").count())
                .unwrap_or(0);
            if ready >= n {
                return;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "editors not ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn timed_calls_pi(c: &mut PiClient, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let r = c.tool("echo", json!({"i": i})).await.unwrap();
        out.push(t.elapsed());
        debug_assert!(r.get("result").is_some());
    }
    out
}

async fn timed_calls_agent(a: &mut Agent, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let id = json!(i);
        a.call_tool(id.clone(), "echo", json!({"i": i})).await;
        a.answer(&id).await;
        out.push(t.elapsed());
    }
    out
}

async fn compat_candidate(root: &Path, cwd: &str) -> pi_ide_broker::testkit::pi_client::Candidate {
    loop {
        if let Some(c) = find_candidates(&root.join("compat"), cwd).await.pop() {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn round_trips(root: &Path, d: &Daemon, fe: &FakeEditor) {
    let mut rows = Vec::new();
    // Warm-up both paths, then 1 session.
    let mut direct = PiClient::connect_with(fe.port, "x-pi-ide-authorization", fe.token(), None)
        .await
        .unwrap();
    let mut native = Agent::open(&d.socket(), "/bench", None).await;
    native
        .until("attached", |v| v["method"] == "broker/attached")
        .await;
    let cand = compat_candidate(root, "/bench").await;
    let mut compat = PiClient::connect(&cand).await.unwrap();
    timed_calls_pi(&mut direct, 500).await;
    timed_calls_agent(&mut native, 500).await;
    timed_calls_pi(&mut compat, 500).await;
    let dir1 = timed_calls_pi(&mut direct, CALLS).await;
    let nat1 = timed_calls_agent(&mut native, CALLS).await;
    let dir1b = timed_calls_pi(&mut direct, CALLS).await;
    let com1 = timed_calls_pi(&mut compat, CALLS).await;
    rows.push(Row {
        name: format!("1 session, native door ({CALLS})"),
        direct: dir1,
        broker: nat1,
    });
    rows.push(Row {
        name: format!("1 session, compat door ({CALLS})"),
        direct: dir1b,
        broker: com1,
    });

    // 32 concurrent sessions.
    let per = CALLS / 32;
    let all_direct = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (port, token, out) = (fe.port, fe.token().to_string(), all_direct.clone());
        tasks.push(tokio::spawn(async move {
            let mut c = PiClient::connect_with(port, "x-pi-ide-authorization", &token, None)
                .await
                .unwrap();
            let v = timed_calls_pi(&mut c, per).await;
            out.lock().unwrap().extend(v);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for (door, name) in [
        ("native", "32 sessions, native door"),
        ("compat", "32 sessions, compat door"),
    ] {
        let all = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..32 {
            let out = all.clone();
            let sock = d.socket();
            let cand = cand.clone();
            let door = door.to_string();
            tasks.push(tokio::spawn(async move {
                let v = if door == "native" {
                    let mut a = Agent::open(&sock, "/bench", None).await;
                    a.until("attached", |v| v["method"] == "broker/attached")
                        .await;
                    timed_calls_agent(&mut a, per).await
                } else {
                    let mut c = PiClient::connect(&cand).await.unwrap();
                    timed_calls_pi(&mut c, per).await
                };
                out.lock().unwrap().extend(v);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let broker = std::mem::take(&mut *all.lock().unwrap());
        rows.push(Row {
            name: format!("{name} ({} calls)", broker.len()),
            direct: all_direct.lock().unwrap().clone(),
            broker,
        });
    }
    print_table(
        "tools/call round trip (short tool, answered at once)",
        &mut rows,
        "broker adds <= 60 µs p50, <= 500 µs p99",
    );
}

/// What the fan-out readers share: when each selection was sent, and the latencies seen.
#[derive(Default)]
struct Probe {
    sent: Mutex<Vec<Instant>>,
    lat: Mutex<Vec<Duration>>,
    got: std::sync::atomic::AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Probe {
    fn seen(&self, v: &serde_json::Value) {
        let Some(seq) = v["params"]["text"]
            .as_str()
            .and_then(|t| t.strip_prefix("seq "))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            return;
        };
        let at = self.sent.lock().unwrap().get(seq).copied();
        if let Some(at) = at {
            self.lat.lock().unwrap().push(at.elapsed());
            self.got.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.notify.notify_one();
        }
    }
}

/// The editor sends `rounds` selections, each once every reader got the previous one.
async fn run_fan_out(
    fe: &FakeEditor,
    probe: &Arc<Probe>,
    readers: usize,
    rounds: usize,
) -> Vec<Duration> {
    tokio::time::sleep(Duration::from_millis(300)).await; // replays drained
    for round in 0..rounds {
        probe.sent.lock().unwrap().push(Instant::now());
        fe.select("/bench/f.rs", &format!("seq {round}"), round as u64);
        let t = Instant::now();
        while probe.got.load(std::sync::atomic::Ordering::SeqCst) < readers * (round + 1)
            && t.elapsed() < Duration::from_secs(5)
        {
            let _ = tokio::time::timeout(Duration::from_millis(50), probe.notify.notified()).await;
        }
    }
    let v = probe.lat.lock().unwrap().clone();
    v
}

async fn fan_outs(d: &Daemon, fe: &FakeEditor) {
    let mut rows = Vec::new();
    for n in [1usize, 100, 1000] {
        // Direct: n clients on the editor itself.
        let probe = Arc::new(Probe::default());
        let mut tasks = Vec::new();
        for _ in 0..n {
            let mut c = PiClient::connect_with(fe.port, "x-pi-ide-authorization", fe.token(), None)
                .await
                .unwrap();
            let p = probe.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(v) = c.next_message().await {
                    p.seen(&v);
                }
            }));
        }
        let direct = run_fan_out(fe, &probe, n, 20).await;
        tasks.iter().for_each(|t| t.abort());
        // Through the broker: n native sessions.
        let probe = Arc::new(Probe::default());
        let mut tasks = Vec::new();
        for _ in 0..n {
            let mut a = Agent::open(&d.socket(), "/bench", None).await;
            a.until("attached", |v| v["method"] == "broker/attached")
                .await;
            let p = probe.clone();
            tasks.push(tokio::spawn(async move {
                while let Some(v) = a.next_unbounded().await {
                    p.seen(&v);
                }
            }));
        }
        let broker = run_fan_out(fe, &probe, n, 20).await;
        tasks.iter().for_each(|t| t.abort());
        rows.push(Row {
            name: format!("{n} sessions x 20 selections"),
            direct,
            broker,
        });
    }
    print_table(
        "selection_changed fan-out (editor → every attached session)",
        &mut rows,
        "p99 <= 5 ms at 1000",
    );
}

fn proc_stat(pid: u32) -> (u64, u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss_kb, ticks, fds)
}

async fn scale(root: &Path, d: &Daemon, idle: Duration) {
    let (rss0, _, fds0) = proc_stat(d.pid);
    let mut editors = Vec::new();
    for i in 0..64 {
        editors.push(
            FakeEditor::start_in(&root.join("pi-ide"), Options::pi(&[&format!("/scale/{i}")]))
                .await
                .unwrap(),
        );
    }
    d.wait_ready(64).await;
    let mut sessions = Vec::new();
    for s in 0..1000 {
        let mut a = Agent::open(&d.socket(), &format!("/scale/{}/s", s % 64), None).await;
        a.until("attached", |v| v["method"] == "broker/attached")
            .await;
        sessions.push(a);
    }
    let (rss, t0, fds) = proc_stat(d.pid);
    tokio::time::sleep(idle).await;
    let (_, t1, _) = proc_stat(d.pid);
    let hz = 100.0; // USER_HZ on Linux
    let cpu = (t1 - t0) as f64 / hz / idle.as_secs_f64() * 100.0;
    println!("\nScale: 64 editors + 1000 sessions attached  (goal: RSS <= 64 MiB, ~0 % idle CPU)");
    println!(
        "  daemon RSS      {:>8.1} MiB  (empty daemon: {:.1} MiB)",
        rss as f64 / 1024.0,
        rss0 as f64 / 1024.0
    );
    println!("  daemon open fds {:>8}      (empty daemon: {fds0})", fds);
    println!(
        "  daemon CPU idle {:>8.2} %    over {} s (health pings every 10 s to 64 editors)",
        cpu,
        idle.as_secs()
    );
    drop(sessions);
    drop(editors);
}

async fn discovery(root: &Path, d: &Daemon) {
    let mut lat = Vec::new();
    let mut keep = Vec::new();
    for i in 0..100 {
        let cwd = format!("/disc/{i}");
        let mut a = Agent::open(&d.socket(), &cwd, None).await;
        let fe = FakeEditor::start(Options::pi(&[&cwd])).await.unwrap();
        let t = Instant::now();
        fe.write_lockfile(&root.join("pi-ide")).unwrap();
        a.until("attached", |v| v["method"] == "broker/attached")
            .await;
        lat.push(t.elapsed());
        keep.push((a, fe));
    }
    for (_, fe) in &keep {
        fe.remove_lockfile();
    }
    lat.sort();
    println!("\nDiscovery: lockfile written → editor ready and the waiting session attached (100 editors)");
    println!(
        "  p50 {:>8.2} ms   p99 {:>8.2} ms   max {:>8.2} ms",
        us(pct(&lat, 0.5)) / 1000.0,
        us(pct(&lat, 0.99)) / 1000.0,
        us(*lat.last().unwrap()) / 1000.0
    );
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        println!(
            "pi-ide-broker benchmarks — {} cores, {}",
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(0),
            std::env::consts::ARCH
        );
        let d = Daemon::start(root).await;
        let fe = FakeEditor::start_in(&root.join("pi-ide"), Options::pi(&["/bench"]))
            .await
            .unwrap();
        d.wait_ready(1).await;
        round_trips(root, &d, &fe).await;
        fan_outs(&d, &fe).await;
        discovery(root, &d).await;
        drop(d);
        // Scale on a fresh daemon, so earlier runs' allocations do not count.
        let dir2 = tempfile::tempdir().unwrap();
        let d2 = Daemon::start(dir2.path()).await;
        scale(
            dir2.path(),
            &d2,
            Duration::from_secs(if quick { 5 } else { 30 }),
        )
        .await;
    });
}
