//! The `pi-ide-broker` command: parses arguments, builds the runtime and dispatches
//! (`cli::args`); the work, signals included (`cli::daemon`), is in the library.

use clap::Parser;
use pi_ide_broker::cli::args::{self, Cli};
use std::process::ExitCode;

fn main() -> ExitCode {
    pi_ide_broker::platform::allocator::keep_freed_frames();
    let cli = Cli::parse();
    // One thread for everything: a call crosses tasks (session → link → session), and on a
    // multi-threaded runtime every such wake-up is a futex and a context switch when the
    // other worker sleeps. The broker's work per frame is microseconds (no blocking calls in
    // its tasks), so one thread serves hundreds of sessions with less CPU per call
    // (`cargo bench` measures it against a bare relay). PI_IDE_BROKER_THREADS=N (N > 1) asks
    // for a multi-threaded runtime instead.
    let threads = std::env::var("PI_IDE_BROKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    let built = if threads > 1 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            // Look at the sockets every 8 task polls (tokio's default is 61): with dozens of
            // busy sessions a frame waiting in the kernel otherwise waits behind them all.
            .event_interval(8)
            .enable_all()
            .build()
    };
    let runtime = match built {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(args::run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
