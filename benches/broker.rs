//! `cargo bench`: the broker against the direct path, side by side in one run, against the
//! same fake editor. Prints one table per measurement (p50/p99 and the broker's overhead).
//! The broker runs as its own (release) process, as it does for users; the fake editor and
//! the clients run in this process.
//!
//! Options (after `cargo bench --bench broker --`): `--quick` (fewer calls), `--only LIST`
//! (some of fake,realistic,roundtrip,fanout,discovery,scale), `--sessions N` (only that many
//! sessions in the tables against the relay). `PI_IDE_BROKER_BENCH_LOG` sets the daemon's log
//! filter (default `warn`; its lines are printed prefixed with `broker:`). `PI_IDE_BROKER_BENCH_DAEMON=<binary>` measures
//! another build of the daemon with this same harness; `PI_IDE_BROKER_BENCH_DAEMON_B=<binary>`
//! adds a second build to the tables against the relay ("native B", "compat B"), its phases
//! interleaved with the first's, for an A/B within one run. `benches/instructions.sh` counts the
//! daemon's and a relay's instructions per call (callgrind), which do not move with load;
//! `benches/syscalls.sh` counts their system calls, switches and packets per call.
//! `--external LOCKFILE [--tool NAME]` measures against an editor you run yourself (e.g. a
//! real Neovim with a pi-ide plugin; `--tool getDiagnostics`) instead of the fake ones.
//! `--payload BYTES` puts a string of that size in every timed call's arguments (the `echo`
//! answer carries it back), for large frames: fewer calls, one session unless `--sessions`.

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
    /// The daemon under test (`PI_IDE_BROKER_BENCH_DAEMON`, else this build's), in `root`,
    /// watching `lock_dir`.
    async fn start(root: &Path, lock_dir: &Path) -> Daemon {
        // Another build can be measured with this same harness (e.g. an older commit's).
        let exe = std::env::var_os("PI_IDE_BROKER_BENCH_DAEMON")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_pi-ide-broker").into());
        Daemon::start_exe(root, lock_dir, &exe).await
    }

    /// The second build of an in-run A/B (`PI_IDE_BROKER_BENCH_DAEMON_B`), if one is named:
    /// a daemon of its own in `root/b`, watching the same lock dir as the first.
    async fn start_b(root: &Path, lock_dir: &Path) -> Option<Daemon> {
        let exe = std::env::var_os("PI_IDE_BROKER_BENCH_DAEMON_B")?;
        let b = root.join("b");
        Some(Daemon::start_exe(&b, lock_dir, &exe).await)
    }

    async fn start_exe(root: &Path, lock_dir: &Path, exe: &std::ffi::OsStr) -> Daemon {
        std::fs::create_dir_all(lock_dir).unwrap();
        let cfg = root.join("config.toml");
        std::fs::create_dir_all(root).unwrap();
        std::fs::write(
            &cfg,
            format!(
                "socket = \"{r}/run/sock\"\nstate_dir = \"{r}/state\"\nlog = \"{log}\"\n[compat]\nlock_dir = \"{r}/compat\"\n[[lock_dirs]]\npath = \"{l}\"\nfamily = \"pi\"\n",
                r = root.display(),
                l = lock_dir.display(),
                log = std::env::var("PI_IDE_BROKER_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            ),
        )
        .unwrap();
        let mut child = tokio::process::Command::new(exe)
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
        while pi_ide_broker::frontdoor::client::get_json(&sock, "/v1/status")
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
            let st = pi_ide_broker::frontdoor::client::get_json(&self.socket(), "/v1/status")
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

/// The compat entry for `cwd` in the compat dir `dir`, published just after its editor is
/// ready: waited for, 5 s at most.
async fn compat_candidate(dir: &Path, cwd: &str) -> pi_ide_broker::testkit::pi_client::Candidate {
    for _ in 0..500 {
        if let Some(c) = find_candidates(dir, cwd).await.pop() {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no compat entry in {} for {cwd}", dir.display())
}

async fn round_trips(root: &Path, d: &Daemon, fe: &FakeEditor) {
    let mut rows = Vec::new();
    // Warm-up both paths, then 1 session.
    let mut direct = PiClient::connect_with(fe.port, "x-pi-ide-authorization", fe.token(), None)
        .await
        .unwrap();
    let mut native = Agent::open(&d.socket(), "/bench", None).await;
    native.attached().await;
    let cand = compat_candidate(&root.join("compat"), "/bench").await;
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
                    a.attached().await;
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
            a.attached().await;
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
    // utime and stime, in clock ticks.
    let field = |n| pi_ide_broker::platform::process::procfs::stat_field(pid, n).unwrap_or(0);
    let ticks = field(14) + field(15);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (rss_kb, ticks, fds)
}

/// 1 MiB calls through the daemon (the echo tool): its minor page faults per call after a
/// warm-up. A call passes through about four large buffers; with glibc's default thresholds
/// each was mapped afresh for every call (about 950 faults per call); `allocator` keeps them.
async fn megabyte_calls(d: &Daemon) {
    let field = |n| pi_ide_broker::platform::process::procfs::stat_field(d.pid, n).unwrap_or(0);
    let mut a = Agent::open(&d.socket(), "/bench", None).await;
    a.attached().await;
    let pad = "x".repeat(1 << 20);
    let (mut faults, mut ticks) = (0, 0);
    const WARM: usize = 4;
    const CALLS: usize = 16;
    for i in 0..WARM + CALLS {
        if i == WARM {
            (faults, ticks) = (field(10), field(14) + field(15));
        }
        let args = serde_json::json!({"name": "echo", "arguments": {"i": i, "pad": pad}});
        let r = a.request(serde_json::json!(i), "tools/call", args).await;
        assert!(r.get("result").is_some(), "1 MiB call {i}: {r}");
    }
    let faults = (field(10) - faults) as f64 / CALLS as f64;
    let tick_ms = 1000.0 / 100.0; // USER_HZ
    let cpu_ms = (field(14) + field(15) - ticks) as f64 * tick_ms / CALLS as f64;
    println!(
        "\nMemory: 1 MiB calls through the daemon  (goal: < 64 page faults per call; glibc's defaults: ~950)"
    );
    println!("  page faults per call {faults:>8.1}\n  daemon CPU per call  {cpu_ms:>8.2} ms");
    a.close().await;
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
        a.attached().await;
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
        a.attached().await;
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

/// `--relay SOCK PORT`: a bare byte relay to 127.0.0.1:PORT, one `copy_bidirectional` per
/// connection on a current-thread runtime, like socat; from the Unix socket SOCK, and from a
/// loopback TCP port of its own (the reference for the compat door, whose clients come over
/// TCP too). Prints `ready SOCK TCP_PORT`.
fn relay_mode(sock: &str, port: u16) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let _ = std::fs::remove_file(sock);
        let unix = pi_ide_broker::platform::local::bind(Path::new(sock))
            .await
            .unwrap();
        let tcp = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        println!("ready {sock} {}", tcp.local_addr().unwrap().port());
        async fn relay<C>(mut client: C, port: u16)
        where
            C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
        {
            if let Ok(mut editor) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
                let _ = editor.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut client, &mut editor).await;
            }
        }
        loop {
            tokio::select! {
                Ok(client) = unix.accept() => {
                    tokio::spawn(relay(client, port));
                }
                Ok((client, _)) = tcp.accept() => {
                    let _ = client.set_nodelay(true);
                    tokio::spawn(relay(client, port));
                }
            }
        }
    });
}

/// `--editor DIR`: a fake editor on folder /real that burns 150 µs of CPU per answer, in a
/// single-threaded process of its own (as a Lua editor's main loop is).
fn editor_mode(dir: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut o = Options::pi(&["/real"]);
        o.burn_us = 150;
        let fe = FakeEditor::start_in(Path::new(dir), o).await.unwrap();
        println!("ready {}", fe.port);
        std::future::pending::<()>().await;
    });
}

