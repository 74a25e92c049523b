//! Percent-coding of the native door's query values and of `file://` URI paths.
//!
//! Percent-coding, the two ways the broker needs it: query values of the native door's URLs
//! (strict: a bad escape is an error, `+` is a space) and the path part of `file://` URIs
//! that a remote session's paths are mapped in (lenient: what is not an escape stays as it is,
//! `+` is a plus).

/// Bytes a query value keeps raw: unreserved characters and `/`.
const QUERY_SAFE: &[u8] = b"-_.~/";

/// Bytes a file URI's path keeps raw: unreserved characters and the sub-delimiters, `:`, `@`
/// and `/` (everything but space, `%`, `#`, `?` and non-ASCII).
const PATH_SAFE: &[u8] = b"/-_.~!$&'()*+,;=:@";

/// Encodes a query value (everything but unreserved characters and `/`).
pub fn encode_query(s: &str) -> String {
    encode(s, QUERY_SAFE)
}

/// Encodes what a file URI's path must not carry raw (space, `%`, `#`, `?`, non-ASCII).
pub fn encode_path(s: &str) -> String {
    encode(s, PATH_SAFE)
}

/// Decodes a query value: `%XX` escapes and `+` (as a space); `None` for a bad escape or
/// bytes that are not UTF-8.
pub fn decode_query(s: &str) -> Option<String> {
    String::from_utf8(decode(s, Mode::Query)?).ok()
}

/// Decodes a file URI's path: `%XX` escapes only; anything else, a stray `%` included, stays
/// as it is, and bytes that are not UTF-8 become U+FFFD.
pub fn decode_path(s: &str) -> String {
    let bytes = decode(s, Mode::Path).unwrap_or_default();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn encode(s: &str, safe: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || safe.contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Query,
    Path,
}

/// The bytes `s` stands for; `None` only in `Query` mode, for a bad escape.
fn decode(s: &str, mode: Mode) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let escaped = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match (escaped, mode) {
                    (Some(v), _) => {
                        out.push(v);
                        i += 3;
                    }
                    (None, Mode::Query) => return None,
                    (None, Mode::Path) => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' if mode == Mode::Query => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_round_trip() {
        for s in ["/a b/ç/%/+&=", "", "/plain"] {
            assert_eq!(decode_query(&encode_query(s)).as_deref(), Some(s));
        }
    }

    #[test]
    fn query_decoding_is_strict_and_reads_plus_as_space() {
        assert_eq!(decode_query("a+b%2Bc").as_deref(), Some("a b+c"));
        assert_eq!(decode_query("%ZZ"), None);
        assert_eq!(decode_query("100%"), None);
        assert_eq!(decode_query("%FF"), None, "not UTF-8");
    }

    #[test]
    fn path_decoding_keeps_what_is_not_an_escape() {
        assert_eq!(decode_path("/a+b/my%20file%23.rs"), "/a+b/my file#.rs");
        assert_eq!(decode_path("/100%/x%Z"), "/100%/x%Z");
        assert_eq!(decode_path("/%C3%A9t%C3%A9"), "/été");
        assert_eq!(decode_path("/%FF"), "/\u{FFFD}");
    }

    #[test]
    fn paths_keep_their_delimiters_raw_and_escape_the_rest() {
        assert_eq!(
            encode_path("/a b/c#d?e%/é/x+y:@!$&'()*,;="),
            "/a%20b/c%23d%3Fe%25/%C3%A9/x+y:@!$&'()*,;="
        );
        assert_eq!(encode_query("/a b+c"), "/a%20b%2Bc");
    }
}
