//! MCP's protocol eras, told apart per request: the 2025 era and the stateless 2026-07-28 one.
//!
//! The 2025 era has an `initialize` handshake, then requests; in the 2026-07-28 era every
//! request says its version in `_meta` (no handshake; `server/discover`; results carry
//! `resultType` and cache hints).
//!
//! The era is decided per request, as the 2026-07-28 revision says (a server may serve both
//! on one stream): a request whose `params._meta` names `io.modelcontextprotocol/protocolVersion`
//! is of that version's era; one that names none is of the 2025 era. What belongs to the
//! broker itself (discovery, a version it does not speak, the methods the revision removed)
//! is answered here, never forwarded to an editor.

use super::jsonrpc;
use serde_json::{json, Map, Value};

/// The stateless revision.
pub const MODERN: &str = "2026-07-28";

/// Every revision a door of the broker speaks, newest first (what `server/discover` and the
/// unsupported-version error name).
pub const SUPPORTED: [&str; 5] = [
    MODERN,
    "2025-11-25",
    "2025-06-18",
    "2025-03-26",
    "2024-11-05",
];

/// `_meta` key of a request's protocol version (2026-07-28).
pub const VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";

/// JSON-RPC error code of `UnsupportedProtocolVersion` (2026-07-28, SEP-2575).
pub const UNSUPPORTED_VERSION: i64 = -32022;

/// How long a client may keep a list result before asking again: short, since the tools are
/// the attached editor's and it may change (the modern era has no `list_changed`).
pub const LIST_TTL_MS: u64 = 5_000;

/// The methods 2026-07-28 removed; a modern request for one is answered "method not found".
pub const REMOVED: [&str; 3] = [
    "ping",
    "logging/setLevel",
    "notifications/roots/list_changed",
];

/// The era of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Era {
    /// No version in `_meta` (or a 2025-era one): the handshake era.
    Legacy,
    /// 2026-07-28: stateless.
    Modern,
    /// A version this broker does not speak (named).
    Unsupported(String),
}

/// The era `msg` (a request's members) is of.
pub fn of(msg: &Map<String, Value>) -> Era {
    let said = msg
        .get("params")
        .and_then(|p| p.get("_meta"))
        .and_then(|m| m.get(VERSION_KEY));
    match said {
        None => Era::Legacy,
        Some(Value::String(v)) if v == MODERN => Era::Modern,
        Some(Value::String(v)) if SUPPORTED.contains(&v.as_str()) => Era::Legacy,
        Some(Value::String(v)) => Era::Unsupported(v.clone()),
        Some(other) => Era::Unsupported(other.to_string()),
    }
}

/// The `UnsupportedProtocolVersion` error for `requested`, naming what is supported.
pub fn unsupported(id: &Value, requested: &str) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": UNSUPPORTED_VERSION,
            "message": format!("unsupported protocol version {requested:?}; this server speaks {}", SUPPORTED.join(", ")),
            "data": {"requested": requested, "supported": SUPPORTED},
        },
    })
    .to_string()
}

/// A modern request for a method the revision removed.
pub fn removed(id: &Value, method: &str) -> String {
    jsonrpc::error(
        id,
        jsonrpc::METHOD_NOT_FOUND,
        &format!("Method not found: {method} (removed in MCP {MODERN})"),
    )
}

/// The answer to `server/discover`: the versions, the capabilities, who the server is and
/// how it is meant to be used, with the cache hints a discovery result carries.
pub fn discover(id: &Value, name: &str, instructions: &str) -> String {
    discover_offering(id, name, instructions, &SUPPORTED)
}

/// The answer to `server/discover` offering only `versions`: a door that wants a client in
/// the handshake era (for its event stream) offers the 2025 ones, and the client initializes.
pub fn discover_offering(id: &Value, name: &str, instructions: &str, versions: &[&str]) -> String {
    let info = super::handshake::Implementation::broker(name);
    jsonrpc::result(
        id,
        json!({
            "supportedVersions": versions,
            "capabilities": {"tools": {}},
            "serverInfo": info,
            "instructions": instructions,
            "resultType": "complete",
            "ttlMs": LIST_TTL_MS,
            "cacheScope": "private",
            "_meta": {"io.modelcontextprotocol/serverInfo": info},
        }),
    )
}

/// A 2025-era answer made a modern one: `resultType` on every result, and a list result's
/// cache hints (`list`). Errors pass unchanged.
pub fn modernize(text: &str, list: bool) -> String {
    let Ok(Value::Object(mut msg)) = serde_json::from_str::<Value>(text) else {
        return text.to_string();
    };
    let Some(Value::Object(result)) = msg.get_mut("result") else {
        return text.to_string();
    };
    result
        .entry("resultType")
        .or_insert_with(|| json!("complete"));
    if list {
        result.entry("ttlMs").or_insert_with(|| json!(LIST_TTL_MS));
        result
            .entry("cacheScope")
            .or_insert_with(|| json!("private"));
    }
    Value::Object(msg).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(meta: Value) -> Map<String, Value> {
        match json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}})
        {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn the_era_is_the_requests_own() {
        assert_eq!(of(&req(json!({VERSION_KEY: MODERN}))), Era::Modern);
        assert_eq!(of(&req(json!({VERSION_KEY: "2025-11-25"}))), Era::Legacy);
        assert_eq!(of(&req(json!({"progressToken": 3}))), Era::Legacy);
        assert_eq!(of(&Map::new()), Era::Legacy);
        assert_eq!(
            of(&req(json!({VERSION_KEY: "2099-01-01"}))),
            Era::Unsupported("2099-01-01".into())
        );
        assert_eq!(
            of(&req(json!({VERSION_KEY: 7}))),
            Era::Unsupported("7".into())
        );
    }

    #[test]
    fn the_broker_answers_what_is_its_own() {
        let e: Value = serde_json::from_str(&unsupported(&json!(4), "2099-01-01")).unwrap();
        assert_eq!(e["error"]["code"], -32022, "SEP-2575's code");
        assert_eq!(e["error"]["data"]["requested"], "2099-01-01");
        assert_eq!(e["error"]["data"]["supported"][0], MODERN);
        assert!(e["error"]["data"]["supported"]
            .as_array()
            .is_some_and(|s| s.contains(&json!("2025-11-25"))));
        let d: Value = serde_json::from_str(&discover(&json!("d"), "x", "use it")).unwrap();
        assert_eq!(d["result"]["resultType"], "complete");
        assert_eq!(d["result"]["supportedVersions"][0], MODERN);
        assert_eq!(d["result"]["serverInfo"]["name"], "x");
        let r: Value = serde_json::from_str(&removed(&json!(1), "ping")).unwrap();
        assert_eq!(r["error"]["code"], jsonrpc::METHOD_NOT_FOUND);
    }

    #[test]
    fn a_modern_answer_says_it_is_complete_and_how_long_a_list_keeps() {
        let m: Value = serde_json::from_str(&modernize(
            r#"{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}"#,
            true,
        ))
        .unwrap();
        assert_eq!(m["result"]["resultType"], "complete");
        assert_eq!(m["result"]["ttlMs"], LIST_TTL_MS);
        assert_eq!(m["result"]["cacheScope"], "private");
        let c: Value = serde_json::from_str(&modernize(
            r#"{"jsonrpc":"2.0","id":1,"result":{"content":[]}}"#,
            false,
        ))
        .unwrap();
        assert_eq!(c["result"]["resultType"], "complete");
        assert!(c["result"].get("ttlMs").is_none());
        let err = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"x"}}"#;
        assert_eq!(modernize(err, false), err);
    }
}
