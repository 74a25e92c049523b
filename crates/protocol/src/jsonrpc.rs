//! The JSON-RPC 2.0 layer: classifying what a peer sent and building what we send back.
//! Ids are kept as `serde_json::Value` (a client's plain integer id as a `ClientId`) so they go
//! back with their exact JSON type and value.

use serde_json::{json, Map, Value};

/// Invalid JSON was received.
pub const PARSE_ERROR: i64 = -32700;
/// The JSON is not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// The method does not exist.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Invalid method parameters.
pub const INVALID_PARAMS: i64 = -32602;
/// Generic server-side failure (the editors use it for tool failures).
pub const SERVER_ERROR: i64 = -32000;
/// No editor is attached to the session, or the attached one is unreachable.
pub const NO_EDITOR: i64 = -32001;
/// A short tool did not answer in time.
pub const TIMEOUT: i64 = -32002;
/// The broker is overloaded for this peer (queue full).
pub const BUSY: i64 = -32003;

/// MCP's notification that a request is taken back (`{requestId, reason?}`): no answer is owed.
pub const CANCELLED: &str = "notifications/cancelled";

/// A client's request id, kept until its answer goes back: a plain non-negative integer
/// without an allocation (the common case; with `arbitrary_precision`, `serde_json` keeps
/// every number as its text), any other id as the JSON value it was.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientId {
    /// An id whose JSON text is exactly this integer's decimal digits.
    Plain(u64),
    /// Any other id, exactly as sent.
    Json(Value),
}

impl ClientId {
    /// The id as a JSON value (allocated for a plain one: for the rare paths).
    pub fn value(&self) -> std::borrow::Cow<'_, Value> {
        match self {
            ClientId::Plain(n) => std::borrow::Cow::Owned(Value::from(*n)),
            ClientId::Json(v) => std::borrow::Cow::Borrowed(v),
        }
    }

    /// The id as a JSON value, by value.
    pub fn into_value(self) -> Value {
        match self {
            ClientId::Plain(n) => Value::from(n),
            ClientId::Json(v) => v,
        }
    }

    /// True when `id` (as a peer sent it, e.g. a cancellation's `requestId`) is this id.
    pub fn is(&self, id: &Value) -> bool {
        *self.value() == *id
    }
}

/// One well-formed message, classified.
#[derive(Debug)]
pub enum Incoming {
    /// `{id, method}`: wants an answer.
    Request {
        /// The peer's id, exactly as sent.
        id: Value,
        /// The method name.
        method: String,
        /// The whole message.
        msg: Map<String, Value>,
    },
    /// `{method}` without an id.
    Notification {
        /// The method name.
        method: String,
        /// The whole message.
        msg: Map<String, Value>,
    },
    /// `{id, result}` or `{id, error}`: an answer to a request the peer was sent.
    Response {
        /// The id it answers.
        id: Value,
        /// The whole message.
        msg: Map<String, Value>,
    },
}

/// A message that cannot be handled, with the error owed to the peer.
#[derive(Debug, PartialEq)]
pub struct Rejection {
    /// The id to answer with (`null` when unknown).
    pub id: Value,
    /// The JSON-RPC error code.
    pub code: i64,
    /// What was wrong.
    pub message: String,
}

/// Parses and classifies one frame's text.
pub fn classify(text: &str) -> Result<Incoming, Rejection> {
    let value: Value = serde_json::from_str(text).map_err(|e| Rejection {
        id: Value::Null,
        code: PARSE_ERROR,
        message: format!("Parse error: {e}"),
    })?;
    classify_value(value)
}

/// Classifies an already parsed message.
pub fn classify_value(value: Value) -> Result<Incoming, Rejection> {
    let mut msg = match value {
        Value::Object(m) => m,
        Value::Array(_) => {
            return Err(invalid(
                Value::Null,
                "Invalid Request: batches are not supported",
            ))
        }
        _ => {
            return Err(invalid(
                Value::Null,
                "Invalid Request: not a JSON-RPC object",
            ))
        }
    };
    let id = msg.get("id").cloned();
    if let Some(id) = &id {
        if !matches!(id, Value::String(_) | Value::Number(_) | Value::Null) {
            return Err(invalid(
                Value::Null,
                "Invalid Request: id must be a string, number or null",
            ));
        }
    }
    if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(
            id.unwrap_or(Value::Null),
            "Invalid Request: jsonrpc must be \"2.0\"",
        ));
    }
    match (msg.get("method"), id) {
        (Some(Value::String(m)), Some(id)) => {
            let method = m.clone();
            check_params(&msg, &id)?;
            Ok(Incoming::Request { id, method, msg })
        }
        (Some(Value::String(m)), None) => {
            let method = m.clone();
            check_params(&msg, &Value::Null)?;
            Ok(Incoming::Notification { method, msg })
        }
        (Some(_), id) => Err(invalid(
            id.unwrap_or(Value::Null),
            "Invalid Request: method must be a string",
        )),
        (None, Some(id)) if msg.contains_key("result") || msg.contains_key("error") => {
            msg.remove("jsonrpc");
            msg.insert("jsonrpc".into(), "2.0".into());
            Ok(Incoming::Response { id, msg })
        }
        (None, id) => Err(invalid(
            id.unwrap_or(Value::Null),
            "Invalid Request: no method, result or error",
        )),
    }
}