/// `--calls N SOCK [PORT TOKEN] [--sessions S] [--tool NAME] [--cwd DIR] [--payload BYTES]
/// [--compat DIR]`: `N` calls of `echo` (or `NAME`) through the broker's native door at `SOCK`
/// (sessions on /real, as `--editor` serves, or on `DIR`), or its compat door announced in the
/// compat dir `DIR`, or with `PORT TOKEN` through a relay at `SOCK` to that editor; one at a
/// time on each of `S` (default 1) concurrent connections. Prints their latency. For
/// `benches/instructions.sh` and `benches/syscalls.sh`, which count the middle process's work,
/// and for measuring against a real editor by hand.
fn calls_mode(
    sock: &str,
    n: usize,
    sessions: usize,
    cwd: &str,
    relay: Option<(u16, String)>,
    compat_dir: Option<String>,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let path = match (&relay, &compat_dir) {
            (Some(_), _) => Path3::Relay,
            (None, Some(_)) => Path3::Compat,
            (None, None) => Path3::Broker,
        };
        let (port, token) = relay.unwrap_or((0, String::new()));
        // `open` reads the candidate only for the compat door.
        let compat = match &compat_dir {
            Some(dir) => compat_candidate(Path::new(dir), cwd).await,
            None => pi_ide_broker::testkit::pi_client::Candidate {
                port: 0,
                pid: 0,
                token: String::new(),
                ide_name: String::new(),
                folders: Vec::new(),
            },
        };
        let sock = Path::new(sock);
        let mut tasks = Vec::new();
        for _ in 0..sessions {
            let mut ws = open(path, port, &token, (sock, 0), sock, cwd, &compat).await;
            tasks.push(tokio::spawn(async move {
                timed_ws(&mut ws, n / sessions, 0).await
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        lat.sort();
        println!(
            "{} calls: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            lat.len(),
            us(pct(&lat, 0.5)),
            us(pct(&lat, 0.99)),
            us(lat.last().copied().unwrap_or_default())
        );
    });
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--relay") {
        return relay_mode(&args[i + 1], args[i + 2].parse().unwrap());
    }
    if let Some(i) = args.iter().position(|a| a == "--calls") {
        let relay = args
            .get(i + 3)
            .filter(|a| !a.starts_with("--"))
            .map(|port| (port.parse().unwrap(), args[i + 4].clone()));
        let flag = |name: &str| {
            args.iter()
                .position(|a| a == name)
                .map(|j| args[j + 1].clone())
        };
        let sessions = flag("--sessions").map_or(1, |n| n.parse().unwrap());
        if let Some(tool) = flag("--tool") {
            let _ = TOOL.set(tool);
        }
        if let Some(bytes) = flag("--payload") {
            let _ = PAD.set("x".repeat(bytes.parse().unwrap()));
        }
        let cwd = flag("--cwd").unwrap_or_else(|| "/real".into());
        return calls_mode(
            &args[i + 2],
            args[i + 1].parse().unwrap(),
            sessions,
            &cwd,
            relay,
            flag("--compat"),
        );
    }
    if let Some(i) = args.iter().position(|a| a == "--editor") {
        return editor_mode(&args[i + 1]);
    }
    let quick = std::env::args().any(|a| a == "--quick");
    // Only some sections (for profiling and A/B runs of two builds).
    let only: Option<Vec<String>> = args.iter().position(|a| a == "--only").map(|i| {
        args.get(i + 1)
            .expect("--only takes a list: fake,realistic,roundtrip,fanout,discovery,memory,scale")
            .split(',')
            .map(String::from)
            .collect()
    });
    let runs = |section: &str| only.as_ref().is_none_or(|o| o.iter().any(|s| s == section));
    let sessions: Vec<usize> = match args.iter().position(|a| a == "--sessions") {
        Some(i) => vec![args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .expect("--sessions takes a number")],
        // Large frames: one session unless asked (32 of them would move gigabytes).
        None if args.iter().any(|a| a == "--payload") => vec![1],
        None => vec![1, 32],
    };
    let external: Option<PathBuf> = args
        .iter()
        .position(|a| a == "--external")
        .map(|i| args.get(i + 1).expect("--external takes a lockfile").into());
    if let Some(i) = args.iter().position(|a| a == "--tool") {
        let _ = TOOL.set(args.get(i + 1).expect("--tool takes a name").clone());
    }
    if let Some(i) = args.iter().position(|a| a == "--payload") {
        let bytes: usize = args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .expect("--payload takes a number of bytes");
        let _ = PAD.set("x".repeat(bytes));
    }
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
        if let Some(lock) = external.as_deref() {
            return against_external(root, lock, quick, &sessions).await;
        }
        let d = Daemon::start(root, &root.join("pi-ide")).await;
        let d_b = Daemon::start_b(root, &root.join("pi-ide")).await;
        let fe = FakeEditor::start_in(&root.join("pi-ide"), Options::pi(&["/bench"]))
            .await
            .unwrap();
        d.wait_ready(1).await;
        if let Some(b) = &d_b {
            b.wait_ready(1).await;
        }
        // Against the floor: a bare relay, in two scenarios.
        let calls = large_frame_calls(if quick { 2_000 } else { 6_000 });
        if runs("fake") {
            against_relay(
                "Against a bare relay — fake scenario (in-process editor answering at once; clients and editor pinned to core 0, relay and broker to core 1)",
                fe.port, fe.token(), 0, calls, &d, d_b.as_ref(), "/bench", root, true, &sessions,
            )
            .await;
        }
        if runs("realistic") {
            let real_dir = root.join("pi-ide");
            // This bench binary in editor mode: a single-threaded process of its own.
            let mut real = tokio::process::Command::new(std::env::current_exe().unwrap())
            .arg("--editor")
            .arg(&real_dir)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the editor process");
            let mut out = tokio::io::BufReader::new(real.stdout.take().unwrap()).lines();
            let real_port: u16 = out
                .next_line()
                .await
                .unwrap()
                .and_then(|l| l.strip_prefix("ready ").and_then(|p| p.trim().parse().ok()))
                .expect("fake editor port");
            let lock: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(real_dir.join(format!("{real_port}.lock"))).unwrap(),
            )
            .unwrap();
            d.wait_ready(2).await;
            if let Some(b) = &d_b {
                b.wait_ready(2).await;
            }
            against_relay(
                "Against a bare relay — realistic scenario (editor: own single-threaded process, 150 µs CPU per answer; client: 100 µs CPU per call)",
                real_port, lock["authToken"].as_str().unwrap(), 100, calls, &d, d_b.as_ref(), "/real", root, false, &sessions,
            )
            .await;
            drop(real);
        }
        if runs("roundtrip") {
            round_trips(root, &d, &fe).await;
        }
        if runs("fanout") {
            fan_outs(&d, &fe).await;
        }
        if runs("discovery") {
            discovery(root, &d).await;
        }
        if runs("memory") {
            megabyte_calls(&d).await;
        }
        drop(d);
        drop(d_b);
        if runs("scale") {
            // Scale on a fresh daemon, so earlier runs' allocations do not count.
            let dir2 = tempfile::tempdir().unwrap();
            let d2 = Daemon::start(dir2.path(), &dir2.path().join("pi-ide")).await;
            scale(
                dir2.path(),
                &d2,
                Duration::from_secs(if quick { 5 } else { 30 }),
            )
            .await;
        }
    });
}

