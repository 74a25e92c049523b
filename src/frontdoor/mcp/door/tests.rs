//! The stdio door's rules without I/O: client lines and broker frames in, [`Out`]s checked.
//! Each test guards what a client of one era or the other relies on (issue 63: nothing but
//! the real Claude Code reached the modern era's answers).

use super::*;

/// A modern (2026-07-28) request's `_meta`.
fn modern_meta() -> Value {
    json!({era::VERSION_KEY: era::MODERN})
}

fn request(id: Value, method: &str, params: Value) -> String {
    jsonrpc::request(&id, method, params)
}

fn tools_list(id: u64, modern: bool) -> String {
    let params = if modern {
        json!({"_meta": modern_meta()})
    } else {
        json!({})
    };
    request(json!(id), "tools/list", params)
}

fn call(id: u64, tool: &str, arguments: Value, modern: bool) -> String {
    let mut params = json!({"name": tool, "arguments": arguments});
    if modern {
        params["_meta"] = modern_meta();
    }
    request(json!(id), "tools/call", params)
}

/// What `outs` says to the client (either way it is said), parsed.
fn to_client(outs: &[Out]) -> Vec<Value> {
    outs.iter()
        .filter_map(|o| match o {
            Out::Client(t) | Out::ClientNow(t) => serde_json::from_str(t).ok(),
            _ => None,
        })
        .collect()
}

/// The frames `outs` sends the broker, parsed.
fn to_broker(outs: &[Out]) -> Vec<Value> {
    outs.iter()
        .filter_map(|o| match o {
            Out::Broker(t) => serde_json::from_str(t).ok(),
            _ => None,
        })
        .collect()
}

/// The broker's answer to `sent` (a frame the door sent it) with `result`.
fn answer(door: &mut Door, sent: &Value, result: Value) -> Vec<Value> {
    to_client(&from_broker(door, &jsonrpc::result(&sent["id"], result)))
}

fn broker_tools() -> Value {
    json!({"tools": [{"name": "openDiff", "inputSchema": {}}, {"name": "list_editors", "inputSchema": {}}]})
}

