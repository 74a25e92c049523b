//! pi-ide-broker: one user-level daemon between AI coding-agent sessions and the editors
//! that speak the pi-ide / Claude Code editor protocol. See `ARCHITECTURE.md`.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod allocator;
pub mod bridge;
pub mod client;
pub mod config;
pub mod control;
pub mod daemon;
pub mod doctor;
pub mod editor;
pub mod family;
pub mod frontdoor;
pub mod health;
pub mod identity;
pub mod jsonrpc;
pub mod jsonscan;
pub mod lockdir;
pub mod lockfile;
pub mod logging;
pub mod outbox;
pub mod pathmap;
pub mod percent;
pub mod portpeers;
pub mod procinfo;
pub mod quickack;
pub mod registry;
pub mod router;
pub mod schema;
pub mod secret;
pub mod service;
pub mod session;
pub mod setup;
pub mod shared_writer;
pub mod state;
pub mod sync;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod version;
pub mod woken;
pub mod wsframe;
pub mod wsupgrade;

pub use config::Config;
pub use daemon::{serve, Ready};
