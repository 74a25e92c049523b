//! What the peers' messages mean, as values: a bottom crate of the workspace, like `platform`.
//!
//! JSON-RPC shapes, editor families, tool schemas, the version rule, family translation, path
//! maps and percent-coding. It uses no other crate of the workspace.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod acp;
pub mod bridge;
pub mod era;
pub mod family;
pub mod follow;
pub mod handshake;
pub mod jsonrpc;
pub mod native;
pub mod pathmap;
pub mod percent;
pub mod schema;
pub mod version;
pub mod winpath;

/// Why a message or path of a peer cannot be used: this layer's one error type.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// `C:\...` or `C:/...` in a `[[remote]]` map: it maps POSIX paths only (`pathmap`).
    #[error("{0:?} is a Windows drive path; map the POSIX path the agent sees instead (e.g. /mnt/c/... under WSL)")]
    WindowsPath(String),
}
