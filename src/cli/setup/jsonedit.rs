//! Adding one member to, and removing it from, a JSON config file as text: everything else in
//! the file (order, layout, other entries) stays byte for byte. `jsonscan` finds the members.

use crate::wire::jsonscan;
use serde_json::Value;

/// What adding an entry found.
#[derive(Debug, PartialEq)]
pub(super) enum Added {
    /// The new text; whether the container object was created.
    Text(String, bool),
    /// The same entry is there already.
    Present,
    /// Another entry of that name is there (its text): left alone.
    Conflict(String),
}

/// Where `inner` (a slice of `outer`) starts in it.
fn offset(outer: &str, inner: &str) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

/// The one named member of the object `obj` (raw text), when present.
fn member<'a>(obj: &'a str, name: &str) -> Result<Option<&'a str>, String> {
    jsonscan::members(obj, [name])
        .map(|[m]| m)
        .ok_or_else(|| "it is not a JSON object (comments are not read)".to_string())
}

/// Inserts `"key": value` as the first member of the object that starts at `open` in `text`
/// (`indent`: the member's indentation, two spaces deeper than the object's).
fn insert_first(text: &str, open: usize, key: &str, value: &str, indent: &str) -> String {
    let rest = &text[open + 1..];
    let key = Value::String(key.to_string());
    if rest.trim_start().starts_with('}') {
        let close_indent = &indent[..indent.len().saturating_sub(2)];
        let closing = rest.trim_start();
        format!(
            "{}{{\n{indent}{key}: {value}\n{close_indent}{closing}",
            &text[..open]
        )
    } else {
        format!("{}{{\n{indent}{key}: {value},{rest}", &text[..open])
    }
}

/// Adds `name: entry` to the object member `container` of the top-level object in `text`
/// (creating it when missing).
pub(super) fn add(text: &str, container: &str, name: &str, entry: &Value) -> Result<Added, String> {
    let text = if text.trim().is_empty() { "{}\n" } else { text };
    let entry_text = serde_json::to_string(entry).unwrap_or_default();
    let Some(servers) = member(text, container)? else {
        let open = offset(text, text.trim_start());
        let inner = format!(
            "{{\n    {}: {entry_text}\n  }}",
            Value::String(name.to_string())
        );
        return Ok(Added::Text(
            insert_first(text, open, container, &inner, "  "),
            true,
        ));
    };
    if !servers.starts_with('{') {
        return Err(format!("its `{container}` is not an object"));
    }
    if let Some(existing) = member(servers, name)? {
        let same = serde_json::from_str::<Value>(existing).is_ok_and(|v| v == *entry);
        return Ok(if same {
            Added::Present
        } else {
            Added::Conflict(existing.to_string())
        });
    }
    let open = offset(text, servers);
    Ok(Added::Text(
        insert_first(text, open, name, &entry_text, "    "),
        false,
    ))
}

/// The byte range of member `name` (key through value) inside `text`, given its value.
fn member_range(text: &str, name: &str, value: &str) -> Option<(usize, usize)> {
    let start = offset(text, value);
    let before = text[..start].trim_end().strip_suffix(':')?.trim_end();
    let key = Value::String(name.to_string()).to_string();
    let key_start = before.strip_suffix(key.as_str())?.len();
    Some((key_start, start + value.len()))
}

/// `text` without the member spanning `range`, and the comma that separated it.
fn cut(text: &str, (start, end): (usize, usize)) -> String {
    let after = &text[end..];
    let trimmed = after.trim_start();
    if let Some(rest) = trimmed.strip_prefix(',') {
        let next = rest.len() - rest.trim_start().len();
        return format!("{}{}", &text[..start], &rest[next..]);
    }
    let before = text[..start].trim_end();
    match before.strip_suffix(',') {
        Some(b) => format!("{b}{after}"),
        None => format!("{before}{}", trimmed.trim_start()),
    }
}

