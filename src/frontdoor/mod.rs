//! The ways in. Every door ends in [`crate::session::run`].

pub mod compat;
pub mod limits;
pub mod native;
pub mod socket;
pub mod stdio;

/// True when a `Sec-WebSocket-Protocol` value offers `mcp` (Claude Code asks for it, and its
/// `ws` client refuses a 101 that does not echo it).
pub fn offers_mcp(protocols: Option<&str>) -> bool {
    protocols.is_some_and(|v| v.split(',').any(|p| p.trim() == "mcp"))
}
