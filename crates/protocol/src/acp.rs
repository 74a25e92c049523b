//! ACP v1 (the Agent Client Protocol), the part `pi-ide-broker acp` speaks, as types.
//!
//! Field names follow the ACP v1 schema (agentclientprotocol.com). The official schema crate
//! is not used: it needs a newer Rust than this crate's MSRV and brings derive_more,
//! serde_with and strum for the ten messages this door speaks. Reading is tolerant where
//! real clients differ (a missing `cwd`, a block type the door does not carry); writing is
//! exact. Session updates pi's extension builds pass through as JSON ([`SessionUpdate::Relayed`]):
//! the door adds nothing to them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The ACP protocol version this door speaks.
pub const VERSION: u64 = 1;

/// The client's methods and notifications the door answers.
pub mod method {
    /// `initialize`.
    pub const INITIALIZE: &str = "initialize";
    /// `authenticate` (no auth methods are offered; answered empty).
    pub const AUTHENTICATE: &str = "authenticate";
    /// `session/new`.
    pub const SESSION_NEW: &str = "session/new";
    /// `session/load`.
    pub const SESSION_LOAD: &str = "session/load";
    /// `session/resume`.
    pub const SESSION_RESUME: &str = "session/resume";
    /// `session/close`.
    pub const SESSION_CLOSE: &str = "session/close";
    /// `session/list`.
    pub const SESSION_LIST: &str = "session/list";
    /// `session/prompt`.
    pub const SESSION_PROMPT: &str = "session/prompt";
    /// `session/cancel` (a notification).
    pub const SESSION_CANCEL: &str = "session/cancel";
    /// `session/update` (the agent's notification).
    pub const SESSION_UPDATE: &str = "session/update";
    /// `session/request_permission` (the agent's request).
    pub const REQUEST_PERMISSION: &str = "session/request_permission";
    /// `fs/read_text_file` (the agent's request).
    pub const READ_TEXT_FILE: &str = "fs/read_text_file";
    /// `$/cancel_request` (either side's notification).
    pub const CANCEL_REQUEST: &str = "$/cancel_request";
}

/// Who a party is (`clientInfo`, `agentInfo`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Implementation {
    /// Its name.
    #[serde(default)]
    pub name: String,
    /// Its name for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// `initialize`'s params, as far as the door reads them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeRequest {
    /// What the client can do for the agent.
    #[serde(default)]
    pub client_capabilities: ClientCapabilities,
    /// Who the client is.
    #[serde(default)]
    pub client_info: Option<Implementation>,
}

/// The client's capabilities the door uses.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientCapabilities {
    /// File system access.
    #[serde(default)]
    pub fs: FsCapabilities,
}

/// The client's file system capabilities.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsCapabilities {
    /// `fs/read_text_file`: the client can hand over its buffers.
    #[serde(default)]
    pub read_text_file: bool,
}

/// `initialize`'s result.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResponse {
    /// [`VERSION`].
    pub protocol_version: u64,
    /// What the agent offers.
    pub agent_capabilities: AgentCapabilities,
    /// Who the agent is.
    pub agent_info: Implementation,
    /// No authentication.
    pub auth_methods: Vec<Value>,
}

/// What the agent offers.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentCapabilities {
    /// `session/load`.
    pub load_session: bool,
    /// The prompt blocks it takes beyond text and resource links.
    pub prompt_capabilities: PromptCapabilities,
    /// The MCP transports it takes beyond stdio.
    pub mcp_capabilities: McpCapabilities,
    /// `session/list`, `session/resume`, `session/close`.
    pub session_capabilities: SessionCapabilities,
}

/// The prompt blocks an agent takes beyond text and resource links.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptCapabilities {
    /// Images.
    pub image: bool,
    /// Audio.
    pub audio: bool,
    /// Embedded resources.
    pub embedded_context: bool,
}

/// The MCP transports an agent takes beyond stdio.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct McpCapabilities {
    /// Streamable HTTP.
    pub http: bool,
    /// SSE.
    pub sse: bool,
}

