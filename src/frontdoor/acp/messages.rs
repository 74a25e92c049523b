//! The messages the ACP agent writes: to the client (ACP v1, `protocol::acp`) and to the
//! broker (the follow protocol), each built in one place.

use crate::protocol::acp::{self, ContentBlock, OwnUpdate, SessionUpdate};
use crate::protocol::follow::Notice as _;
use crate::protocol::jsonrpc;
use serde_json::Value;

/// Something the I/O loop must do.
#[derive(Debug, PartialEq)]
pub enum Out {
    /// A line to the client (stdout).
    Client(String),
    /// A frame to the broker, on the follow connection of this ACP session.
    Broker(String, String),
    /// List the followable pi sessions in `cwd` and call [`Agent::listed`](super::agent::Agent::listed) with them.
    List {
        /// The folder.
        cwd: String,
        /// What the list is for.
        purpose: Purpose,
    },
    /// Open a follow connection to pi session `key`, then call
    /// [`Agent::connected`](super::agent::Agent::connected).
    Connect {
        /// The pi session's key (the ACP session id).
        key: String,
        /// The client's request that waits for it (`session/new` or `session/load`).
        request: Value,
        /// Replay the history once connected (`session/load`).
        load: bool,
    },
    /// Close the follow connection of this ACP session.
    Disconnect(String),
}

/// Why sessions are listed.
#[derive(Debug, PartialEq, Clone)]
pub enum Purpose {
    /// `session/new`: the first (most recently active) is followed.
    New(Value),
    /// `session/list`: those whose cwd is `cwd` (all of them without one), answered to the
    /// request `id`.
    List {
        /// The client's request.
        id: Value,
        /// The folder the client asked for, if it gave one.
        cwd: Option<String>,
    },
}

/// What `initialize` answers: ACP v1, history loading, text prompts only.
pub(super) fn initialize_result() -> Value {
    let offered = Some(acp::Offered {});
    acp::to_value(&acp::InitializeResponse {
        protocol_version: acp::VERSION,
        agent_capabilities: acp::AgentCapabilities {
            load_session: true,
            prompt_capabilities: acp::PromptCapabilities {
                image: false,
                audio: false,
                embedded_context: false,
            },
            mcp_capabilities: acp::McpCapabilities {
                http: false,
                sse: false,
            },
            session_capabilities: acp::SessionCapabilities {
                list: offered.clone(),
                resume: offered.clone(),
                close: offered,
            },
        },
        agent_info: acp::Implementation {
            name: "pi-ide-broker".into(),
            title: Some("pi (via pi-ide-broker)".into()),
            version: Some(env!("CARGO_PKG_VERSION").into()),
        },
        auth_methods: Vec::new(),
    })
}

/// `session/update` for ACP session `key`.
pub(super) fn session_update(key: &str, update: SessionUpdate) -> Out {
    let params = acp::SessionNotification {
        session_id: key.to_string(),
        update,
    };
    Out::Client(jsonrpc::notification(
        acp::method::SESSION_UPDATE,
        acp::to_value(&params),
    ))
}

/// A line of the door's own in the agent's voice, on ACP session `key`.
pub(super) fn say(key: &str, text: &str) -> Out {
    session_update(
        key,
        SessionUpdate::Own(OwnUpdate::AgentMessageChunk {
            content: ContentBlock::text(text),
        }),
    )
}

/// The answer that ends prompt turn `id` for `why`.
pub(super) fn turn_ended(id: &Value, why: acp::StopReason) -> Out {
    Out::Client(jsonrpc::result(
        id,
        acp::to_value(&acp::PromptResponse { stop_reason: why }),
    ))
}

/// ACP's `$/cancel_request` for a request of ours the client has not answered: it closes the
/// permission where the client knows the notification (others ignore it, and their late
/// answer finds nothing).
pub(super) fn cancel_request(ours: &str) -> Out {
    Out::Client(jsonrpc::notification(
        acp::method::CANCEL_REQUEST,
        acp::to_value(&acp::CancelRequest {
            request_id: ours.to_string(),
        }),
    ))
}

/// The door's own request `ours` (`method`, `params`) to the pi session that `key`'s
/// connection follows.
pub(super) fn to_pi(key: &str, ours: String, method: &str, params: Value) -> Out {
    Out::Broker(
        key.to_string(),
        jsonrpc::request(&Value::String(ours), method, params),
    )
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