// ---------------------------------------------------------------------------------------
// The floor: the broker against a bare relay process, in the same run, on the same editor.

/// A relay process (`examples/relay`): Unix socket → the editor's TCP port.
struct Relay {
    _child: tokio::process::Child,
    pid: u32,
    sock: PathBuf,
    /// Its loopback TCP port.
    tcp: u16,
}

impl Relay {
    async fn start(sock: PathBuf, port: u16) -> Relay {
        // This bench binary itself, in relay mode: its own process, as a relay would be.
        let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
            .arg("--relay")
            .arg(&sock)
            .arg(port.to_string())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the relay process");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next_line().await.unwrap().unwrap_or_default();
        let tcp = ready.rsplit(' ').next().unwrap().parse().unwrap();
        let pid = child.id().unwrap();
        Relay {
            _child: child,
            pid,
            sock,
            tcp,
        }
    }
}

/// Context switches (voluntary + involuntary) and CPU time in ns (`schedstat`: exact, where
/// `stat`'s ticks are 10 ms), each summed over every thread of a process.
fn ctx_cpu(pid: u32) -> (u64, u64) {
    let (mut ctx, mut cpu_ns) = (0, 0);
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            ctx += status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
            cpu_ns += std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    (ctx, cpu_ns)
}

/// Pins every thread of `pid` to `cpus` (e.g. "1"), with util-linux's `taskset`.
fn pin(pid: u32, cpus: &str) {
    let ok = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "taskset could not pin pid {pid} to cpu {cpus}; placement is left to the scheduler"
        );
    }
}

