//! Bytes on the wire, per call; uses only `platform`.
//!
//! The WebSocket frame codec and upgrade, the writers several tasks share, the waker and
//! quick-ack helpers, one-pass JSON reading. Uses only `platform` (its lock helper).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod budget;
pub mod idscan;
pub mod jsonscan;
pub mod outbox;
pub mod shared_writer;
pub mod woken;
pub mod wsframe;
pub mod wsupgrade;

/// Why bytes on a connection cannot be used: this layer's one error type (framing, upgrade).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket failed, or closed in the middle of a frame or an upgrade.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the framing rules (`wsframe`).
    #[error("WebSocket protocol error: {0}")]
    Protocol(&'static str),
    /// A message longer than the cap (announced in a frame header: it is never read).
    #[error("a message of {size} bytes is over the limit of {max} bytes (max_frame_bytes)")]
    TooBig {
        /// The size the frame header announced (with what came before it, when fragmented).
        size: u64,
        /// The cap.
        max: usize,
    },
    /// A message the budget for messages in flight (`budget`) had no room for: it was read
    /// past, never held, and the connection is still usable (the reader reads on). The peer
    /// is owed a JSON-RPC error (busy) with the message's id.
    #[error("a message of {size} bytes was dropped: too many long messages are in flight at once (max_frames_in_flight_bytes)")]
    OverBudget {
        /// The message's length.
        size: u64,
        /// Its top-level id, when it had one that can be an id (`idscan`).
        id: Option<serde_json::Value>,
    },
    /// A text message that is not UTF-8.
    #[error("a text message is not valid UTF-8")]
    NotUtf8,
    /// HTTP 400 to an upgrade: the editors' answer to a wrong token (`wsupgrade`).
    #[error("the editor refused the token (HTTP 400)")]
    Refused,
    /// An upgrade answered with anything else that is not a WebSocket upgrade (`wsupgrade`).
    #[error("{0}")]
    Bad(String),
}

impl Error {
    /// The close code owed to the peer (RFC 6455 §7.4.1), `None` when the socket itself failed
    /// or no WebSocket was ever up.
    pub fn close_code(&self) -> Option<u16> {
        match self {
            Error::Io(_) | Error::Refused | Error::Bad(_) => None,
            Error::Protocol(_) => Some(1002),
            Error::TooBig { .. } => Some(1009),
            // For a caller that ends the connection on it (it need not): try again later.
            Error::OverBudget { .. } => Some(1013),
            Error::NotUtf8 => Some(1007),
        }
    }
}
