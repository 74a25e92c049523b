//! One validating pass over a JSON object, handing out its members as borrowed text.
//!
//! A call is forwarded and an answer returned by reading a few members and passing the rest on
//! as bytes, without building a tree or copying a string.
//!
//! Kept, measured against the crate that would replace it: serde_json's borrowed
//! deserialisation (`#[serde(borrow)]` structs of `&RawValue` members) reads the same call and
//! answer in 7,730 instructions where this scan takes 4,040 (`benches/parse.rs` under
//! callgrind, 100,000 calls of `getDiagnostics`): 3,690 more per call, over the 1,000 a
//! replacement may cost, about a third of the broker's whole 11.6 k per call.
//!
//! The scan accepts exactly what `serde_json` accepts into a struct of the wanted members
//! (checked against it by a property test): it refuses a wanted member given twice, and it
//! declines nesting deeper than [`MAX_DEPTH`]. Callers then take their slow path, which
//! parses with `serde_json` and answers any error.

/// Deepest nesting the scan follows. Deeper text goes to the slow path, whose
/// `serde_json::Value` parse refuses nesting deeper than 128.
pub const MAX_DEPTH: u32 = 127;

/// Scans `text`, which must be one JSON object and nothing else, and returns the raw text of
/// each member named in `wanted` (`None` for the absent ones), in `wanted`'s order. `None`
/// when the text is not valid JSON, not an object, names a wanted member twice, or nests too
/// deep.
pub fn members<'a, const N: usize>(
    text: &'a str,
    wanted: [&str; N],
) -> Option<[Option<&'a str>; N]> {
    members_in::<N, 0>(text, wanted, N, []).map(|(out, _)| out)
}

/// [`members`], and in the same pass the members `inner` of the object that is member
/// `wanted[at]` (`None` for them when that member is absent or not an object): a request's
/// params are read without a second pass over them.
#[allow(clippy::type_complexity)]
pub fn members_in<'a, const N: usize, const M: usize>(
    text: &'a str,
    wanted: [&str; N],
    at: usize,
    inner: [&str; M],
) -> Option<([Option<&'a str>; N], Option<[Option<&'a str>; M]>)> {
    let b = text.as_bytes();
    let (found, end) = object(text, ws(b, 0), &wanted, at, &inner)?;
    (ws(b, end) == b.len()).then_some(found)
}

