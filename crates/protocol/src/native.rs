//! The native door's `broker/*` notices to a session (the pi extension reads them), typed.
//!
//! Each is built in one place. Method names are `jsonrpc::broker`'s; `docs/protocol.md` has
//! the wire. `broker/editors`' answer is `registry`'s (it names link states).

use super::family::Family;
use super::jsonrpc::{self, broker};
use super::version::BrokerInfo;
use serde::Serialize;

/// A notice to a session: its method and its params.
pub trait Notice: Serialize {
    /// The notification's method.
    const METHOD: &'static str;

    /// The notification as a frame.
    fn frame(&self) -> String {
        jsonrpc::notification(
            Self::METHOD,
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null),
        )
    }
}

/// `broker/attached`: the session is attached to `editor` (with its name, folders and family
/// while it is known), and which broker serves it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attached {
    /// The editor's id.
    pub editor: String,
    /// `ideName` from its lockfile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ide_name: Option<String>,
    /// Its workspace folders as its lockfile writes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workspace_folders: Option<Vec<String>>,
    /// Its family.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<Family>,
    /// The broker's version and protocol revision.
    pub broker: BrokerInfo,
}

impl Notice for Attached {
    const METHOD: &'static str = broker::ATTACHED;
}

/// `broker/detached`: the session is no longer attached, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Detached {
    /// Why, in words.
    pub reason: String,
}

impl Notice for Detached {
    const METHOD: &'static str = broker::DETACHED;
}

/// `broker/notice`: something the user should know once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserNotice {
    /// `warning`.
    pub level: &'static str,
    /// What to say.
    pub message: String,
}

impl Notice for UserNotice {
    const METHOD: &'static str = broker::NOTICE;
}

/// `broker/editor_state`: the attached editor is `taken` by another client, or `ready` again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EditorState {
    /// The editor's id.
    pub editor: String,
    /// `taken` or `ready`.
    pub state: &'static str,
    /// Who holds it, while it is taken (`null` otherwise).
    pub reason: Option<String>,
}

impl Notice for EditorState {
    const METHOD: &'static str = broker::EDITOR_STATE;
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn params(frame: &str) -> Value {
        serde_json::from_str::<Value>(frame).unwrap()["params"].clone()
    }

    #[test]
    fn each_notice_is_written_as_the_extension_reads_it() {
        let bare = Attached {
            editor: "e1".into(),
            ide_name: None,
            workspace_folders: None,
            family: None,
            broker: super::super::version::broker_info(),
        };
        let f: Value = serde_json::from_str(&bare.frame()).unwrap();
        assert_eq!(f["method"], "broker/attached");
        assert_eq!(
            f["params"],
            json!({"editor": "e1", "broker": {"version": env!("CARGO_PKG_VERSION"), "protocol": super::super::version::PROTOCOL}})
        );
        let full = Attached {
            ide_name: Some("Neovim".into()),
            workspace_folders: Some(vec!["/p".into()]),
            family: Some(Family::Claude),
            ..bare
        };
        let p = params(&full.frame());
        assert_eq!(p["ide_name"], "Neovim");
        assert_eq!(p["workspace_folders"], json!(["/p"]));
        assert_eq!(p["family"], json!(Family::Claude));
        let state = EditorState {
            editor: "e1".into(),
            state: "ready",
            reason: None,
        };
        assert_eq!(
            params(&state.frame()),
            json!({"editor": "e1", "state": "ready", "reason": null})
        );
    }
}