fn tool_names(result: &Value) -> Vec<String> {
    result["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn context_reads_like_prose() {
    let door = Door {
        selection: Some(
            json!({"text": "let x = 1;", "filePath": "/p/a.rs", "selection": {"start": {"line": 3, "character": 0}, "end": {"line": 4, "character": 2}, "isEmpty": false}}),
        ),
        editor: Some(json!({"id": "neovim-1", "ide_name": "Neovim"})),
        ..Door::default()
    };
    let t = context_text(&door, &json!({}));
    assert_eq!(t, "Editor: Neovim (neovim-1)\nFile: /p/a.rs\nCursor: line 5\nSelection: lines 4-5\nlet x = 1;\n");
    let none = context_text(&Door::default(), &json!({"editors": []}));
    assert!(none.contains("No editor is attached"));
    let two = context_text(&Door::default(), &json!({"editors": [{}, {}]}));
    assert!(two.contains("2 editors match"), "{two}");
    // A cursor with nothing selected says the line only; no cursor yet says so.
    let door = Door {
        selection: Some(
            json!({"text": "", "filePath": "/p/b.rs", "selection": {"start": {"line": 0}, "end": {"line": 0}, "isEmpty": true}}),
        ),
        editor: Some(json!({"id": "e", "ide_name": "Zed"})),
        ..Door::default()
    };
    assert_eq!(
        context_text(&door, &json!({})),
        "Editor: Zed (e)\nFile: /p/b.rs\nCursor: line 1\n"
    );
    // Text the editor left in an empty selection (the last one's) is no selection.
    let door = Door {
        selection: Some(
            json!({"text": "old", "filePath": "/p/b.rs", "selection": {"start": {"line": 2}, "end": {"line": 2}, "isEmpty": true}}),
        ),
        editor: Some(json!({"id": "e", "ide_name": "Zed"})),
        ..Door::default()
    };
    assert!(!context_text(&door, &json!({})).contains("Selection"));
    let door = Door {
        editor: Some(json!({"id": "e", "ide_name": "Zed"})),
        ..Door::default()
    };
    assert!(context_text(&door, &json!({})).contains("No file is focused yet"));
}

/// A 2025-era `tools/list` goes to the broker; its answer carries the editor's tools and the
/// door's own, once each, and nothing of the modern era.
#[test]
fn a_legacy_tools_list_gets_the_doors_tools_added() {
    let mut door = Door::default();
    let outs = from_client(&mut door, &tools_list(1, false));
    let sent = &to_broker(&outs)[0];
    assert_eq!(sent["id"], 1);
    let told = answer(&mut door, sent, broker_tools());
    let result = &told[0]["result"];
    assert_eq!(
        tool_names(result),
        vec!["openDiff", "list_editors", "editor_context"]
    );
    assert!(result.get("resultType").is_none(), "{result}");
    assert!(door.inflight.is_empty() && door.intercepts.is_empty());
}

/// A 2026-07-28 `tools/list` is answered as that era's: `resultType` and the list's cache
/// hints, with the door's tools; a modern call's answer has `resultType` and no list hints.
#[test]
fn a_modern_tools_list_is_answered_in_its_era() {
    let mut door = Door::default();
    let outs = from_client(&mut door, &tools_list(1, true));
    assert!(door.speaks_modern && !door.speaks_legacy);
    let sent = &to_broker(&outs)[0];
    let told = answer(&mut door, sent, broker_tools());
    let result = &told[0]["result"];
    assert_eq!(result["resultType"], "complete", "{result}");
    assert_eq!(result["ttlMs"], era::LIST_TTL_MS);
    assert_eq!(result["cacheScope"], "private");
    assert_eq!(
        tool_names(result),
        vec!["openDiff", "list_editors", "editor_context"]
    );
    let outs = from_client(&mut door, &call(2, "getDiagnostics", json!({}), true));
    let sent = &to_broker(&outs)[0];
    let told = answer(&mut door, sent, json!({"content": []}));
    assert_eq!(told[0]["result"]["resultType"], "complete");
    assert!(told[0]["result"].get("ttlMs").is_none(), "{}", told[0]);
    // Answered once: a second answer with that id is the broker's, passed as it is.
    let again = answer(&mut door, sent, json!({"content": []}));
    assert!(again[0]["result"].get("resultType").is_none());
}

/// The door's own tools go to the broker as `broker/editors` under the door's ids and come
/// back as text under the client's id, of the client's era.
#[test]
fn the_doors_own_tools_answer_from_broker_editors() {
    let editors = json!({"attached": "nvim-1", "editors": [
        {"id": "zed-2", "ide_name": "Zed"}, {"id": "nvim-1", "ide_name": "Neovim"}]});
    for modern in [false, true] {
        let mut door = Door::default();
        let outs = from_client(&mut door, &call(7, "list_editors", json!({}), modern));
        let sent = &to_broker(&outs)[0];
        assert_eq!(sent["method"], jsonrpc::broker::EDITORS);
        assert_ne!(sent["id"], 7, "the door's own id");
        let told = answer(&mut door, sent, editors.clone());
        assert_eq!(told[0]["id"], 7);
        let text = told[0]["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("");
        assert!(text.contains("zed-2") && text.contains('\n'), "{text}");
        assert_eq!(
            told[0]["result"].get("resultType").is_some(),
            modern,
            "{modern}: {}",
            told[0]
        );
        let outs = from_client(&mut door, &call(8, "editor_context", json!({}), modern));
        let sent = &to_broker(&outs)[0];
        assert_eq!(sent["method"], jsonrpc::broker::EDITORS);
        let told = answer(&mut door, sent, editors.clone());
        assert_eq!(told[0]["id"], 8);
        let text = told[0]["result"]["content"][0]["text"]
            .as_str()
            .unwrap_or("");
        assert!(text.starts_with("Editor: Neovim (nvim-1)"), "{text}");
        assert_eq!(
            door.editor.as_ref().map(|e| &e["id"]),
            Some(&json!("nvim-1"))
        );
    }
    assert_eq!(
        attached_entry(&json!({"attached": "x", "editors": []})),
        None
    );
}

/// Issue 63: the broker restarts with requests in flight. A diff is answered rejected with its
/// own tab (in the client's era), anything else an error that says to retry, the door's own
/// requests are forgotten; a modern `tools/list` the client sends again (or that waited in
/// the queue) is answered in its era on the new link.
#[test]
fn a_restart_answers_what_was_in_flight_and_the_next_list_is_still_modern() {
    let mut door = Door::default();
    from_client(
        &mut door,
        &call(1, "openDiff", json!({"tab_name": "t-1"}), true),
    );
    from_client(
        &mut door,
        &call(2, "openDiff", json!({"tab_name": "t-2"}), false),
    );
    from_client(&mut door, &tools_list(3, true));
    from_client(&mut door, &call(4, "list_editors", json!({}), false));
    let answers: Vec<Value> = door
        .fail_in_flight()
        .iter()
        .filter_map(|t| serde_json::from_str(t).ok())
        .collect();
    assert_eq!(answers.len(), 4, "{answers:?}");
    let by_id = |id: u64| {
        answers
            .iter()
            .find(|a| a["id"] == id)
            .cloned()
            .unwrap_or_default()
    };
    let diff = by_id(1);
    assert_eq!(diff["result"]["content"][0]["text"], "DIFF_REJECTED");
    assert_eq!(diff["result"]["content"][1]["text"], "t-1");
    assert_eq!(diff["result"]["resultType"], "complete", "{diff}");
    let legacy = by_id(2);
    assert_eq!(legacy["result"]["content"][1]["text"], "t-2");
    assert!(legacy["result"].get("resultType").is_none(), "{legacy}");
    for id in [3, 4] {
        assert_eq!(by_id(id)["error"]["code"], jsonrpc::SERVER_ERROR);
    }
    assert!(door.inflight.is_empty() && door.intercepts.is_empty() && door.modern.is_empty());
    // On the new link: a line that could not be sent waits in the queue, then goes again.
    let line = tools_list(5, true);
    from_client(&mut door, &line);
    door.forget_sent(&line);
    assert!(door.inflight.is_empty() && door.modern.is_empty());
    let outs = from_client(&mut door, &line);
    let sent = &to_broker(&outs)[0];
    let told = answer(&mut door, sent, broker_tools());
    assert_eq!(told[0]["result"]["resultType"], "complete", "{}", told[0]);
    assert_eq!(told[0]["result"]["ttlMs"], era::LIST_TTL_MS);
    assert_eq!(
        tool_names(&told[0]["result"]),
        vec!["openDiff", "list_editors", "editor_context"]
    );
}

/// What the broker owns is answered by the door itself: `server/discover`, a version it does
/// not speak, a method the modern era removed; a 2025-era `ping` still goes to the broker;
/// `initialize` is answered with the client's version and a tool list that may change.
#[test]
fn the_door_answers_what_is_its_own() {
    let mut door = Door::default();
    let told = to_client(&from_client(
        &mut door,
        &request(json!(1), "server/discover", json!({"_meta": modern_meta()})),
    ));
    assert_eq!(told[0]["result"]["supportedVersions"][0], era::MODERN);
    let outs = from_client(
        &mut door,
        &request(
            json!(2),
            "tools/list",
            json!({"_meta": {era::VERSION_KEY: "2099-01-01"}}),
        ),
    );
    assert!(to_broker(&outs).is_empty());
    assert_eq!(
        to_client(&outs)[0]["error"]["code"],
        era::UNSUPPORTED_VERSION
    );
    let outs = from_client(
        &mut door,
        &request(json!(3), "ping", json!({"_meta": modern_meta()})),
    );
    assert!(to_broker(&outs).is_empty());
    assert_eq!(
        to_client(&outs)[0]["error"]["code"],
        jsonrpc::METHOD_NOT_FOUND
    );
    assert!(
        !door.speaks_modern,
        "refused requests say nothing of the client"
    );
    let outs = from_client(&mut door, &request(json!(4), "ping", json!({})));
    assert_eq!(to_broker(&outs)[0]["method"], "ping");
    let outs = from_client(
        &mut door,
        &request(
            json!(5),
            "initialize",
            json!({"protocolVersion": "2025-06-18"}),
        ),
    );
    assert!(to_broker(&outs).is_empty());
    let result = &to_client(&outs)[0]["result"];
    assert_eq!(result["protocolVersion"], "2025-06-18");
    assert_eq!(result["capabilities"]["tools"]["listChanged"], true);
    assert!(result["instructions"]
        .as_str()
        .is_some_and(|i| !i.is_empty()));
    assert!(door.speaks_legacy);
    let outs = from_client(&mut door, &request(json!(6), "initialize", json!({})));
    assert_eq!(
        to_client(&outs)[0]["result"]["protocolVersion"],
        handshake::PROTOCOL_VERSION
    );
    let outs = from_client(
        &mut door,
        &jsonrpc::notification("notifications/initialized", json!({})),
    );
    assert!(matches!(&outs[..], [Out::Broker(_), Out::ClientReady]));
    let outs = from_client(
        &mut door,
        &jsonrpc::notification("notifications/x", json!({})),
    );
    assert!(matches!(&outs[..], [Out::Broker(_)]));
    let outs = from_client(&mut door, "{not json");
    assert_eq!(to_client(&outs)[0]["error"]["code"], jsonrpc::PARSE_ERROR);
}

/// The broker's notifications: a selection is kept for `editor_context`; progress reaches a
/// modern client at once; an attachment change refreshes the editor and tells a 2025-era
/// client its tools changed (a modern-only client has no such notification); a detach
/// forgets the editor; a request of the broker's is refused back to it.
#[test]
fn the_brokers_notifications_are_kept_passed_or_turned_into_list_changed() {
    let mut door = Door::default();
    let sel = jsonrpc::notification("selection_changed", json!({"filePath": "/p/a.rs"}));
    assert!(from_broker(&mut door, &sel).is_empty());
    assert_eq!(door.selection, Some(json!({"filePath": "/p/a.rs"})));
    let progress = jsonrpc::notification("notifications/progress", json!({"progress": 1}));
    assert!(matches!(
        &from_broker(&mut door, &progress)[..],
        [Out::Client(_)]
    ));
    let attached = jsonrpc::notification(jsonrpc::broker::ATTACHED, json!({}));
    let outs = from_broker(&mut door, &attached);
    assert_eq!(to_broker(&outs)[0]["method"], jsonrpc::broker::EDITORS);
    let told = to_client(&outs);
    assert_eq!(told[0]["method"], "notifications/tools/list_changed");
    // The refresh's answer names the attached editor, and says nothing to the client.
    let refresh = to_broker(&outs)[0].clone();
    let outs = from_broker(
        &mut door,
        &jsonrpc::result(
            &refresh["id"],
            json!({"attached": "e", "editors": [{"id": "e"}]}),
        ),
    );
    assert!(outs.is_empty());
    assert_eq!(door.editor, Some(json!({"id": "e"})));
    let detached = jsonrpc::notification(jsonrpc::broker::DETACHED, json!({}));
    let outs = from_broker(&mut door, &detached);
    assert_eq!(to_client(&outs).len(), 1);
    assert_eq!((door.selection.clone(), door.editor.clone()), (None, None));
    // A modern-only client: progress at once, no list_changed.
    let mut modern = Door::default();
    from_client(&mut modern, &tools_list(1, true));
    assert!(matches!(
        &from_broker(&mut modern, &progress)[..],
        [Out::ClientNow(_)]
    ));
    let outs = from_broker(&mut modern, &attached);
    assert!(
        to_client(&outs).is_empty(),
        "a modern client was told list_changed"
    );
    assert_eq!(to_broker(&outs).len(), 1);
    // One that speaks both eras is told.
    from_client(&mut modern, &request(json!(2), "initialize", json!({})));
    assert_eq!(to_client(&from_broker(&mut modern, &attached)).len(), 1);
    let asked = request(json!("e-1"), "roots/list", json!({}));
    let outs = from_broker(&mut door, &asked);
    let back = &to_broker(&outs)[0];
    assert_eq!(back["id"], "e-1");
    assert_eq!(back["error"]["code"], jsonrpc::METHOD_NOT_FOUND);
    assert!(from_broker(&mut door, "{not json").is_empty());
    assert!(from_broker(&mut door, &jsonrpc::notification("other", json!({}))).is_empty());
    assert!(is_response(&jsonrpc::result(&json!(1), json!({}))));
    assert!(!is_response(&asked));
}

/// The door's own requests in flight at once have ids of their own: each answer goes to the
/// client request it was made for, whatever the order the broker answers in.
#[test]
fn the_doors_own_requests_in_flight_together_are_told_apart() {
    let mut door = Door::default();
    let first = to_broker(&from_client(
        &mut door,
        &call(1, "list_editors", json!({}), false),
    ));
    let second = to_broker(&from_client(
        &mut door,
        &call(2, "editor_context", json!({}), false),
    ));
    assert_ne!(first[0]["id"], second[0]["id"]);
    let editors = json!({"attached": "e", "editors": [{"id": "e", "ide_name": "Zed"}]});
    let told = answer(&mut door, &second[0], editors.clone());
    assert_eq!(told[0]["id"], 2);
    assert!(told[0]["result"]["content"][0]["text"]
        .as_str()
        .is_some_and(|t| t.starts_with("Editor: Zed")));
    let told = answer(&mut door, &first[0], editors);
    assert_eq!(told[0]["id"], 1);
}
