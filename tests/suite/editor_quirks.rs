//! Editors that differ from pi-ide.nvim in what the broker must respect: Emacs's
//! claude-code-ide.el writes no token, and the Claude Code VS Code extension keeps one client
//! at a time (`taken`). Both against the fake editor in the recorded shapes (PROTOCOL.md).

use crate::common::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emacs_lockfile_without_a_token_links_without_the_header_and_serves_calls() {
    let b = TestBroker::start().await;
    let fe = FakeEditor::start_in(&b.claude_dir, Options::emacs(&["/emacs-proj"]))
        .await
        .unwrap();
    let text = std::fs::read_to_string(b.claude_dir.join(format!("{}.lock", fe.port))).unwrap();
    assert!(!text.contains("authToken"), "the recorded shape: {text}");
    let e = b.wait_editor(fe.port, "ready").await;
    assert_eq!(e["ide_name"], "Emacs");
    assert_eq!(e["family"], "claude");
    assert_eq!(e["no_token"], true, "{e:#}");
    assert_eq!(fe.auth_headers_seen(), 0, "dialled without an auth header");
    let mut a = Agent::connect(&b.socket, "cwd=/emacs-proj&dialect=claude")
        .await
        .unwrap();
    let r = a
        .request(
            json!(1),
            "tools/call",
            json!({"name": "getDiagnostics", "arguments": {}}),
        )
        .await;
    assert!(
        r["result"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("boom")),
        "{r:#}"
    );
    assert!(b.status().await["lockfiles_rejected"]
        .as_array()
        .is_some_and(|r| r.is_empty()));
    // A tokened editor beside it still gets its header and is not marked.
    let (nv, _) = b.editor(&["/nv"]).await;
    assert!(nv.auth_headers_seen() >= 1);
    let st = b.status().await;
    assert_eq!(editor_by_port(&st, nv.port).unwrap()["no_token"], false);
    a.close().await;
    b.stop().await;
}