type AnyWs = tokio_tungstenite::WebSocketStream<Box<dyn Io>>;
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

#[derive(Clone, Copy, PartialEq)]
enum Path3 {
    Direct,
    Relay,
    /// The relay's loopback TCP port: the reference for the compat door.
    RelayTcp,
    /// The native door (`/v1/session` on the Unix socket).
    Broker,
    /// The compat door (the virtual lockfile's loopback port), as pi-ide reaches the broker.
    Compat,
}

/// One client connection of `path` kind, ready for calls.
#[allow(clippy::too_many_arguments)]
async fn open(
    path: Path3,
    port: u16,
    token: &str,
    relay: (&Path, u16),
    broker: &Path,
    cwd: &str,
    compat: &pi_ide_broker::testkit::pi_client::Candidate,
) -> AnyWs {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let (io, url): (Box<dyn Io>, String) = match path {
        Path3::Direct => (
            Box::new(
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .unwrap(),
            ),
            format!("ws://127.0.0.1:{port}/"),
        ),
        Path3::Relay => (
            Box::new(
                pi_ide_broker::platform::local::connect(Path::new(relay.0))
                    .await
                    .unwrap(),
            ),
            format!("ws://127.0.0.1:{port}/"),
        ),
        Path3::RelayTcp => {
            let s = tokio::net::TcpStream::connect(("127.0.0.1", relay.1))
                .await
                .unwrap();
            let _ = s.set_nodelay(true);
            (Box::new(s), format!("ws://127.0.0.1:{port}/"))
        }
        Path3::Broker => (
            Box::new(
                pi_ide_broker::platform::local::connect(Path::new(broker))
                    .await
                    .unwrap(),
            ),
            format!("ws://localhost/v1/session?cwd={cwd}"),
        ),
        Path3::Compat => (
            Box::new(
                tokio::net::TcpStream::connect(("127.0.0.1", compat.port))
                    .await
                    .unwrap(),
            ),
            format!("ws://127.0.0.1:{}/", compat.port),
        ),
    };
    let token = if path == Path3::Compat {
        compat.token.as_str()
    } else {
        token
    };
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("x-pi-ide-authorization", token.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::client_async(req, io).await.unwrap();
    if path == Path3::Broker {
        let init = json!({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}});
        ws.send(tokio_tungstenite::tungstenite::Message::text(
            init.to_string(),
        ))
        .await
        .unwrap();
        while let Some(Ok(m)) = ws.next().await {
            if m.to_text().unwrap_or("").contains("broker/attached") {
                break;
            }
        }
    }
    ws
}

