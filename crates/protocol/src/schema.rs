//! Tool schemas made valid for strict clients.
//!
//! Editors written in Lua serialise an empty table as `[]`, so pi-ide.nvim advertises
//! `"properties": []`; Claude Code then rejects the whole tool list, Codex drops the tool and a
//! strict model API refuses the request. The broker hands every client JSON-Schema objects, and
//! changes nothing else.

use serde_json::{Map, Value};

/// Normalises every `inputSchema` of a `tools/list` result in place.
pub fn normalize_tools(result: &mut Value) {
    if let Some(Value::Array(tools)) = result.get_mut("tools") {
        for tool in tools.iter_mut().filter_map(Value::as_object_mut) {
            let schema = tool
                .entry("inputSchema")
                .or_insert_with(|| Value::Object(Map::new()));
            normalize_schema(schema);
        }
    }
}

/// One tool's input schema: not an object → `{"type":"object"}`; `properties` that is not an
/// object → `{}`; `required` that is not an array → `[]`; a missing top-level `type` →
/// `"object"`.
pub fn normalize_schema(schema: &mut Value) {
    let Value::Object(map) = schema else {
        *schema = serde_json::json!({"type": "object"});
        return;
    };
    map.entry("type").or_insert_with(|| "object".into());
    if map.get("properties").is_some_and(|p| !p.is_object()) {
        map.insert("properties".into(), Value::Object(Map::new()));
    }
    if map.get("required").is_some_and(|r| !r.is_array()) {
        map.insert("required".into(), Value::Array(Vec::new()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn norm(schema: Value) -> Value {
        let mut v = json!({"tools": [{"name": "t", "inputSchema": schema}]});
        normalize_tools(&mut v);
        v["tools"][0]["inputSchema"].clone()
    }

    #[test]
    fn lua_empty_tables_become_objects_and_arrays() {
        assert_eq!(
            norm(json!({"type": "object", "properties": []})),
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(
            norm(json!({"type": "object", "properties": {}, "required": {}})),
            json!({"type": "object", "properties": {}, "required": []})
        );
    }

    #[test]
    fn non_objects_and_missing_types() {
        assert_eq!(norm(json!([])), json!({"type": "object"}));
        assert_eq!(norm(json!("x")), json!({"type": "object"}));
        assert_eq!(norm(Value::Null), json!({"type": "object"}));
        assert_eq!(
            norm(json!({"properties": {"a": {"type": "string"}}})),
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        );
        let mut missing = json!({"tools": [{"name": "t"}]});
        normalize_tools(&mut missing);
        assert_eq!(
            missing["tools"][0]["inputSchema"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn everything_else_is_left_alone() {
        let full = json!({"type": "object", "$schema": "http://json-schema.org/draft-07/schema#",
            "additionalProperties": false, "required": ["a"],
            "properties": {"a": {"type": "string", "properties": []}}});
        assert_eq!(norm(full.clone()), full);
        let mut not_a_list = json!({"tools": "nope"});
        normalize_tools(&mut not_a_list);
        assert_eq!(not_a_list, json!({"tools": "nope"}));
    }
}
