//! `paths`: where this configuration puts the socket, the state, the log and the config.

use crate::sys::config::Config;
use std::path::PathBuf;
use std::process::ExitCode;

/// Prints the paths, as `name: path` lines or one JSON object.
pub(super) fn command(config: &Config, config_path: Option<PathBuf>, json: bool) -> ExitCode {
    let paths = serde_json::json!({
        "socket": config.socket_to_dial(),
        "state_dir": config.state_dir(),
        "log": config.state_dir().join("daemon.log"),
        "config": config_path,
    });
    if json {
        println!("{paths}");
    } else if let Some(map) = paths.as_object() {
        for (k, v) in map {
            println!("{k}: {}", v.as_str().unwrap_or("-"));
        }
    }
    ExitCode::SUCCESS
}
