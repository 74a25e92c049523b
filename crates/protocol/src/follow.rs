//! The follow protocol's own messages, typed.
//!
//! The notices the broker and a follower (the ACP door) tell each other about the follow
//! itself, and `GET /v1/pi-sessions`' answer (what can be followed). Built and read through
//! these types on both sides; the session traffic a follower relays (`pi/*` requests,
//! transcript updates) stays JSON-RPC as pi writes it. Method names are `jsonrpc::follow`'s.

use crate::jsonrpc::{self, follow};
use crate::version::ClientInfo;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// One follow notification: its method and its params' shape.
pub trait Notice: Serialize + DeserializeOwned {
    /// The JSON-RPC method it travels as.
    const METHOD: &'static str;

    /// The whole notification frame.
    fn frame(&self) -> String {
        jsonrpc::notification(
            Self::METHOD,
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null),
        )
    }

    /// The notice in a JSON-RPC message's params, if the message is this notice and its params
    /// have this shape.
    fn from_message(msg: &serde_json::Map<String, serde_json::Value>) -> Option<Self> {
        if msg.get("method").and_then(serde_json::Value::as_str) != Some(Self::METHOD) {
            return None;
        }
        serde_json::from_value(msg.get("params")?.clone()).ok()
    }
}

/// One pi session a follower can follow, as `GET /v1/pi-sessions` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PiSession {
    /// Its key (pi's session id); `None` for a session without one (not followable by key).
    pub session: Option<String>,
    /// Its cwd, as pi gave it.
    pub cwd: String,
    /// When it connected, in unix seconds.
    pub since: u64,
    /// The editor it is attached to, if any.
    pub editor: Option<String>,
    /// How many followers it has now.
    pub followers: usize,
}

/// `GET /v1/pi-sessions?cwd=`'s answer: the sessions an editor in `cwd` can follow, the most
/// recently active first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PiSessions {
    /// The sessions.
    pub sessions: Vec<PiSession>,
}

/// Broker → follower, first on a follow connection: the session it now follows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attached {
    /// The pi session's key (pi's session id).
    pub session: Option<String>,
    /// Its cwd, as pi gave it.
    pub cwd: String,
    /// The client the session runs in (the pi extension, with its version).
    pub client: Option<ClientInfo>,
}

impl Notice for Attached {
    const METHOD: &'static str = follow::ATTACHED;
}

/// Broker → follower: the session ended, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ended {
    /// Why, in words for the user.
    pub reason: String,
}

impl Notice for Ended {
    const METHOD: &'static str = follow::ENDED;
}

/// Follower → broker: whether it can review diffs now (a turn of its client is open).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewReady {
    /// Ready to review.
    pub ready: bool,
}

impl Notice for ReviewReady {
    const METHOD: &'static str = follow::READY;
}

/// `broker/followers`, told to the session (its extension): how many follow it, which one
/// reviews its diffs, and whether one hands over unsaved buffers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Followers {
    /// How many followers.
    pub count: usize,
    /// The reviewing follower's name, while one has its turn open.
    pub reviewer: Option<String>,
    /// A follower reads buffers (`broker/read` can be answered).
    pub buffers: bool,
}

impl Notice for Followers {
    const METHOD: &'static str = follow::FOLLOWERS;
}

/// `pi/review`'s params: the session's `openDiff`, for the follower to ask its user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Review {
    /// The diff.
    #[serde(default)]
    pub arguments: DiffArgs,
}

/// An `openDiff`'s arguments, as a follower reads them (a missing one is empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffArgs {
    /// The file as it is (absent: a new file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_file_path: Option<String>,
    /// The file written.
    #[serde(default)]
    pub new_file_path: String,
    /// Its text after the write.
    #[serde(default)]
    pub new_file_contents: String,
    /// The session's name for the diff (pi's `pi-<tool>:<toolCallId>`).
    #[serde(default)]
    pub tab_name: String,
}

/// `pi/prompt`'s params: the follower's prompt, for the session to run as its user's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptParams {
    /// What to send to pi.
    #[serde(default)]
    pub text: String,
    /// The id the session sees this `pi/prompt` under: set by the broker as it forwards the
    /// request (whatever the follower put there), so the session can tell its followers'
    /// prompts apart and a `pi/cancel` can name one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

/// `pi/cancel`'s params: which prompt of the follower to stop.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelParams {
    /// From the follower: the id of its own `pi/prompt`. The broker forwards it as the id the
    /// session saw that prompt under ([`PromptParams::prompt`]), or answers the cancel itself
    /// when that prompt is answered already. Absent (an older follower): every prompt of
    /// followers, as the session sees fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

/// `pi/read`'s params: the file whose unsaved buffer the session wants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadBuffer {
    /// The file.
    pub path: String,
}

/// A request's params read as `T`, `None` when they do not fit.
pub fn params<T: DeserializeOwned>(params: Option<&serde_json::Value>) -> Option<T> {
    T::deserialize(params?).ok()
}

/// `value` as JSON params (these types always serialise).
pub fn to_params<T: Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(frame: &str) -> serde_json::Map<String, serde_json::Value> {
        serde_json::from_str(frame).unwrap()
    }

    #[test]
    fn each_notice_reads_back_as_itself_and_as_no_other() {
        let attached = Attached {
            session: Some("s1".into()),
            cwd: "/p".into(),
            client: Some(ClientInfo {
                name: "pi-ide-broker-pi".into(),
                version: Some("0.1.0".into()),
                protocol: Some(2),
            }),
        };
        let f = message(&attached.frame());
        assert_eq!(f["method"], follow::ATTACHED);
        assert_eq!(Attached::from_message(&f), Some(attached));
        assert_eq!(Ended::from_message(&f), None, "another method");
        let ended = Ended {
            reason: "pi exited".into(),
        };
        assert_eq!(Ended::from_message(&message(&ended.frame())), Some(ended));
        let ready = ReviewReady { ready: true };
        assert_eq!(
            ReviewReady::from_message(&message(&ready.frame())),
            Some(ready)
        );
        // Another notice's method with params of this shape is not this notice.
        let other = message(r#"{"jsonrpc":"2.0","method":"follow/ended","params":{"ready":true}}"#);
        assert_eq!(ReviewReady::from_message(&other), None);
        // The right method with params of another shape is no notice.
        let odd = message(r#"{"jsonrpc":"2.0","method":"follow/review","params":{"ready":"yes"}}"#);
        assert_eq!(ReviewReady::from_message(&odd), None);
    }
}