/// `broker_added / relay_added` as the tables print it: `n/a` when the relay added no time
/// (its median at or below the direct path's), where a ratio would mean nothing.
fn added_ratio(broker_added: f64, relay_added: f64) -> String {
    if relay_added < 0.05 {
        "n/a".to_string()
    } else {
        format!("{:.2}x", broker_added / relay_added)
    }
}

/// The tool the timed calls call: `echo` (the fake editors'), or `--tool NAME` in calls mode
/// (e.g. `getDiagnostics` for a real editor).
static TOOL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn tool_name() -> &'static str {
    TOOL.get().map_or("echo", String::as_str)
}

/// `--payload N`: a string of N bytes in every timed call's arguments (`echo` returns
/// it, so the answer carries it too), to measure large frames.
static PAD: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `calls`, or fewer when every call carries a large payload: each path moves at most about
/// 256 MiB each way, and makes 40 calls at least.
fn large_frame_calls(calls: usize) -> usize {
    match PAD.get() {
        Some(pad) => calls.min((256 << 20) / pad.len().max(1)).max(40),
        None => calls,
    }
}

/// A timed call's arguments.
fn call_args(i: usize) -> serde_json::Value {
    match PAD.get() {
        Some(pad) => json!({"i": i, "pad": pad}),
        None => json!({"i": i}),
    }
}

