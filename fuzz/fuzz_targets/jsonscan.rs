//! Any text through the hot paths' scan: it never panics, and it accepts a text exactly when
//! serde_json reads the same members from it (as `RawValue`s, into a struct), finding the
//! same raw text for each.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_ide_broker::wire::jsonscan::members;
use serde_json::value::RawValue;

#[derive(serde::Deserialize)]
struct Wanted<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let ours = members(text, ["id", "params"]);
    // serde also reads a struct from an array; the scan reads objects only.
    let object = text.trim_start_matches([' ', '\t', '\n', '\r']).starts_with('{');
    let theirs = serde_json::from_str::<Wanted>(text).map_err(|e| e.to_string()).and_then(|w| {
        if object { Ok(w) } else { Err("not an object".to_string()) }
    });
    match (ours, theirs) {
        (Some(got), Ok(w)) => {
            // serde reads a member that is `null` into an `Option` as `None`.
            let got = got.map(|r| r.filter(|r| *r != "null"));
            assert_eq!(got, [w.id.map(RawValue::get), w.params.map(RawValue::get)]);
        }
        (None, Err(_)) => {}
        // The scan declines nesting deeper than it follows; serde_json's limit is close by.
        (None, Ok(_)) => assert!(text.matches(['[', '{']).count() > pi_ide_broker::wire::jsonscan::MAX_DEPTH as usize),
        (Some(_), Err(e)) => panic!("scan accepted what serde_json refuses: {e}"),
    }
});
