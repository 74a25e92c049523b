//! What the peers' messages mean, as values; the bottom layer.
//!
//! JSON-RPC shapes, editor families, tool schemas, the version rule, dialect translation, path
//! maps and percent-coding. The bottom layer: uses nothing else of the crate.

pub mod acp;
pub mod bridge;
pub mod era;
pub mod family;
pub mod follow;
pub mod handshake;
pub mod jsonrpc;
pub mod pathmap;
pub mod percent;
pub mod schema;
pub mod version;
pub mod winpath;