/// `n` echo calls, each after `burn_us` of client CPU (an agent doing its own work).
async fn timed_ws(ws: &mut AnyWs, n: usize, burn_us: u64) -> Vec<Duration> {
    use futures_util::{SinkExt, StreamExt};
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        pi_ide_broker::testkit::fake_editor::burn(burn_us);
        let msg = json!({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": tool_name(), "arguments": call_args(i)}});
        let t = Instant::now();
        ws.send(tokio_tungstenite::tungstenite::Message::text(
            msg.to_string(),
        ))
        .await
        .unwrap();
        loop {
            let m = ws.next().await.unwrap().unwrap();
            let v: serde_json::Value =
                serde_json::from_str(m.to_text().unwrap_or("{}")).unwrap_or_default();
            if v["id"] == i {
                break;
            }
        }
        out.push(t.elapsed());
    }
    out
}

struct Phase {
    lat: Vec<Duration>,
    ctx_per_call: f64,
    cpu_us_per_call: f64,
}

#[allow(clippy::too_many_arguments)]
async fn phase(
    path: Path3,
    sessions: usize,
    calls: usize,
    burn_us: u64,
    port: u16,
    token: &str,
    relay: &Relay,
    d: &Daemon,
    cwd: &str,
    compat: &pi_ide_broker::testkit::pi_client::Candidate,
) -> Phase {
    let per = calls / sessions;
    let mut conns = Vec::new();
    for _ in 0..sessions {
        conns.push(
            open(
                path,
                port,
                token,
                (&relay.sock, relay.tcp),
                &d.socket(),
                cwd,
                compat,
            )
            .await,
        );
    }
    for c in conns.iter_mut() {
        timed_ws(c, 20, 0).await; // warm-up
    }
    let watched = match path {
        Path3::Broker | Path3::Compat => Some(d.pid),
        Path3::Relay | Path3::RelayTcp => Some(relay.pid),
        Path3::Direct => None,
    };
    let before = watched.map(ctx_cpu);
    let mut tasks = Vec::new();
    for mut c in conns {
        tasks.push(tokio::spawn(
            async move { timed_ws(&mut c, per, burn_us).await },
        ));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    let (ctx, cpu) = match (watched.map(ctx_cpu), before) {
        (Some((c1, t1)), Some((c0, t0))) => (
            (c1 - c0) as f64 / lat.len() as f64,
            (t1 - t0) as f64 / 1000.0 / lat.len() as f64,
        ),
        _ => (0.0, 0.0),
    };
    lat.sort();
    Phase {
        lat,
        ctx_per_call: ctx,
        cpu_us_per_call: cpu,
    }
}

/// `--external LOCKFILE [--tool NAME]`: the table against the relay for an editor you run
/// yourself (a real Neovim or VS Code), announced by `LOCKFILE`: direct, relay and broker
/// interleaved on its first workspace folder, clients burning 100 µs per call as in the
/// realistic scenario. The daemon(s) watch the lockfile's dir.
async fn against_external(root: &Path, lock: &Path, quick: bool, sessions: &[usize]) {
    let text = std::fs::read_to_string(lock)
        .unwrap_or_else(|e| panic!("cannot read the lockfile {}: {e}", lock.display()));
    let v: serde_json::Value = serde_json::from_str(&text).expect("the lockfile is JSON");
    let port: u16 = lock
        .file_stem()
        .and_then(|s| s.to_str()?.parse().ok())
        .expect("the lockfile is named <port>.lock");
    let token = v["authToken"]
        .as_str()
        .expect("the lockfile has an authToken");
    let cwd = v["workspaceFolders"][0]
        .as_str()
        .expect("the lockfile names a workspace folder");
    let lock_dir = lock.parent().expect("the lockfile is in a dir");
    let d = Daemon::start(root, lock_dir).await;
    let d_b = Daemon::start_b(root, lock_dir).await;
    d.wait_ready(1).await;
    if let Some(b) = &d_b {
        b.wait_ready(1).await;
    }
    let title = format!(
        "Against a bare relay — external editor {} on port {port} ({}; client: 100 µs CPU per call)",
        v["ideName"].as_str().unwrap_or("?"),
        tool_name()
    );
    let calls = large_frame_calls(if quick { 2_000 } else { 6_000 });
    against_relay(
        &title,
        port,
        token,
        100,
        calls,
        &d,
        d_b.as_ref(),
        cwd,
        root,
        false,
        sessions,
    )
    .await;
}

/// Direct, relay and broker, interleaved, for one scenario; prints one table.
#[allow(clippy::too_many_arguments)]
async fn against_relay(
    title: &str,
    port: u16,
    token: &str,
    burn_client_us: u64,
    calls: usize,
    d: &Daemon,
    d_b: Option<&Daemon>,
    cwd: &str,
    root: &Path,
    pinned: bool,
    session_counts: &[usize],
) {
    let relay = Relay::start(root.join(format!("relay-{port}.sock")), port).await;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Pinned: this process (clients and the in-process editor) on core 0, the middle process
    // (relay or broker) on core 1, so both middles meet the same placement. Left to the
    // scheduler, a middle woken on an idle vCPU pays ~150-200 µs more per call in some runs
    // and not in others, which swamps what is measured.
    let pinned = pinned && cores >= 2;
    if pinned {
        pin(std::process::id(), "0");
        pin(relay.pid, "1");
        pin(d.pid, "1");
        if let Some(b) = d_b {
            pin(b.pid, "1");
        }
    }
    let compat = compat_candidate(&root.join("compat"), cwd).await;
    let compat_b = match d_b {
        Some(b) => Some(compat_candidate(&b.root.join("compat"), cwd).await),
        None => None,
    };
    println!("\n{title}");
    println!(
        "{:<12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9} {:>9} {:>7} {:>10}",
        "sessions",
        "direct50",
        "relay50",
        "broker50",
        "relay+50",
        "broker+50",
        "b/r 50",
        "relay+99",
        "broker+99",
        "ctx r",
        "ctx b",
        "cpu r µs",
        "cpu b µs",
        "tcp+50",
        "b/tcp",
        "cpu tcp µs"
    );
    for &sessions in session_counts {
        let mut d_lat = Vec::new();
        let (mut r, mut b, mut c, mut t) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut b2, mut c2) = (Vec::new(), Vec::new());
        // Four rounds, interleaved, so load drift hits every path alike.
        let run = |path, d, compat| {
            phase(
                path,
                sessions,
                calls / 4,
                burn_client_us,
                port,
                token,
                &relay,
                d,
                cwd,
                compat,
            )
        };
        for _ in 0..4 {
            d_lat.extend(run(Path3::Direct, d, &compat).await.lat);
            r.push(run(Path3::Relay, d, &compat).await);
            b.push(run(Path3::Broker, d, &compat).await);
            c.push(run(Path3::Compat, d, &compat).await);
            t.push(run(Path3::RelayTcp, d, &compat).await);
            if let (Some(db), Some(cb)) = (d_b, &compat_b) {
                b2.push(run(Path3::Broker, db, cb).await);
                c2.push(run(Path3::Compat, db, cb).await);
            }
        }
        d_lat.sort();
        let merge = |v: &[Phase]| {
            let mut l: Vec<Duration> = v.iter().flat_map(|p| p.lat.clone()).collect();
            l.sort();
            let ctx = v.iter().map(|p| p.ctx_per_call).sum::<f64>() / v.len() as f64;
            let cpu = v.iter().map(|p| p.cpu_us_per_call).sum::<f64>() / v.len() as f64;
            (l, ctx, cpu)
        };
        let (rl, rctx, rcpu) = merge(&r);
        let (d50, d99) = (us(pct(&d_lat, 0.5)), us(pct(&d_lat, 0.99)));
        let (r50, r99) = (us(pct(&rl, 0.5)), us(pct(&rl, 0.99)));
        let (tl, _, tcpu) = merge(&t);
        let t50 = us(pct(&tl, 0.5));
        let mut rows = vec![("native", &b), ("compat", &c)];
        if d_b.is_some() {
            rows.extend([("native B", &b2), ("compat B", &c2)]);
        }
        for (door, v) in rows {
            let (bl, bctx, bcpu) = merge(v);
            let (b50, b99) = (us(pct(&bl, 0.5)), us(pct(&bl, 0.99)));
            // The compat door against the TCP relay too: its clients come over TCP.
            let tcp = if door.starts_with("compat") {
                format!(
                    "{:>7.1}µs {:>7} {:>10.1}",
                    t50 - d50,
                    added_ratio(b50 - d50, t50 - d50),
                    tcpu
                )
            } else {
                format!("{:>9} {:>7} {:>10}", "-", "-", "-")
            };
            println!(
                "{:<12} {:>7.1}µs {:>7.1}µs {:>7.1}µs {:>7.1}µs {:>7.1}µs {:>9} {:>8.1}µs {:>8.1}µs {:>8.1} {:>8.1} {:>9.1} {:>9.1} {tcp}",
                format!("{sessions} {door}"), d50, r50, b50, r50 - d50, b50 - d50,
                added_ratio(b50 - d50, r50 - d50),
                r99 - d99, b99 - d99, rctx, bctx, rcpu, bcpu
            );
        }
    }
    println!("  (native / compat: the broker's door; + = added over direct; b/r = broker-added / relay-added, n/a when the relay added nothing");
    println!("   (with many sessions one more process in the path can queue less than the direct path does); ctx and cpu per call, read from /proc;");
    println!(
        "   tcp = the same relay entered over loopback TCP, as compat clients enter the broker;"
    );
    println!(
        "   B = the daemon named by PI_IDE_BROKER_BENCH_DAEMON_B, interleaved with the first)"
    );
    if pinned {
        let all = format!("0-{}", cores - 1);
        pin(std::process::id(), &all);
        pin(d.pid, &all);
        if let Some(b) = d_b {
            pin(b.pid, &all);
        }
    }
}
