//! A fake editor as a real process, for fault tests and measurements:
//! `fake_editor --dir DIR [--family pi|claude] [--folder F]... [--name NAME] [--auto-accept
//! [--reject-named S]] [--burn-us N]` (N µs of CPU before each `echo` answer; with
//! `--reject-named`, a diff of a file whose path contains S is rejected, every other accepted).
//! Writes `<port>.lock` into DIR, prints `ready <port>` and serves until killed.

use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::testkit::fake_editor::{FakeEditor, Options};
use std::path::PathBuf;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut opts = Options::pi(&[]);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => dir = args.next().map(PathBuf::from),
            "--family" => {
                opts.family = if args.next().as_deref() == Some("claude") {
                    Family::Claude
                } else {
                    Family::Pi
                }
            }
            "--folder" => opts.folders.extend(args.next()),
            "--name" => opts.ide_name = args.next().unwrap_or_default(),
            "--port" => opts.port = args.next().and_then(|p| p.parse().ok()).unwrap_or(0),
            "--auto-accept" => opts.auto_accept = true,
            "--reject-named" => opts.reject_named = args.next(),
            "--burn-us" => opts.burn_us = args.next().and_then(|p| p.parse().ok()).unwrap_or(0),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let dir = dir.ok_or("--dir is required")?;
    let editor = FakeEditor::start_in(&dir, opts).await?;
    println!("ready {}", editor.port);
    std::future::pending::<()>().await;
    Ok(())
}