/// The session methods an agent offers beyond `new` and `prompt`: each present as `{}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionCapabilities {
    /// `session/list`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list: Option<Offered>,
    /// `session/resume`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume: Option<Offered>,
    /// `session/close`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close: Option<Offered>,
}

/// A capability offered with no options (`{}`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Offered {}

/// A request naming a session (`session/load`, `session/resume`, `session/close`,
/// `session/cancel`), with the folder where a client gives it.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRef {
    /// The ACP session (the followed pi session's key).
    pub session_id: String,
    /// Its folder.
    #[serde(default)]
    pub cwd: Option<String>,
}

/// `session/new`'s and `session/list`'s params.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct InFolder {
    /// The folder.
    #[serde(default)]
    pub cwd: Option<String>,
}

/// `session/list`'s params.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ListSessionsRequest {
    /// Only the sessions working in this folder (exactly this one).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Where a previous page ended (the door hands out none).
    #[serde(default)]
    pub cursor: Option<String>,
}

/// `session/new`'s result.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSessionResponse {
    /// The ACP session.
    pub session_id: String,
}

/// One session in `session/list`'s result.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    /// The ACP session.
    pub session_id: String,
    /// Its folder.
    pub cwd: String,
    /// Its title.
    pub title: String,
    /// Its last activity this door knows of (RFC 3339): the last update it relayed, else
    /// when the pi session connected to the broker.
    #[serde(rename = "updatedAt")]
    pub updated_at: String,
}

/// `session/list`'s result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ListSessionsResponse {
    /// The sessions, best first.
    pub sessions: Vec<SessionInfo>,
}

/// `session/prompt`'s params.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptRequest {
    /// The ACP session.
    pub session_id: String,
    /// The prompt's blocks.
    #[serde(default)]
    pub prompt: Vec<ContentBlock>,
}

/// A content block as the door reads and writes it: `text`, `resource_link` (`uri`), or
/// another type the door names but does not carry (`image`, `audio`, `resource`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ContentBlock {
    /// `text`, `resource_link`, …; absent in a malformed block.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A text block's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A resource link's URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: &str) -> Self {
        ContentBlock {
            kind: Some("text".into()),
            text: Some(text.into()),
            uri: None,
        }
    }
}

/// Why a prompt turn ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The turn ended normally.
    EndTurn,
    /// The model's token limit.
    MaxTokens,
    /// The agent's request limit.
    MaxTurnRequests,
    /// The model refused.
    Refusal,
    /// The client cancelled it.
    Cancelled,
}

impl StopReason {
    /// pi's stop reason as the extension names it; one ACP does not know ends the turn.
    pub fn read(said: Option<&Value>) -> Self {
        said.and_then(|v| StopReason::deserialize(v).ok())
            .unwrap_or(StopReason::EndTurn)
    }
}

/// `session/prompt`'s result.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromptResponse {
    /// Why the turn ended.
    pub stop_reason: StopReason,
}

/// `session/update`'s params.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionNotification {
    /// The ACP session.
    pub session_id: String,
    /// What changed.
    pub update: SessionUpdate,
}

/// A session update: the two the door writes itself, or one pi's extension built.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum SessionUpdate {
    /// The door's own update.
    Own(OwnUpdate),
    /// An update the extension built, relayed as it came.
    Relayed(Value),
}

/// The updates the door writes itself.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "sessionUpdate", rename_all = "snake_case")]
pub enum OwnUpdate {
    /// A line of the door's own in the agent's voice (what was not sent, a restart).
    AgentMessageChunk {
        /// The text.
        content: ContentBlock,
    },
    /// The session's title and last activity.
    SessionInfoUpdate {
        /// "pi in <folder>".
        #[serde(skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        /// RFC 3339.
        #[serde(rename = "updatedAt")]
        updated_at: String,
    },
}

/// `session/request_permission`'s params: a review of one write.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestPermissionRequest {
    /// The ACP session.
    pub session_id: String,
    /// pi's tool call, with the diff.
    pub tool_call: ToolCallUpdate,
    /// Allow, Reject.
    pub options: Vec<PermissionOption>,
}

