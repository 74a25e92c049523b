//! Behaves like the published pi-ide extension for one turn and prints the transcript:
//! finds an editor for `--cwd` in `$PI_IDE_LOCK_DIR` (plain prefix match, pid alive, port
//! listening), connects with `x-pi-ide-authorization`, `initialize`, `getDiagnostics`, then a
//! `write` through `openDiff` + `close_tab`.
//! `PI_IDE_LOCK_DIR=~/.pi/ide-broker cargo run --example pi_ide_client -- --cwd DIR --file F`

use pi_ide_broker::testkit::pi_client::{find_candidates, PiClient};
use serde_json::json;
use std::path::PathBuf;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut cwd, mut file) = (
        std::env::current_dir()?.display().to_string(),
        String::from("demo.txt"),
    );
    while let Some(a) = args.next() {
        match a.as_str() {
            "--cwd" => cwd = args.next().ok_or("--cwd needs a value")?,
            "--file" => file = args.next().ok_or("--file needs a value")?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let dir = std::env::var_os("PI_IDE_LOCK_DIR")
        .map(PathBuf::from)
        .ok_or("set PI_IDE_LOCK_DIR")?;
    let cands = find_candidates(&dir, &cwd).await;
    println!("# candidates for {cwd} in {}:", dir.display());
    for c in &cands {
        println!(
            "#   {} · {} · pid={} port={}",
            c.ide_name,
            c.folders.first().map(String::as_str).unwrap_or("-"),
            c.pid,
            c.port
        );
    }
    let [c] = cands.as_slice() else {
        return Err(format!(
            "{} candidates; pi-ide autoconnects only to exactly one",
            cands.len()
        )
        .into());
    };
    let mut client = PiClient::connect(c).await?;
    println!("-> initialize (pi-ide 0.1.0)   <- ok");
    let diags = client.diagnostics().await?;
    println!(
        "-> tools/call getDiagnostics {{}}   <- map with {} file(s): {}",
        diags.len(),
        serde_json::Value::Object(diags.clone())
    );
    let path = format!("{cwd}/{file}");
    let content = "hello from a pi-ide-like client\n";
    println!(
        "-> tools/call openDiff {}",
        json!({"old_file_path": path, "new_file_path": path, "new_file_contents": content, "tab_name": "pi-write:demo-1"})
    );
    let verdict = client.write_file(&path, content, "demo-1").await?;
    match verdict {
        Some(text) => println!("<- FILE_SAVED, final text {text:?} (pi writes it)\n-> tools/call close_tab {{\"tab_name\":\"pi-write:demo-1\"}}"),
        None => println!("<- rejected (pi blocks the write)"),
    }
    client.close().await;
    Ok(())
}
