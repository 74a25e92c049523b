//! The id of a JSON-RPC message that is read past in pieces and never held.
//!
//! A message refused for want of memory (`wire::budget`) is still owed an answer with its id,
//! and the id may come anywhere among its members (the MCP SDKs put it last, after the
//! params). [`IdScan`] is fed the message's bytes as they pass and keeps only what it needs:
//! how deep it is, whether it is in a string, and the text of a top-level `id` member (at most
//! [`MAX_ID`] bytes). It does not check the JSON: garbage gives no id, or a wrong one, never a
//! panic. Inside strings (a file's contents, the bulk of a long message) it skips to the next
//! quote or backslash through `memchr`.

/// The longest id text kept; a longer one is no id (the answer's id is then `null`).
pub const MAX_ID: usize = 128;

/// What the scan knows of the message so far.
#[derive(Debug, Default)]
pub struct IdScan {
    /// Containers open around here (outside strings).
    depth: u32,
    /// In a string.
    in_string: bool,
    /// The byte before was a backslash in a string.
    escaped: bool,
    /// At depth 1 of an object, the next string is a member name.
    expect_name: bool,
    /// In a member name at depth 1: its bytes so far (up to 3, enough to tell `id`), or
    /// `None` past that or after an escape.
    name: Option<Vec<u8>>,
    /// In a member name at depth 1.
    in_name: bool,
    /// The member at depth 1 whose value comes is `id`.
    id_member: bool,
    /// Taking the value of `id` now.
    taking: bool,
    /// The value of `id` so far (only while `taking`, at most `MAX_ID` bytes).
    value: Vec<u8>,
    /// The value of `id` was longer than `MAX_ID`.
    too_long: bool,
    /// The last complete top-level `id` value's text.
    found: Option<Vec<u8>>,
}

