//! Any bytes as a lockfile: `parse` must return a value or an error, never panic, and never
//! put the token into an error message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::registry::lifecycle::lockfile;
use std::path::Path;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = lockfile::parse(text, Path::new("/x/1234.lock"), Family::Pi, 1234) {
        let msg = e.to_string();
        if let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(text) {
            if let Some(serde_json::Value::String(t)) = m.get("authToken") {
                assert!(t.len() < 4 || !msg.contains(t.as_str()), "token leaked into an error");
            }
        }
    }
    let _ = lockfile::port_from_name(Path::new(text));
});