fn check_params(msg: &Map<String, Value>, id: &Value) -> Result<(), Rejection> {
    match msg.get("params") {
        None | Some(Value::Object(_)) | Some(Value::Array(_)) => Ok(()),
        Some(_) => Err(invalid(
            id.clone(),
            "Invalid Request: params must be an object or array",
        )),
    }
}

fn invalid(id: Value, message: &str) -> Rejection {
    Rejection {
        id,
        code: INVALID_REQUEST,
        message: message.into(),
    }
}

/// `{"jsonrpc":"2.0","id":id,"result":result}` as text.
pub fn result(id: &Value, result: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string()
}

/// `{"jsonrpc":"2.0","id":id,"error":{code,message}}` as text.
pub fn error(id: &Value, code: i64, message: &str) -> String {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}).to_string()
}

/// The error answer for a [`Rejection`].
pub fn rejection(r: &Rejection) -> String {
    error(&r.id, r.code, &r.message)
}

/// A notification as text.
pub fn notification(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

/// A request as text.
pub fn request(id: &Value, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// The `openDiff` result an agent reads as "the user rejected it": `[DIFF_REJECTED, tab_name]`.
/// The broker answers this (never an error, never `FILE_SAVED`) when it cannot deliver the
/// editor's real answer, since pi applies an edit unreviewed when `openDiff` errors.
pub fn diff_rejected(tab_name: &str) -> Value {
    json!({"content": [
        {"type": "text", "text": "DIFF_REJECTED"},
        {"type": "text", "text": tab_name},
    ]})
}

/// The broker's own methods on a session (README "Sessions"): one spelling for every door.
pub mod broker {
    /// Request: the candidate editors for the session's cwd, best first.
    pub const EDITORS: &str = "broker/editors";
    /// Request `{editor}`: attach to that editor (it becomes the sticky target).
    pub const ATTACH: &str = "broker/attach";
    /// Request: detach (and stay detached until `broker/attach`).
    pub const DETACH: &str = "broker/detach";
    /// Notification `{editor, ide_name, workspace_folders, family}`: now attached.
    pub const ATTACHED: &str = "broker/attached";
    /// Notification `{reason}`: no longer attached.
    pub const DETACHED: &str = "broker/detached";
    /// Broker → session: something the user should know once (`{level, message}`), e.g. a
    /// protocol revision that differs from the client's (`version`).
    pub const NOTICE: &str = "broker/notice";
    /// Notification `{editor, state, reason}`: the attached editor's link is `taken` by
    /// another client (a single-client editor), or `ready` again; the session stays attached.
    pub const EDITOR_STATE: &str = "broker/editor_state";
}

/// The follow methods (protocol 2): an ACP door (`pi-ide-broker acp`) follows a pi session
/// through the broker (`docs/protocol.md`, "Following a session").
pub mod follow {
    /// Broker → session: `{count, reviewer}`, how many followers it has and whether one of
    /// them reviews its diffs now (its turn is open).
    pub const FOLLOWERS: &str = "broker/followers";
    /// Session → broker → followers: `{update}`, one ACP `SessionUpdate` of its transcript.
    pub const UPDATE: &str = "pi/update";
    /// Follower → broker → session, request: `{}` → `{updates: [SessionUpdate]}`, the
    /// transcript so far.
    pub const HISTORY: &str = "pi/history";
    /// Follower → broker → session, request: `{text}` → `{stopReason}`, answered when the
    /// turn the text started ends.
    pub const PROMPT: &str = "pi/prompt";
    /// Follower → broker → session, request: `{}` → `{}`: abort the running turn.
    pub const CANCEL: &str = "pi/cancel";
    /// Broker → follower, request: `{arguments}` (an `openDiff`'s) → the `openDiff` result
    /// (`FILE_SAVED` with the contents, or `DIFF_REJECTED`).
    pub const REVIEW: &str = "pi/review";
    /// Broker → follower: `{session, cwd, client}`, the session it follows.
    pub const ATTACHED: &str = "follow/attached";
    /// Broker → follower: `{reason}`, the session ended.
    pub const ENDED: &str = "follow/ended";
    /// Follower → broker: `{ready}`, whether it can review diffs now (a turn is open).
    pub const READY: &str = "follow/review";
    /// Session → broker, request: `{path}` → `{content}`, the text of `path` as the editor of
    /// a follower that offers `fs.readTextFile` holds it (unsaved changes included).
    pub const READ: &str = "broker/read";
    /// Broker → follower, request: `{path}` → `{content}` (the client's `fs/read_text_file`).
    pub const READ_BUFFER: &str = "pi/read";
    /// The methods a follower may send on to its session.
    pub const FORWARDED: [&str; 3] = [HISTORY, PROMPT, CANCEL];
}

/// The `DIFF_REJECTED` the broker answers itself when a diff cannot reach the user (editor
/// lost, broker stopping, no editor): the same shape, plus `_meta."pi-ide-broker/undelivered"`
/// with the reason, so a client that knows it can tell "not reviewed" from "the user said no".
pub fn diff_undelivered(tab_name: &str, why: &str) -> Value {
    let mut v = diff_rejected(tab_name);
    v["_meta"] = json!({"pi-ide-broker/undelivered": why});
    v
}

/// The `tab_name` of an `openDiff` call (`None` for any other message; `""` when missing).
pub fn diff_tab(msg: &Map<String, Value>) -> Option<String> {
    (tool_name(msg) == Some("openDiff")).then(|| {
        msg.get("params")
            .and_then(|p| p.get("arguments"))
            .and_then(|a| a.get("tab_name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    })
}

/// `params.name` of a `tools/call`, if any.
pub fn tool_name(msg: &Map<String, Value>) -> Option<&str> {
    msg.get("params")?.get("name")?.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_plain_client_id_is_exactly_its_integer() {
        let id = ClientId::Plain(7);
        assert!(id.is(&json!(7)));
        for other in ["\"7\"", "7.0", "7e0", "70", "null"] {
            let v: Value = serde_json::from_str(other).unwrap();
            assert!(!id.is(&v), "{other}");
        }
        assert_eq!(id.into_value().to_string(), "7");
        let big: Value = serde_json::from_str("18446744073709551616").unwrap();
        assert_eq!(
            ClientId::Json(big.clone()).value().to_string(),
            big.to_string()
        );
    }

    #[test]
    fn classifies() {
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","id":1,"method":"x"}"#),
            Ok(Incoming::Request { .. })
        ));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","method":"x"}"#),
            Ok(Incoming::Notification { .. })
        ));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#),
            Ok(Incoming::Response { .. })
        ));
        assert!(matches!(
            classify(r#"{"jsonrpc":"2.0","id":null,"method":"x"}"#),
            Ok(Incoming::Request {
                id: Value::Null,
                ..
            })
        ));
    }

    #[test]
    fn rejects_garbage_with_the_right_code() {
        let cases = [
            ("{", PARSE_ERROR, Value::Null),
            ("[]", INVALID_REQUEST, Value::Null),
            (
                "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}]",
                INVALID_REQUEST,
                Value::Null,
            ),
            ("42", INVALID_REQUEST, Value::Null),
            (r#"{"id":1,"method":"x"}"#, INVALID_REQUEST, json!(1)),
            (
                r#"{"jsonrpc":"2.0","id":{"a":1},"method":"x"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","id":[1],"method":"x"}"#,
                INVALID_REQUEST,
                Value::Null,
            ),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":7}"#,
                INVALID_REQUEST,
                json!(3),
            ),
            (r#"{"jsonrpc":"2.0","id":3}"#, INVALID_REQUEST, json!(3)),
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"x","params":5}"#,
                INVALID_REQUEST,
                json!(3),
            ),
        ];
        for (text, code, id) in cases {
            let r = classify(text).unwrap_err();
            assert_eq!((r.code, &r.id), (code, &id), "{text}");
        }
    }

    proptest! {
        #[test]
        fn arbitrary_text_is_classified_or_refused_with_a_well_formed_error(s in ".{0,200}") {
            if let Err(r) = classify(&s) {
                prop_assert!([PARSE_ERROR, INVALID_REQUEST].contains(&r.code), "{}", r.code);
                let answer: Value = serde_json::from_str(&rejection(&r)).expect("our error is JSON");
                prop_assert_eq!(&answer["error"]["code"], &json!(r.code));
                prop_assert_eq!(&answer["jsonrpc"], &json!("2.0"));
            }
        }

        #[test]
        fn request_ids_survive_exactly(n in any::<i64>(), s in "[ -~]{0,40}", f in -1e12f64..1e12) {
            for id in [json!(n), json!(s.clone()), json!(f), Value::Null] {
                let text = request(&id, "m", json!({}));
                match classify(&text) {
                    Ok(Incoming::Request { id: got, .. }) => prop_assert_eq!(got, id),
                    other => prop_assert!(false, "{:?}", other),
                }
            }
        }

        #[test]
        fn huge_and_odd_numeric_ids_keep_their_exact_text(digits in "[1-9][0-9]{20,40}", frac in "[0-9]{1,20}") {
            for lit in [digits.clone(), format!("{digits}.{frac}"), format!("-{digits}e-7")] {
                let text = format!(r#"{{"jsonrpc":"2.0","id":{lit},"method":"m"}}"#);
                let Ok(Incoming::Request { id, .. }) = classify(&text) else { panic!("{text}") };
                prop_assert_eq!(id.to_string(), lit);
            }
        }
    }
}