/// Removes `name` from `container` when it is still `entry` (and `container` too when
/// `drop_container` and nothing else is left in it). `Ok(None)`: not there any more.
pub(super) fn remove(
    text: &str,
    container: &str,
    name: &str,
    entry: &Value,
    drop_container: bool,
) -> Result<Option<String>, String> {
    let Some(servers) = member(text, container)? else {
        return Ok(None);
    };
    let Some(existing) = member(servers, name).unwrap_or(None) else {
        return Ok(None);
    };
    if serde_json::from_str::<Value>(existing).ok().as_ref() != Some(entry) {
        return Err(format!(
            "its `{name}` entry was changed since setup wrote it; left as it is"
        ));
    }
    let range = member_range(text, name, existing)
        .ok_or("its entry is written in a way setup cannot edit; remove it by hand")?;
    let out = cut(text, range);
    let now_empty = member(&out, container)?.is_some_and(|s| {
        serde_json::from_str::<Value>(s).is_ok_and(|v| v == Value::Object(Default::default()))
    });
    if drop_container && now_empty {
        if let Some(servers) = member(&out, container)? {
            if let Some(range) = member_range(&out, container, servers) {
                return Ok(Some(cut(&out, range)));
            }
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(t: &str) -> Value {
        serde_json::from_str(t).expect("valid JSON")
    }

    #[test]
    fn adds_beside_other_entries_and_removes_only_its_own() {
        let entry = json!({"command": "b", "args": ["mcp"]});
        let before = "{\n  \"theme\": \"dark\",\n  \"mcpServers\": {\n    \"other\": {\"command\": \"x\"}\n  }\n}\n";
        let Added::Text(after, created) = add(before, "mcpServers", "editor", &entry).expect("add")
        else {
            panic!("not added")
        };
        assert!(!created);
        let v = parsed(&after);
        assert_eq!(v["mcpServers"]["editor"], entry);
        assert_eq!(v["mcpServers"]["other"], json!({"command": "x"}));
        assert_eq!(v["theme"], "dark");
        assert_eq!(
            add(&after, "mcpServers", "editor", &entry),
            Ok(Added::Present)
        );
        let back = remove(&after, "mcpServers", "editor", &entry, false)
            .expect("remove")
            .expect("there");
        assert_eq!(parsed(&back), parsed(before));
        assert!(
            back.contains("\"theme\": \"dark\",\n  \"mcpServers\""),
            "{back}"
        );
    }

    #[test]
    fn creates_the_container_and_removes_it_again() {
        let entry = json!({"type": "local", "command": ["b", "mcp"], "enabled": true});
        for before in ["", "{}", "{\"a\": 1}", "  {\n  \"a\": [1, {\"b\": 2}]\n}\n"] {
            let Added::Text(after, created) = add(before, "mcp", "editor", &entry).expect("add")
            else {
                panic!("not added to {before:?}")
            };
            assert!(created);
            assert_eq!(parsed(&after)["mcp"]["editor"], entry, "{after}");
            let back = remove(&after, "mcp", "editor", &entry, true)
                .expect("remove")
                .expect("there");
            let want = if before.trim().is_empty() {
                json!({})
            } else {
                parsed(before)
            };
            assert_eq!(parsed(&back), want, "{back:?}");
        }
    }

    #[test]
    fn another_entry_of_that_name_is_left_alone() {
        let entry = json!({"command": "b"});
        let before = r#"{"mcpServers": {"editor": {"command": "mine"}}}"#;
        assert!(matches!(
            add(before, "mcpServers", "editor", &entry),
            Ok(Added::Conflict(_))
        ));
        assert!(remove(before, "mcpServers", "editor", &entry, true).is_err());
        assert!(add("// comment\n{}", "mcp", "editor", &entry).is_err());
        assert!(add(r#"{"mcp": []}"#, "mcp", "editor", &entry).is_err());
    }
}