/// The text of a JSON string literal without its quotes, when it has no escapes (`None`
/// otherwise, or when `raw` is not a string).
pub fn plain_str(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// A JSON number that is a plain non-negative integer (`17`, not `17.0` or `1e1`).
pub fn plain_u64(raw: &str) -> Option<u64> {
    if raw.is_empty() || !raw.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    raw.parse().ok()
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Where in `w` (eight bytes, little-endian) the first `"`, `\` or control character (below
/// 0x20) is: the bytes a string scan must stop at. A flag can be wrong only above a true one,
/// so the lowest is exact.
fn first_special(w: u64) -> Option<usize> {
    let quote = w ^ (ONES * u64::from(b'"'));
    let slash = w ^ (ONES * u64::from(b'\\'));
    let zero_in = |v: u64| v.wrapping_sub(ONES) & !v;
    let flags = (zero_in(quote) | zero_in(slash) | (w.wrapping_sub(ONES * 0x20) & !w)) & HIGH;
    (flags != 0).then(|| flags.trailing_zeros() as usize / 8)
}

/// Bytes of a string scanned eight at a time before the rest of the run goes to `long_run`.
const LONG_RUN: usize = 24;

/// In a long string, from `i`: where its next `"` or `\` is (SIMD, through `memchr`), once
/// no control character is found before it (a pass the compiler vectorises). Block by block,
/// so both passes read each block while it is in the cache. `None` when there is none
/// (unterminated) or a control character comes first.
#[inline(never)]
fn long_run(b: &[u8], mut i: usize) -> Option<usize> {
    const BLOCK: usize = 4096;
    loop {
        let rest = b.get(i..)?;
        let block = rest.get(..BLOCK).unwrap_or(rest);
        if block.is_empty() {
            return None;
        }
        let at = memchr::memchr2(b'"', b'\\', block);
        let run = block.get(..at.unwrap_or(block.len()))?;
        if run.iter().fold(false, |seen, &c| seen | (c < 0x20)) {
            return None;
        }
        match at {
            Some(at) => return Some(i + at),
            None => i += block.len(),
        }
    }
}

// The scan is written as functions of (bytes, position) that return the position after what
// they read: the cursor stays in a register rather than behind a `&mut self`.

/// Past any whitespace from `i`.
#[inline(always)]
fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

/// The next byte that is not whitespace, from `i`, and where it is. Compact JSON (the common
/// case) costs one comparison: only a byte at or below a space can be whitespace.
#[inline(always)]
fn token(b: &[u8], i: usize) -> Option<(u8, usize)> {
    match b.get(i) {
        Some(&c) if c > b' ' => Some((c, i)),
        _ => {
            let i = ws(b, i);
            Some((*b.get(i)?, i))
        }
    }
}

/// An object from its `{` at `i`: the raw text of the members named in `wanted`, and of those
/// named in `inner` inside the object that is member `wanted[at]` (no inner object is read
/// when `at` is out of `wanted`'s range, as the plain readers pass it); and where it ends.
#[allow(clippy::type_complexity)]
fn object<'a, const N: usize, const M: usize>(
    text: &'a str,
    i: usize,
    wanted: &[&str; N],
    at: usize,
    inner: &[&str; M],
) -> Option<(([Option<&'a str>; N], Option<[Option<&'a str>; M]>), usize)> {
    let b = text.as_bytes();
    let mut out = [None; N];
    let mut nested = None;
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let (mut c, mut i) = token(b, i + 1)?;
    if c == b'}' {
        return Some(((out, nested), i + 1));
    }
    loop {
        if c != b'"' {
            return None;
        }
        let (end, k) = key_in(b, i, wanted)?;
        let (colon, j) = token(b, end)?;
        if colon != b':' {
            return None;
        }
        let (v, start) = token(b, j + 1)?;
        i = match v {
            b'{' if k == Some(at) => {
                let (found, end) = object::<M, 0>(text, start, inner, M, &[])?;
                nested = Some(found.0);
                end
            }
            // The common scalars without the nesting machinery.
            b'"' => string(b, start)?.0,
            b'-' | b'0'..=b'9' => number(b, start)?,
            _ => value(b, start)?,
        };
        if let Some(slot) = k.and_then(|k| out.get_mut(k)) {
            if slot.is_some() {
                return None;
            }
            *slot = text.get(start..i);
        }
        let (sep, j) = token(b, i)?;
        match sep {
            b',' => (c, i) = token(b, j + 1)?,
            b'}' => return Some(((out, nested), j + 1)),
            _ => return None,
        }
    }
}

/// The member name whose opening quote is at `i`: where it ends, and which of `wanted` it
/// is (`None`: none of them), compared as bytes where the name has no escapes; an escaped
/// name (rare) is decoded by serde_json first.
#[inline(always)]
fn key_in(b: &[u8], i: usize, wanted: &[&str]) -> Option<(usize, Option<usize>)> {
    let (end, escaped) = string(b, i)?;
    if escaped {
        let name: String = serde_json::from_slice(b.get(i..end)?).ok()?;
        return Some((end, wanted.iter().position(|w| *w == name)));
    }
    let name = b.get(i + 1..end - 1)?;
    Some((end, wanted.iter().position(|w| w.as_bytes() == name)))
}

/// A string whose opening quote is at `i` (the caller has seen it): where it ends (past
/// its closing quote), and whether it had escapes. The text is UTF-8 already (it came from
/// a `&str`).
#[inline(always)]
fn string(b: &[u8], mut i: usize) -> Option<(usize, bool)> {
    i += 1;
    let mut escaped = false;
    loop {
        // Eight bytes at a time to the next byte that needs a look; a run longer than
        // LONG_RUN goes to `long_run` (a file's contents in a diff, say).
        let long_at = i + LONG_RUN;
        while let Some(chunk) = b.get(i..i + 8) {
            let w = u64::from_le_bytes(chunk.try_into().ok()?);
            if let Some(at) = first_special(w) {
                i += at;
                break;
            }
            i += 8;
            if i >= long_at {
                i = long_run(b, i)?;
                break;
            }
        }
        let c = *b.get(i)?;
        i += 1;
        match c {
            b'"' => return Some((i, escaped)),
            b'\\' => {
                escaped = true;
                match *b.get(i)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 1,
                    b'u' => {
                        let hex = b.get(i + 1..i + 5)?;
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return None;
                        }
                        i += 5;
                    }
                    _ => return None,
                }
            }
            c if c < 0x20 => return None,
            _ => {}
        }
    }
}

/// Past the digits from `i`; `None` when there are none.
fn digits(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start;
    while b.get(i).is_some_and(u8::is_ascii_digit) {
        i += 1;
    }
    (i > start).then_some(i)
}

