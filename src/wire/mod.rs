//! Bytes on the wire, per call; uses only `sys`.
//!
//! The WebSocket frame codec and upgrade, the writers several tasks share, the waker and
//! quick-ack helpers, one-pass JSON reading. Uses only `sys`.

pub mod jsonscan;
pub mod outbox;
pub mod shared_writer;
pub mod woken;
pub mod wsframe;
pub mod wsupgrade;
