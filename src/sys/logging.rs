//! Log setup: `tracing-subscriber` to stderr, text or JSON, a reloadable filter.
//!
//! `tracing-subscriber` to stderr, filter from `RUST_LOG` or the config, text or JSON lines, no
//! timestamps of our own under journald (`JOURNAL_STREAM`).

use crate::sys::config::{Config, LogFormat};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

/// Changes the log filter of a running daemon (config reload).
pub(crate) struct LogHandle(reload::Handle<EnvFilter, Registry>);

impl LogHandle {
    /// Applies `filter` unless `RUST_LOG` is set (the environment wins).
    pub(crate) fn set_filter(&self, filter: &str) -> Result<(), super::Error> {
        if std::env::var_os("RUST_LOG").is_some() {
            return Ok(());
        }
        let invalid = |message: String| super::Error::Filter {
            filter: filter.to_string(),
            message,
        };
        let f = EnvFilter::try_new(filter).map_err(|e| invalid(e.to_string()))?;
        self.0.reload(f).map_err(|e| invalid(e.to_string()))
    }
}

/// Installs the global subscriber. Call once, early.
pub(crate) fn init(config: &Config) -> LogHandle {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        .or_else(|| EnvFilter::try_new(&config.log).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let fmt = match (config.log_format, journald) {
        (LogFormat::Json, _) => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
        (LogFormat::Text, true) => tracing_subscriber::fmt::layer()
            .without_time()
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .boxed(),
        (LogFormat::Text, false) => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init();
    LogHandle(handle)
}