/// A number from `i`: where it ends.
#[inline(always)]
fn number(b: &[u8], mut i: usize) -> Option<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match *b.get(i)? {
        b'0' => i += 1,
        b'1'..=b'9' => i = digits(b, i)?,
        _ => return None,
    }
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    Some(i)
}

/// `word` at `i`: where it ends.
fn literal(b: &[u8], i: usize, word: &[u8]) -> Option<usize> {
    let end = i + word.len();
    (b.get(i..end)? == word).then_some(end)
}

/// A member name and its colon inside a nested object, from the name's opening quote (or
/// whitespace before it): where the member's value may start.
#[inline(always)]
fn name_and_colon(b: &[u8], i: usize) -> Option<usize> {
    let (q, i) = token(b, i)?;
    if q != b'"' {
        return None;
    }
    let (end, _) = string(b, i)?;
    let (colon, i) = token(b, end)?;
    (colon == b':').then_some(i + 1)
}

/// One value of any kind from `i`, nesting followed without recursion (a bit per open
/// container, set for an object, says what closes it and whether members need names): where
/// it ends.
fn value(b: &[u8], mut i: usize) -> Option<usize> {
    let mut objects: u128 = 0;
    let mut depth: u32 = 0;
    loop {
        // A value starts here.
        let (c, at) = token(b, i)?;
        i = match c {
            b'{' | b'[' => {
                let close = if c == b'{' { b'}' } else { b']' };
                let (next, j) = token(b, at + 1)?;
                if next == close {
                    j + 1
                } else {
                    depth += 1;
                    if depth > MAX_DEPTH {
                        return None;
                    }
                    objects = (objects << 1) | u128::from(c == b'{');
                    i = if c == b'{' { name_and_colon(b, j)? } else { j };
                    continue;
                }
            }
            b'"' => string(b, at)?.0,
            b't' => literal(b, at, b"true")?,
            b'f' => literal(b, at, b"false")?,
            b'n' => literal(b, at, b"null")?,
            _ => number(b, at)?,
        };
        // A value ended: close containers until one wants another member.
        loop {
            if depth == 0 {
                return Some(i);
            }
            let (c, at) = token(b, i)?;
            let in_object = objects & 1 == 1;
            match c {
                b',' => {
                    i = if in_object {
                        name_and_colon(b, at + 1)?
                    } else {
                        at + 1
                    };
                    break;
                }
                b'}' if in_object => {}
                b']' if !in_object => {}
                _ => return None,
            }
            i = at + 1;
            depth -= 1;
            objects >>= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn members_are_the_raw_text_of_each_wanted_name() {
        let t =
            r#" {"jsonrpc":"2.0", "id" : "a\"b", "params":{"x":[1,2.5e-3,{"y":null}]},"z":true} "#;
        let [id, params, missing] = members(t, ["id", "params", "nope"]).unwrap();
        assert_eq!(id, Some(r#""a\"b""#));
        assert_eq!(params, Some(r#"{"x":[1,2.5e-3,{"y":null}]}"#));
        assert_eq!(missing, None);
        assert_eq!(members("{}", ["a"]), Some([None]));
    }

    #[test]
    fn members_in_reads_an_inner_object_in_the_same_pass() {
        let t = r#"{"id":1,"params":{"name":"echo","arguments":{"name":"inner"}},"x":[]}"#;
        let (outer, inner) = members_in(t, ["id", "params"], 1, ["name", "arguments"]).unwrap();
        assert_eq!(
            outer,
            [
                Some("1"),
                Some(r#"{"name":"echo","arguments":{"name":"inner"}}"#)
            ]
        );
        assert_eq!(
            inner,
            Some([Some(r#""echo""#), Some(r#"{"name":"inner"}"#)])
        );
        // Not an object: no inner members, the outer ones as ever.
        let (outer, inner) = members_in(r#"{"params":[1]}"#, ["params"], 0, ["name"]).unwrap();
        assert_eq!((outer, inner), ([Some("[1]")], None));
        // An inner wanted name twice is refused like an outer one.
        assert!(members_in(r#"{"p":{"n":1,"n":2}}"#, ["p"], 0, ["n"]).is_none());
        assert!(members_in(r#"{"p":{"n":1,}}"#, ["p"], 0, ["n"]).is_none());
    }

    #[test]
    fn refuses_a_wanted_name_twice_and_declines_deep_nesting() {
        assert_eq!(members(r#"{"id":1,"id":2}"#, ["id"]), None);
        assert_eq!(members(r#"{"i\u0064":1,"id":2}"#, ["id"]), None);
        // An escaped name is decoded.
        assert_eq!(members(r#"{"i\u0064":1}"#, ["id"]), Some([Some("1")]));
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(members(&deep, ["a"]), None);
        // Not a wanted name: twice is fine, as serde_json takes it.
        assert!(members(r#"{"x":1,"x":2}"#, ["id"]).is_some());
    }

    #[test]
    fn refuses_what_json_refuses() {
        for bad in [
            "",
            "[]",
            "{",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":1,}",
            "{\"a\":1} x",
            "{\"a\":01}",
            "{\"a\":1.}",
            "{\"a\":-}",
            "{\"a\":tru}",
            "{\"a\":\"\t\"}",
            "{\"a\":\"\\x\"}",
            "{\"a\":\"\\u12g4\"}",
            "{\"a\":[1,]}",
            "{\"a\":[1 2]}",
            "{\"a\":{\"b\" 1}}",
            "{\"a\":{\"b\":1,\"c\" 2}}",
            "{\"a\":{\"b\":1,2}}",
            "{\"a\":[{\"b\":1,\"c\"}]}",
            "{\"a\":[1}}",
            "{\"a\":{\"b\":1]}",
            "{\"a\":[1]]}",
            "{\"a\" 1}",
            "{\"a\"x1}",
            "{\"a\":{\"b\"x1}}",
            "{\"a\":[{\"c\":2,\"b\"x1}]}",
            "{\"a\":\"unterminated}",
            "{\"a\":[}",
            "{'a':1}",
            "{\"a\":NaN}",
        ] {
            assert_eq!(members(bad, ["a"]), None, "{bad:?}");
            assert!(serde_json::from_str::<serde_json::Value>(bad).map_or(true, |v| !v.is_object()));
        }
    }

    #[test]
    fn long_strings_are_read_across_their_blocks() {
        let long = |at: usize, what: &str| {
            format!(
                "{{\"a\":\"{}{what}{}\",\"b\":2}}",
                "x".repeat(at),
                "y".repeat(9000 - at)
            )
        };
        for at in [0, 30, 4095, 4096, 4097, 8191, 8999] {
            for what in ["\\\"", "\\n", "\u{e9}"] {
                let text = long(at, what);
                let [a, b] = members(&text, ["a", "b"]).unwrap_or_else(|| panic!("{at} {what:?}"));
                let want: serde_json::Value = serde_json::from_str(&text).unwrap();
                assert_eq!(
                    serde_json::from_str::<serde_json::Value>(a.unwrap())
                        .ok()
                        .as_ref(),
                    want.get("a")
                );
                assert_eq!(b, Some("2"));
            }
            for bad in ["\u{1}", "\n"] {
                assert_eq!(members(&long(at, bad), ["a"]), None, "{at} {bad:?}");
            }
        }
        assert_eq!(
            members(&format!("{{\"a\":\"{}", "x".repeat(9000)), ["a"]),
            None
        );
    }

    #[test]
    fn plain_values() {
        assert_eq!(plain_str(r#""tools/call""#), Some("tools/call"));
        assert_eq!(plain_str(r#""a\nb""#), None);
        assert_eq!(plain_str("17"), None);
        assert_eq!(plain_u64("17"), Some(17));
        for no in ["", "-1", "1.0", "1e2", "\"1\"", "99999999999999999999999"] {
            assert_eq!(plain_u64(no), None, "{no}");
        }
    }

    /// JSON-ish text: mostly valid JSON, with now and then a byte broken, so both sides of
    /// every rule are reached.
    fn jsonish() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            Just("false".to_string()),
            "-?(0|[1-9][0-9]{0,3})(\\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?",
            "\"([a-z\u{e9}\u{1F600} /]|\\\\[\"\\\\/bfnrt]|\\\\u[0-9a-fA-F]{4})*\"",
        ];
        let value = leaf.prop_recursive(5, 40, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(("[a-z]{1,3}", inner), 0..4).prop_map(|m| {
                    let m: Vec<String> = m
                        .into_iter()
                        .map(|(k, v)| format!("\"{k}\" : {v}"))
                        .collect();
                    format!("{{ {} }}", m.join(" ,"))
                }),
            ]
        });
        let object = prop::collection::vec(("[a-d]{1,2}", value), 0..5).prop_map(|m| {
            let m: Vec<String> = m.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", m.join(","))
        });
        (
            object,
            any::<u16>(),
            0u8..4,
            prop::sample::select(vec![
                '"', '\\', ',', ':', '{', '}', '[', ']', '1', '.', ' ', '\u{1}',
            ]),
        )
            .prop_map(|(mut s, at, how, c)| {
                let at = usize::from(at) % (s.len() + 1);
                if s.is_char_boundary(at) {
                    match how {
                        0 => s.insert(at, c),
                        1 if at < s.len() && s.is_char_boundary(at + 1) => {
                            s.remove(at);
                        }
                        _ => {}
                    }
                }
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The word-at-a-time search stops exactly where a byte-by-byte one would.
        #[test]
        fn first_special_is_exact(bytes in prop::array::uniform8(prop_oneof![any::<u8>(), Just(b'"'), Just(b'\\'), 0u8..0x21, 0x7fu8..0x82])) {
            let want = bytes.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
            prop_assert_eq!(first_special(u64::from_le_bytes(bytes)), want);
        }

        /// Reading an inner object in the same pass finds what a second pass over it finds,
        /// and changes nothing outside it.
        #[test]
        fn members_in_agrees_with_two_passes(text in jsonish()) {
            let once = members_in(&text, ["a", "b", "c"], 0, ["a", "b"]);
            let outer = members(&text, ["a", "b", "c"]);
            match (once, outer) {
                (Some((got, inner)), Some(want)) => {
                    prop_assert_eq!(got, want);
                    let second = want[0].filter(|a| a.starts_with('{')).and_then(|a| members(a, ["a", "b"]));
                    prop_assert_eq!(inner, second);
                }
                (None, Some(want)) => {
                    // Only an inner wanted name given twice refuses the one-pass read.
                    let a = want[0].filter(|a| a.starts_with('{'));
                    prop_assert!(a.is_some_and(|a| members(a, ["a", "b"]).is_none()));
                }
                (Some(_), None) => prop_assert!(false, "one pass accepted what the scan refuses"),
                (None, None) => {}
            }
        }

        /// The scan and serde_json, reading the same members into a struct (as `RawValue`s,
        /// which like the scan let a lone surrogate escape through), accept the same texts
        /// and find the same members.
        #[test]
        /// Long strings (past `LONG_RUN`, scanned by `long_run`) with a quote, a backslash, a
        /// control character or a multi-byte character anywhere: accepted and cut exactly where
        /// serde_json accepts and ends them.
        fn long_strings_agree_with_serde_json(
            pieces in prop::collection::vec(prop_oneof![
                8 => Just("x".to_string()),
                1 => Just("\\\"".to_string()),
                1 => Just("\\n".to_string()),
                1 => Just("\u{e9}\u{1F600}".to_string()),
                1 => Just("\"".to_string()),
                1 => Just("\\".to_string()),
                1 => Just("\u{1}".to_string()),
                1 => Just("\t".to_string()),
            ], 0..120),
            run in 0usize..80,
        ) {
            let body = format!("{}{}", "y".repeat(run), pieces.concat());
            let text = format!("{{\"a\":\"{body}\",\"b\":1}}");
            let ours = members(&text, ["a", "b"]);
            let theirs = serde_json::from_str::<serde_json::Value>(&text).ok();
            match (ours, theirs) {
                (Some([a, b]), Some(v)) => {
                    let a: Option<serde_json::Value> = a.and_then(|a| serde_json::from_str(a).ok());
                    prop_assert_eq!(a.as_ref(), v.get("a"));
                    prop_assert_eq!(b, Some("1"));
                }
                (None, None) => {}
                (ours, theirs) => prop_assert!(false, "scan {:?}, serde_json {:?}", ours, theirs),
            }
        }

        #[test]
        fn agrees_with_serde_json(text in jsonish()) {
            use serde_json::value::RawValue;
            #[derive(serde::Deserialize)]
            struct Abc<'a> {
                #[serde(borrow, default)]
                a: Option<&'a RawValue>,
                #[serde(borrow, default)]
                b: Option<&'a RawValue>,
                #[serde(borrow, default)]
                c: Option<&'a RawValue>,
            }
            let ours = members(&text, ["a", "b", "c"]);
            // serde also reads a struct from an array; the scan reads objects only.
            let object = text.trim_start_matches([' ', '\t', '\n', '\r']).starts_with('{');
            let theirs = serde_json::from_str::<Abc>(&text).ok().filter(|_| object);
            match (ours, theirs) {
                (Some(got), Some(t)) => {
                    // serde reads a member that is `null` into an `Option` as `None`.
                    let got = got.map(|r| r.filter(|r| *r != "null"));
                    prop_assert_eq!(got, [t.a, t.b, t.c].map(|r| r.map(RawValue::get)));
                }
                (Some(_), None) => prop_assert!(false, "scan accepted what serde_json refuses"),
                (None, Some(_)) => prop_assert!(false, "scan refused what serde_json accepts"),
                (None, None) => {}
            }
        }
    }
}