impl IdScan {
    /// Reads the next bytes of the message.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            if self.in_string && !self.escaped && !self.in_name && !self.taking {
                // The bulk of a long message: jump to the next byte that can end the string.
                match memchr::memchr2(b'"', b'\\', &bytes[i..]) {
                    Some(at) => i += at,
                    None => return,
                }
            }
            self.byte(bytes[i]);
            i += 1;
        }
    }

    /// One byte.
    fn byte(&mut self, c: u8) {
        if self.taking {
            self.keep(c);
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == b'\\' {
                self.escaped = true;
                if self.in_name {
                    // An escaped name (`"i\u0064"`) is rare: not taken for `id`.
                    self.name = None;
                }
            } else if c == b'"' {
                self.in_string = false;
                if self.in_name {
                    self.in_name = false;
                    self.id_member = self.name.as_deref() == Some(b"id");
                }
            } else if self.in_name {
                if let Some(n) = &mut self.name {
                    if n.len() < 3 {
                        n.push(c);
                    } else {
                        self.name = None;
                    }
                }
            }
            return;
        }
        match c {
            b'"' => {
                self.in_string = true;
                if self.depth == 1 && self.expect_name {
                    self.expect_name = false;
                    self.in_name = true;
                    self.name = Some(Vec::new());
                }
            }
            b'{' | b'[' => {
                self.depth = self.depth.saturating_add(1);
                if self.depth == 1 {
                    self.expect_name = c == b'{';
                }
            }
            b'}' | b']' => {
                if self.depth == 1 {
                    self.value_ends();
                }
                self.depth = self.depth.saturating_sub(1);
            }
            b':' if self.depth == 1 && self.id_member && !self.taking => {
                self.taking = true;
                self.value.clear();
                self.too_long = false;
            }
            b',' if self.depth == 1 => {
                self.value_ends();
                self.expect_name = true;
            }
            _ => {}
        }
    }

    /// Keeps `c` as part of the id's text (not the `,` or `}` that ends it: taken off in
    /// `value_ends`).
    fn keep(&mut self, c: u8) {
        if self.value.len() < MAX_ID + 1 {
            self.value.push(c);
        } else {
            self.too_long = true;
        }
    }

    /// A member's value at depth 1 ended (at a `,` or the closing `}`).
    fn value_ends(&mut self) {
        if self.taking {
            self.taking = false;
            // The byte that ended it was kept too.
            self.value.pop();
            if !self.too_long && self.value.len() <= MAX_ID {
                self.found = Some(std::mem::take(&mut self.value));
            }
        }
        self.id_member = false;
    }

    /// The message's top-level `id` (the last one, if it had several) when it is a number or
    /// a string; `None` when it had none, or none that can be an id.
    pub fn id(&self) -> Option<serde_json::Value> {
        let text = self.found.as_deref()?;
        match serde_json::from_slice(text).ok()? {
            v @ (serde_json::Value::Number(_) | serde_json::Value::String(_)) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn id_of(text: &str) -> Option<Value> {
        let mut s = IdScan::default();
        s.feed(text.as_bytes());
        s.id()
    }

    #[test]
    fn the_top_level_id_is_found_wherever_it_is() {
        assert_eq!(
            id_of(r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#),
            Some(json!(7))
        );
        assert_eq!(
            id_of(
                r#"{"method":"x","params":{"id":1,"t":"\"id\":2,"},"jsonrpc":"2.0","id":"last"}"#
            ),
            Some(json!("last")),
            "after the params (the MCP SDKs' order); a nested id and one in a string are not it"
        );
        assert_eq!(
            id_of(" { \"id\" : -1.5e3 , \"x\" : [ ] } "),
            serde_json::from_str("-1.5e3").ok()
        );
        assert_eq!(
            id_of(r#"{"id":"a\"b\\","x":1}"#),
            Some(json!("a\"b\\")),
            "escapes in the id"
        );
        assert_eq!(id_of(r#"{"id":"é"}"#), Some(json!("é")));
    }

    #[test]
    fn no_id_when_there_is_none_that_can_be_one() {
        for text in [
            r#"{"jsonrpc":"2.0","method":"notify"}"#,
            r#"{"id":null}"#,
            r#"{"id":{"a":1}}"#,
            r#"{"id":[1]}"#,
            r#"{"params":{"id":1}}"#,
            r#"[{"id":1}]"#,
            r#"{"ids":1,"i":2}"#,
            r#"{"x":"\"id\":1"}"#,
            r#"{"id":1"#,
            "not json",
            "",
        ] {
            assert_eq!(id_of(text), None, "{text}");
        }
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(MAX_ID));
        assert_eq!(id_of(&long), None, "an id longer than MAX_ID");
        let fits = format!(r#"{{"id":"{}"}}"#, "x".repeat(MAX_ID - 2));
        assert!(id_of(&fits).is_some());
    }

    fn message() -> impl Strategy<Value = (Value, String)> {
        let id = prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e12f64..1e12).prop_map(Value::from),
            "[ -~é\\\\\"\\n]{0,24}".prop_map(Value::from),
        ];
        let junk = prop_oneof![
            Just(json!(null)),
            "[ -~é\\\\\"{}\\[\\]:,]{0,40}".prop_map(Value::from),
            prop::collection::vec("[a-z\"]{0,6}", 0..4)
                .prop_map(|v| json!({"id": v, "text": "\"id\":9,"})),
        ];
        (id, junk, 0usize..3).prop_map(|(id, junk, at)| {
            let mut members: Vec<(&str, Value)> = vec![
                ("jsonrpc", json!("2.0")),
                ("method", json!("tools/call")),
                ("params", json!({"arguments": junk})),
            ];
            members.insert(at, ("id", id.clone()));
            let body: Vec<String> = members
                .iter()
                .map(|(k, v)| format!("{}:{v}", Value::from(*k)))
                .collect();
            (id, format!("{{{}}}", body.join(",")))
        })
    }

    proptest! {
        /// Fed in any pieces, the scan finds the id serde_json reads from the whole message.
        #[test]
        fn finds_what_serde_finds_however_the_bytes_are_cut(
            (id, text) in message(),
            cuts in prop::collection::vec(0usize..200, 0..6),
        ) {
            let whole: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(&whole["id"], &id);
            let bytes = text.as_bytes();
            let mut s = IdScan::default();
            let mut at = 0;
            for c in cuts {
                let end = (at + c).min(bytes.len());
                s.feed(&bytes[at..end]);
                at = end;
            }
            s.feed(&bytes[at..]);
            let want = (id.to_string().len() <= MAX_ID).then_some(id);
            prop_assert_eq!(s.id(), want);
        }
    }
}