/// The tool call a permission is about.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallUpdate {
    /// pi's own tool call id.
    pub tool_call_id: String,
    /// "Edit <path>", "Write <path>".
    pub title: String,
    /// `edit`.
    pub kind: String,
    /// `pending`.
    pub status: String,
    /// The diff.
    pub content: Vec<DiffContent>,
    /// The file.
    pub locations: Vec<Location>,
}

/// A tool call's diff content (`{"type": "diff", …}`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename = "diff", rename_all = "camelCase")]
pub struct DiffContent {
    /// The file.
    pub path: String,
    /// Its text now (`null` for a new file).
    pub old_text: Option<String>,
    /// Its text after the write.
    pub new_text: String,
}

/// A file a tool call touches.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Location {
    /// The file.
    pub path: String,
}

/// One choice of a permission request.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionOption {
    /// What the answer names.
    pub option_id: String,
    /// What the user reads.
    pub name: String,
    /// `allow_once`, `reject_once`.
    pub kind: String,
}

/// `session/request_permission`'s result.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RequestPermissionResponse {
    /// What the user chose.
    pub outcome: PermissionOutcome,
}

/// What the user chose: an option, or nothing (the turn was cancelled).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PermissionOutcome {
    /// The prompt turn was cancelled.
    Cancelled,
    /// An option was chosen.
    Selected {
        /// Its id.
        #[serde(rename = "optionId")]
        option_id: String,
    },
}

/// `fs/read_text_file`'s params.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadTextFileRequest {
    /// The ACP session.
    pub session_id: String,
    /// The file.
    pub path: String,
}

/// `$/cancel_request`'s params.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelRequest {
    /// The request withdrawn.
    pub request_id: String,
}

/// A message's params read as `T`; `None` when they do not fit.
pub fn params<T: serde::de::DeserializeOwned>(msg: &serde_json::Map<String, Value>) -> Option<T> {
    T::deserialize(msg.get("params")?).ok()
}

/// `value` as JSON (the types above always serialise).
pub fn to_value<T: Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn updates_and_permissions_are_written_as_acp_v1_spells_them() {
        let own = SessionNotification {
            session_id: "k".into(),
            update: SessionUpdate::Own(OwnUpdate::SessionInfoUpdate {
                title: Some("pi in /p".into()),
                updated_at: "2026-12-05T00:00:00Z".into(),
            }),
        };
        assert_eq!(
            to_value(&own),
            json!({"sessionId": "k", "update": {"sessionUpdate": "session_info_update",
                "title": "pi in /p", "updatedAt": "2026-12-05T00:00:00Z"}})
        );
        let relayed = json!({"sessionUpdate": "tool_call", "toolCallId": "t"});
        assert_eq!(to_value(&SessionUpdate::Relayed(relayed.clone())), relayed);
        let diff = DiffContent {
            path: "/p/a".into(),
            old_text: None,
            new_text: "x".into(),
        };
        assert_eq!(
            to_value(&diff),
            json!({"type": "diff", "path": "/p/a", "oldText": null, "newText": "x"})
        );
    }

    #[test]
    fn answers_are_read_tolerantly_and_only_a_selected_option_is_a_choice() {
        let sel: RequestPermissionResponse = serde_json::from_value(
            json!({"outcome": {"outcome": "selected", "optionId": "allow"}}),
        )
        .expect("selected");
        assert_eq!(
            sel.outcome,
            PermissionOutcome::Selected {
                option_id: "allow".into()
            }
        );
        let cancelled: RequestPermissionResponse =
            serde_json::from_value(json!({"outcome": {"outcome": "cancelled"}}))
                .expect("cancelled");
        assert_eq!(cancelled.outcome, PermissionOutcome::Cancelled);
        assert_eq!(
            StopReason::read(Some(&json!("max_tokens"))),
            StopReason::MaxTokens
        );
        assert_eq!(
            StopReason::read(Some(&json!("paused"))),
            StopReason::EndTurn
        );
        assert_eq!(StopReason::read(None), StopReason::EndTurn);
        let init: InitializeRequest = serde_json::from_value(
            json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": true}, "terminal": true}}),
        )
        .expect("initialize");
        assert!(init.client_capabilities.fs.read_text_file);
    }
}
