//! pi-ide-broker: one user-level daemon between AI coding-agent sessions and the editors
//! that speak the pi-ide / Claude Code editor protocol. The folders are listed below bottom
//! up, one layer each; `ARCHITECTURE.md` has the codemap and the two processes (`broker`,
//! `cli`).
#![deny(unsafe_code)]
#![warn(missing_docs)]
#![warn(unreachable_pub)]

// The layers bottom up (ARCHITECTURE.md): a folder uses only those above it in this list.
// The bottom three are crates of the workspace (`crates/`), so the compiler holds them to it;
// each is re-exported under the path the rest of the crate names it by.
pub use platform;

pub use protocol;

pub mod sys;

pub use wire;

pub mod editor;

pub mod registry;

pub mod session;

pub mod frontdoor;

pub mod broker;

pub mod cli;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use broker::{serve, Ready};
pub use sys::config::{self, Config};
