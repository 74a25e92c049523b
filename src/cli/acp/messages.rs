//! The messages the ACP agent writes: to the client (ACP v1) and to the broker (the follow
//! protocol), each built in one place.

use super::agent::{Out, ACP_VERSION};
use crate::protocol::follow::Notice as _;
use crate::protocol::jsonrpc;
use serde_json::{json, Value};

/// An ACP content block of text.
pub(super) fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// What `initialize` answers: ACP v1, history loading, text prompts only.
pub(super) fn initialize_result() -> Value {
    json!({
        "protocolVersion": ACP_VERSION,
        "agentCapabilities": {
            "loadSession": true,
            "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
            "mcpCapabilities": {"http": false, "sse": false},
            "sessionCapabilities": {"list": {}, "resume": {}, "close": {}},
        },
        "agentInfo": {"name": "pi-ide-broker", "title": "pi (via pi-ide-broker)", "version": env!("CARGO_PKG_VERSION")},
        "authMethods": [],
    })
}

/// `session/update` for ACP session `key`.
pub(super) fn session_update(key: &str, update: Value) -> Out {
    Out::Client(jsonrpc::notification(
        "session/update",
        json!({"sessionId": key, "update": update}),
    ))
}

/// ACP's `$/cancel_request` for a request of ours the client has not answered: it closes the
/// permission where the client knows the notification (others ignore it, and their late
/// answer finds nothing).
pub(super) fn cancel_request(ours: &str) -> Out {
    Out::Client(jsonrpc::notification(
        "$/cancel_request",
        json!({"requestId": ours}),
    ))
}

/// `follow/review {ready}` on `key`'s connection.
pub(super) fn ready(key: &str, ready: bool) -> Out {
    Out::Broker(
        key.to_string(),
        crate::protocol::follow::ReviewReady { ready }.frame(),
    )
}

pub(super) fn invalid(id: &Value, message: &str) -> Out {
    Out::Client(jsonrpc::error(id, jsonrpc::INVALID_PARAMS, message))
}
