//! The fakes held to the real peers' recorded behaviour (`tests/fixtures/recorded_editors.json`,
//! taken from probes of the real editors): every check the suite makes
//! through the fake editor is only as good as the fake's likeness to pi-ide.nvim and
//! claudecode.nvim, so the likeness is tested too, over real sockets and real frames.

use crate::common::*;
use futures_util::{SinkExt, StreamExt};
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::testkit::within;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

fn recorded() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/recorded_editors.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("the recording")).expect("JSON")
}

fn families(f: &str) -> Vec<Family> {
    match f {
        "pi" => vec![Family::Pi],
        "claude" => vec![Family::Claude],
        _ => vec![Family::Pi, Family::Claude],
    }
}

fn options(family: Family) -> Options {
    match family {
        Family::Pi => Options::pi(&["/rec"]),
        Family::Claude => Options::claudecode(&["/rec"]),
    }
}

fn auth_header(family: Family) -> &'static str {
    match family {
        Family::Pi => "x-pi-ide-authorization",
        Family::Claude => "x-claude-code-ide-authorization",
    }
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn dial(fe: &FakeEditor, family: Family) -> Ws {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", fe.port))
        .await
        .unwrap();
    let mut req = format!("ws://127.0.0.1:{}/", fe.port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert(auth_header(family), fe.token().parse().unwrap());
    let (ws, _) = within(
        "the fake's upgrade",
        tokio_tungstenite::client_async(req, stream),
    )
    .await
    .expect("upgrade");
    ws
}

async fn answer(ws: &mut Ws, text: String) -> Value {
    ws.send(Message::text(text)).await.unwrap();
    within("the fake's answer", async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    let v: Value = serde_json::from_str(&t).expect("JSON from the fake");
                    if v.get("method").is_none() {
                        return v;
                    }
                }
                Some(Ok(_)) => {}
                other => panic!("the fake closed: {other:?}"),
            }
        }
    })
    .await
}

/// Every field of `want` is in `got` with the same value (objects compared field by field,
/// anything else whole); the path of the first difference otherwise.
fn mismatch(want: &Value, got: &Value, path: &str) -> Option<String> {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w.iter().find_map(|(k, wv)| match g.get(k) {
            Some(gv) => mismatch(wv, gv, &format!("{path}.{k}")),
            None => Some(format!("{path}.{k} is missing")),
        }),
        _ if want == got => None,
        _ => Some(format!("{path}: recorded {want}, fake {got}")),
    }
}

fn has_path(v: &Value, path: &str) -> bool {
    path.split('.').try_fold(v, |v, k| v.get(k)).is_some()
}

#[tokio::test]
async fn the_fake_editor_answers_as_the_recorded_editors_did() {
    let rec = recorded();
    let mut checked = 0;
    for family in [Family::Pi, Family::Claude] {
        let fe = FakeEditor::start(options(family)).await.unwrap();
        let mut ws = dial(&fe, family).await;
        for ex in rec["exchanges"].as_array().unwrap() {
            if !families(ex["family"].as_str().unwrap()).contains(&family) {
                continue;
            }
            let text = match ex.get("send_raw") {
                Some(raw) => raw.as_str().unwrap().to_string(),
                None => ex["send"].to_string(),
            };
            let got = answer(&mut ws, text.clone()).await;
            let what = format!("{family:?}, recorded probe {}: {text}", ex["section"]);
            if let Some(d) = ex.get("expect").and_then(|w| mismatch(w, &got, "")) {
                panic!("{what}\n  {d}\n  the fake answered {got}");
            }
            for path in ex["absent"].as_array().into_iter().flatten() {
                let path = path.as_str().unwrap();
                assert!(!has_path(&got, path), "{what}: `{path}` in {got}");
            }
            checked += 1;
        }
        // The tools the suite relies on are listed, under the recorded names.
        let list = answer(
            &mut ws,
            r#"{"jsonrpc":"2.0","id":"t","method":"tools/list","params":{}}"#.into(),
        )
        .await;
        let key = if family == Family::Pi { "pi" } else { "claude" };
        for tool in rec["tools"][key].as_array().unwrap() {
            let listed = list["result"]["tools"]
                .as_array()
                .is_some_and(|t| t.iter().any(|x| &x["name"] == tool));
            assert!(listed, "{family:?}: {tool} not listed: {list}");
        }
    }
    assert_eq!(checked, 15, "exchanges checked (7 pi, 8 claude)");
}

#[tokio::test]
async fn the_fake_editor_refuses_bad_tokens_as_the_recorded_editors_did() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for h in recorded()["handshakes"].as_array().unwrap() {
        let family = families(h["family"].as_str().unwrap())[0];
        let fe = FakeEditor::start(options(family)).await.unwrap();
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", fe.port))
            .await
            .unwrap();
        let req = format!(
            "GET / HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{}: {}\r\n\r\n",
            fe.port,
            h["header"].as_str().unwrap(),
            h["token"].as_str().unwrap()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        within("the refusal", s.read_to_end(&mut got))
            .await
            .unwrap();
        let got = String::from_utf8_lossy(&got);
        let status = format!("HTTP/1.1 {}", h["status"]);
        assert!(
            got.starts_with(&status),
            "recorded probe {}: {got}",
            h["section"]
        );
        let body = got.split("\r\n\r\n").nth(1).unwrap_or("");
        match (h.get("body"), h.get("body_starts")) {
            (Some(b), _) => assert_eq!(body, b.as_str().unwrap(), "{got}"),
            (_, Some(b)) => assert!(body.starts_with(b.as_str().unwrap()), "{got}"),
            _ => {}
        }
    }
}

/// A crash of the fake editor is one, as a real editor's death is: once `crash` returns, its
/// port is closed (nothing connects, another socket binds it). Tests that hold a dead editor's
/// port (`hold_closed`) rely on it; with the listener closed later by its own task, the bind
/// failed under load (issue 29's soak, `doctor::every_refused_lockfile_…`).
#[tokio::test]
async fn a_crashed_fake_editor_has_closed_its_port_when_crash_returns() {
    for _ in 0..20 {
        let fe = FakeEditor::start(Options::pi(&["/crash"])).await.unwrap();
        let mut ws = dial(&fe, Family::Pi).await;
        fe.crash().await;
        // Nothing listens there any more (the kernel's table: under a busy suite another
        // test's outgoing connection may take the freed port as its own, which a bind would
        // mistake for the editor still holding it). Awaited, bounded: a child another test
        // forks at that moment holds a copy of the listener until its exec closes it.
        let port = fe.port;
        pi_ide_broker::testkit::eventually(
            &format!("port {port} not listened on after crash"),
            || {
                let still = crate::common::ports::listening(port)
                    .unwrap_or_else(|| hold_closed(port).is_none());
                (!still).then_some(())
            },
        )
        .await;
        // The live connection ends too.
        let end = within("the connection's end", ws.next()).await;
        assert!(!matches!(end, Some(Ok(Message::Text(_)))), "{end:?}");
    }
}
