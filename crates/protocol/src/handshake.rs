//! The MCP handshake (`initialize`) as types, for the broker as a client and as a server.
//!
//! What the broker asks as a client (of an editor, of its own daemon) and answers as a server
//! (to sessions, the stdio door, Gemini CLI).
//!
//! An editor's own `initialize` answer is not retyped: the broker replays it to sessions as
//! the editor wrote it (its capabilities and instructions are the editor's to say).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The protocol version the broker asks for when it is the client (editors answer it).
pub const PROTOCOL_VERSION: &str = "2024-11-05";

/// `"initialize"`.
pub const INITIALIZE: &str = "initialize";

/// `"notifications/initialized"`, the client's word that the handshake is done.
pub const INITIALIZED: &str = "notifications/initialized";

/// Who a party of the handshake is (`clientInfo`, `serverInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Implementation {
    /// Its name.
    pub name: String,
    /// Its version.
    #[serde(default)]
    pub version: String,
}

impl Implementation {
    /// This build, under `name` (`pi-ide-broker`, or the door speaking).
    pub fn broker(name: &str) -> Self {
        Implementation {
            name: name.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// `initialize`'s params: the version asked for, the client's capabilities, who it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// The revision the client asks for (a date, `2025-06-18`); absent or not a string in
    /// what some clients send.
    #[serde(default, deserialize_with = "string_or_none")]
    pub protocol_version: Option<String>,
    /// The client's capabilities (the broker, as a client, declares none).
    #[serde(default)]
    pub capabilities: Value,
    /// Who the client is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_info: Option<Implementation>,
}

impl InitializeParams {
    /// The broker's own `initialize` as a client named `name`, asking for `version`.
    pub fn broker(name: &str, version: &str) -> Self {
        InitializeParams {
            protocol_version: Some(version.to_string()),
            capabilities: Value::Object(Default::default()),
            client_info: Some(Implementation::broker(name)),
        }
    }

    /// A request's params as far as they fit (a field that does not fit is left out: the
    /// handshake answers anyway, with the server's own version).
    pub fn read(params: Option<&Value>) -> Self {
        params
            .and_then(|p| InitializeParams::deserialize(p).ok())
            .unwrap_or(InitializeParams {
                protocol_version: None,
                capabilities: Value::Null,
                client_info: None,
            })
    }

    /// As JSON params.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// `initialize`'s result as the broker answers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    /// The revision the server speaks on this connection.
    pub protocol_version: String,
    /// What it offers: tools only.
    pub capabilities: ServerCapabilities,
    /// Who it is.
    pub server_info: Implementation,
    /// How it is meant to be used, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

impl InitializeResult {
    /// The broker's answer: `version`, tools (whose list may change), served as `pi-ide-broker`.
    pub fn broker(version: &str, list_changed: bool) -> Self {
        InitializeResult {
            protocol_version: version.to_string(),
            capabilities: ServerCapabilities {
                tools: ToolsCapability {
                    list_changed: Some(list_changed),
                },
            },
            server_info: Implementation::broker("pi-ide-broker"),
            instructions: None,
        }
    }

    /// As a JSON-RPC result.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// A server's capabilities as the broker declares them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServerCapabilities {
    /// It serves tools.
    pub tools: ToolsCapability,
}

/// The `tools` capability.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolsCapability {
    /// `tools/list` may change (`notifications/tools/list_changed`).
    #[serde(
        rename = "listChanged",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub list_changed: Option<bool>,
}

/// A field that is a string, else nothing (a client that sends `"protocolVersion": 1` still
/// gets its handshake).
fn string_or_none<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Value::deserialize(d)? {
        Value::String(s) => Some(s),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_broker_asks_and_answers_in_the_wire_shape() {
        assert_eq!(
            InitializeParams::broker("pi-ide-broker", PROTOCOL_VERSION).to_value(),
            json!({"protocolVersion": "2024-11-05", "capabilities": {},
                "clientInfo": {"name": "pi-ide-broker", "version": env!("CARGO_PKG_VERSION")}})
        );
        let mut answer = InitializeResult::broker("2025-06-18", true);
        answer.instructions = Some("use the tools".into());
        assert_eq!(
            answer.to_value(),
            json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {"listChanged": true}},
                "serverInfo": {"name": "pi-ide-broker", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "use the tools"})
        );
    }

    #[test]
    fn what_a_client_asks_is_read_as_far_as_it_fits() {
        let asked = InitializeParams::read(Some(&json!({"protocolVersion": "2025-06-18",
            "capabilities": {"roots": {}}, "clientInfo": {"name": "claude-code", "version": "2"}})));
        assert_eq!(asked.protocol_version.as_deref(), Some("2025-06-18"));
        assert_eq!(
            asked.client_info.map(|c| c.name).as_deref(),
            Some("claude-code")
        );
        for odd in [
            json!({"protocolVersion": 7}),
            json!({}),
            json!([1]),
            json!("x"),
        ] {
            assert_eq!(
                InitializeParams::read(Some(&odd)).protocol_version,
                None,
                "{odd}"
            );
        }
        assert_eq!(InitializeParams::read(None).protocol_version, None);
    }
}
