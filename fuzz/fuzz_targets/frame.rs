//! Any bytes as a frame from a peer: classification never panics, a rejection always yields a
//! well-formed JSON-RPC error, and the bridge never turns an answer into an error for a diff.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_ide_broker::protocol::bridge::{inbound, marked_tab, Bridge};
use pi_ide_broker::protocol::jsonrpc::{self, Incoming};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match jsonrpc::classify(text) {
        Err(r) => {
            let answer: serde_json::Value = serde_json::from_str(&jsonrpc::rejection(&r)).expect("our error is JSON");
            assert!(answer["error"]["code"].is_i64());
        }
        Ok(Incoming::Response { mut msg, .. }) => {
            let b = Bridge::DiffOnClaude { session_tab: "t".into(), editor_tab: marked_tab(1, "t"), close_on_accept: true };
            inbound(&b, &mut msg);
            assert!(!msg.contains_key("error"));
            let verdict = msg["result"]["content"][0]["text"].as_str();
            assert!(matches!(verdict, Some("FILE_SAVED") | Some("DIFF_REJECTED")));
            for b in [Bridge::DiagnosticsToPi { uri: None }, Bridge::DiagnosticsToClaude, Bridge::TabsToPi, Bridge::TabsToClaude] {
                let mut m = msg.clone();
                inbound(&b, &mut m);
            }
        }
        Ok(_) => {}
    }
});
