//! What the layers above it stand on: config, logging, the lock helper, secrets, WSL facts.
//!
//! Configuration and paths, logging, the one lock helper, secrets, a file system watcher,
//! and the facts of a WSL distro facing Windows. Uses `protocol` (the config's editor families,
//! `[[remote]]` path maps, Windows paths) and `platform` (who we are, process facts).

use std::path::PathBuf;

pub mod config;
pub(crate) mod fswatch;
pub(crate) mod logging;
pub(crate) mod secret;
pub(crate) mod time;
pub(crate) mod wsl;

/// Why a config could not be loaded, or a log filter set: this layer's one error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file exists but could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema; the message names line and key.
    #[error("config {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's message, with line, column and key.
        message: String,
    },
    /// A value parses but makes no sense.
    #[error("config {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        message: String,
    },
    /// A log filter (`log_level`, `RUST_LOG`) that does not parse.
    #[error("log filter {filter:?} is invalid: {message}")]
    Filter {
        /// The filter as given.
        filter: String,
        /// What did not parse.
        message: String,
    },
}
