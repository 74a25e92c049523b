//! pi-ide-broker: one user-level daemon between AI coding-agent sessions and the editors
//! that speak the pi-ide / Claude Code editor protocol. The folders are listed here
//! alphabetically; `ARCHITECTURE.md` orders them into layers and names the two processes
//! (`daemon`, `cli`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
pub mod daemon;
pub mod editor;
pub mod frontdoor;
pub mod protocol;
pub mod registry;
pub mod session;
pub mod sys;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod wire;

pub use daemon::{serve, Ready};
pub use sys::config::{self, Config};
