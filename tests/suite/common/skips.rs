//! What may not run here: a skip that never looks like a pass, and the turn-taking of the
//! tests that load the whole machine.

/// A test (or a part of one) that cannot run here, for want of `msg`'s tool: under
/// `PI_IDE_BROKER_REQUIRE_ALL=1` (`.ci/run` sets it, having installed everything) it fails;
/// elsewhere it says `SKIPPED: msg` on a line of its own past the harness's capture, and the
/// run ends with a line counting every skip, after libtest's summary, so a skip never looks
/// like a pass.
pub fn cannot_run(msg: &str) {
    if std::env::var("PI_IDE_BROKER_REQUIRE_ALL").is_ok_and(|v| v == "1") {
        panic!("{msg} (PI_IDE_BROKER_REQUIRE_ALL=1: nothing may be skipped)");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {msg}");
    told::note(msg);
}

/// A developer-run test that does not run here: what it needs cannot be installed from any
/// registry CI reaches (Neovim plugins that live only on GitHub). It says
/// `DEVELOPER-RUN: msg` past the harness's capture, and `.ci/run`'s summary counts these
/// apart from the skips (they never fail a run, and never pass for a run either).
pub fn developer_run(msg: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "DEVELOPER-RUN: {msg}");
}

/// The skips of this run, told once at exit.
mod told {
    use std::sync::Mutex;

    static SKIPPED: Mutex<Vec<String>> = Mutex::new(Vec::new());

    extern "C" {
        fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
    }

    extern "C" fn tell() {
        use std::io::Write;
        let skipped = SKIPPED.lock().map(|s| s.clone()).unwrap_or_default();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "\nSKIPPED {} test part(s) for want of a tool (PI_IDE_BROKER_REQUIRE_ALL=1 fails them instead):",
            skipped.len()
        );
        for s in skipped {
            let _ = writeln!(err, "  - {s}");
        }
    }

    pub fn note(msg: &str) {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: `tell` is a plain function that lives as long as the process.
        ONCE.call_once(|| unsafe {
            atexit(tell);
        });
        if let Ok(mut s) = SKIPPED.lock() {
            s.push(msg.to_string());
        }
    }
}

/// Held by the tests that load the whole machine (the README's release build, a
/// browser-driven VS Code) and by the one whose 1 s bound measures the broker under a flood:
/// they take turns, so that bound measures the broker and not a compiler beside it.
pub async fn machine_heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}
