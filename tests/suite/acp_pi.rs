//! The ACP door against the real pi (RPC mode, offline against the fake model) with this
//! repo's extension: the test kit's ACP client spawns `pi-ide-broker acp`, follows the pi
//! session of the folder, sees pi's turns, prompts it, reviews its writes and cancels it.
//! Skipped where pi is not installed; `.ci/run` installs it.

use crate::common::fake_model::{all_text, FakeModel, Reply};
use crate::common::pi::{find_pi, pi_home, Pi};
use crate::common::process::{broker_bin, isolate};
use crate::common::TestBroker;
use pi_ide_broker::testkit::acp_client::AcpClient;
use serde_json::{json, Value};
use tokio::process::Command;

fn is_chunk(u: &Value, kind: &str, text: &str) -> bool {
    u["sessionUpdate"] == kind
        && u["content"]["text"]
            .as_str()
            .is_some_and(|t| t.contains(text))
}

/// A real pi (RPC mode, the fake model, this repo's extension) in a fresh project folder,
/// connected to a broker and followable there.
pub(crate) struct FollowedPi {
    pub b: TestBroker,
    pub pi: Pi,
    pub model: FakeModel,
    pub proj: std::path::PathBuf,
    /// pi's session id: the ACP session id that follows it.
    pub key: String,
}

/// `pi-ide-broker acp` on the broker's socket, initialized (it reads buffers), with a new
/// thread that follows the pi session in `proj` (asserted to be the one with `key`).
pub(crate) async fn acp_following(b: &TestBroker, proj: &std::path::Path, key: &str) -> AcpClient {
    let mut cmd = Command::new(broker_bin());
    cmd.arg("acp").env("PI_IDE_BROKER_SOCKET", &b.socket);
    isolate(&mut cmd, b.dir.path());
    let mut c = AcpClient::spawn(&mut cmd);
    c.initialize(true, true).await;
    let new = c.new_session(&proj.display().to_string()).await;
    assert_eq!(new["result"]["sessionId"], key, "{new}");
    c
}

/// [`FollowedPi`] started, or `None` (said) where pi is not installed.
pub(crate) async fn followed_pi() -> Option<FollowedPi> {
    followed_pi_with(|_, _| {}).await
}

/// [`followed_pi`] with the broker's config tweaked first (given the project folder).
pub(crate) async fn followed_pi_with(
    tweak: impl FnOnce(&mut pi_ide_broker::sys::config::Config, &std::path::Path),
) -> Option<FollowedPi> {
    followed_pi_in(tweak, &[]).await
}

/// [`followed_pi_with`], pi started with `env` beside the broker's usual variables.
async fn followed_pi_in(
    tweak: impl FnOnce(&mut pi_ide_broker::sys::config::Config, &std::path::Path),
    env: &[(&str, &std::ffi::OsStr)],
) -> Option<FollowedPi> {
    let install = find_pi()?;
    let dir = tempfile::tempdir().expect("tempdir");
    let proj = dir.path().join("proj");
    std::fs::create_dir_all(&proj).expect("mkdir proj");
    let proj = std::fs::canonicalize(&proj).expect("canonical proj");
    let model = FakeModel::start().await;
    let home = pi_home(dir.path(), &model.models_json());
    let p = proj.clone();
    let b = TestBroker::start_in(dir, move |c| tweak(c, &p)).await;
    let mut all: Vec<(&str, &std::ffi::OsStr)> = vec![
        ("PI_IDE_BROKER_SOCKET", b.socket.as_os_str()),
        ("PI_IDE_BROKER_NO_SPAWN", std::ffi::OsStr::new("1")),
        (
            "PI_IDE_BROKER_BIN",
            std::ffi::OsStr::new("/nonexistent/pi-ide-broker"),
        ),
    ];
    all.extend_from_slice(env);
    let mut pi = Pi::start_with(&install, &home, &proj, &all, &[]).await;
    let key = pi.command("get_state", json!({})).await["data"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_string();
    b.wait_status("the pi session, followable", |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["door"] == "native" && s["client"]["protocol"] == 2)
        })
    })
    .await;
    Some(FollowedPi {
        b,
        pi,
        model,
        proj,
        key,
    })
}

#[tokio::test(flavor = "current_thread")]
async fn an_acp_editor_mirrors_steers_reviews_and_cancels_a_real_pi_session() {
    let Some(FollowedPi {
        b,
        mut pi,
        mut model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };

    let mut c = acp_following(&b, &proj, &key).await;

    // Mirror: a turn typed in pi's terminal shows in the thread's open (watching) turn.
    let watch = c.prompt(&key, "follow").await;
    let from = pi.mark();
    pi.toast(from, "Diffs are reviewed in fake-acp-client")
        .await;
    model.push(Reply::Text("the terminal's answer".into()));
    pi.prompt("typed in the terminal").await;
    let u = c
        .update("the terminal prompt", |u| {
            is_chunk(u, "user_message_chunk", "typed in the terminal")
        })
        .await;
    assert!(u.in_turn);
    c.until_agent_text("the terminal's answer").await;

    // Review: pi's write is a diff permission in the thread; allowed → written, rejected →
    // untouched.
    let file = proj.join("notes.txt");
    let path = file.display().to_string();
    for (decision, content) in [("reject", "rejected\n"), ("allow", "allowed\n")] {
        model.push(Reply::Tool {
            name: "write".into(),
            args: json!({"path": "notes.txt", "content": content}),
        });
        model.push(Reply::Text("done".into()));
        let from = pi.mark();
        let r = pi
            .command("prompt", json!({"message": format!("write {content}")}))
            .await;
        assert_eq!(r["success"], true, "{r}");
        let ask = c.permission().await;
        assert!(ask.in_turn, "asked inside the open turn");
        let diff = &ask.msg["params"]["toolCall"]["content"][0];
        assert_eq!(diff["type"], "diff");
        assert_eq!(diff["path"], path.as_str());
        assert_eq!(diff["newText"], content);
        // The permission names the tool call the thread was shown as pi proposed it.
        let id = &ask.msg["params"]["toolCall"]["toolCallId"];
        assert!(
            c.updates.iter().any(
                |u| u.msg["params"]["update"]["sessionUpdate"] == "tool_call"
                    && &u.msg["params"]["update"]["toolCallId"] == id
            ),
            "no tool_call {id} before its permission: {:?}",
            c.updates
                .iter()
                .map(|u| u.msg["params"]["update"]["sessionUpdate"].to_string())
                .collect::<Vec<_>>()
        );
        c.decide(&ask.msg, Some(decision)).await;
        pi.until("agent_settled", from, |v| v["type"] == "agent_settled")
            .await;
        let on_disk = std::fs::read_to_string(&file).ok();
        if decision == "allow" {
            assert_eq!(on_disk.as_deref(), Some("allowed\n"));
        } else {
            assert_eq!(on_disk, None, "a rejected write leaves the file untouched");
        }
    }
    // F1 (issue 53): a tool call's updates never come before the call itself.
    let seen: Vec<(String, String)> = c
        .updates
        .iter()
        .map(|u| {
            let up = &u.msg["params"]["update"];
            (
                up["sessionUpdate"].as_str().unwrap_or_default().to_string(),
                up["toolCallId"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for (i, (kind, id)) in seen.iter().enumerate() {
        if kind == "tool_call_update" {
            assert!(
                seen[..i].iter().any(|(k, x)| k == "tool_call" && x == id),
                "tool_call_update {id} before its tool_call: {seen:?}"
            );
        }
    }
    c.cancel(&key).await;
    assert_eq!(c.answer(&watch).await["result"]["stopReason"], "cancelled");

    // Steer: a prompt typed in the editor reaches pi as the user's, and pi's turn streams
    // back into that prompt's turn.
    model.received();
    model.push(Reply::Text("answer for the editor".into()));
    let before = pi.mark();
    let asked = c.prompt(&key, "question from the editor").await;
    let chat = model.next_chat().await;
    assert!(
        all_text(&chat).contains("question from the editor"),
        "{chat}"
    );
    c.until_agent_text("answer for the editor").await;
    // The editor shows its own prompt: pi does not echo it back into the thread.
    assert!(
        !c.updates
            .iter()
            .any(
                |u| u.msg["params"]["update"]["sessionUpdate"] == "user_message_chunk"
                    && u.msg.to_string().contains("question from the editor")
            ),
        "the editor's prompt came back as a user message"
    );
    let end = c.answer(&asked).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    // pi's log is read as it is waited on: read this turn's end before marking the next.
    pi.until("the editor's turn settled", before, |v| {
        v["type"] == "agent_settled"
    })
    .await;

    // Buffers: pi's read of a file the editor holds with unsaved changes sees them (this
    // client offers fs.readTextFile).
    let buf = proj.join("buf.txt");
    std::fs::write(&buf, "saved on disk\n").expect("write buf.txt");
    model.received();
    model.push(Reply::Tool {
        name: "read".into(),
        args: json!({"path": "buf.txt"}),
    });
    model.push(Reply::Text("read it".into()));
    let from = pi.mark();
    let r = pi
        .command("prompt", json!({"message": "read buf.txt"}))
        .await;
    assert_eq!(r["success"], true, "{r}");
    let ask = c
        .until("fs/read_text_file", |m| m["method"] == "fs/read_text_file")
        .await;
    assert_eq!(ask.msg["params"]["path"], buf.display().to_string());
    assert_eq!(ask.msg["params"]["sessionId"], key.as_str());
    c.send(json!({"jsonrpc": "2.0", "id": ask.msg["id"], "result": {"content": "unsaved in the editor\n"}}))
        .await;
    model.next_chat().await;
    let after_read = model.next_chat().await;
    let seen = all_text(&after_read);
    assert!(
        seen.contains("unsaved in the editor") && seen.contains("unsaved changes in"),
        "{seen}"
    );
    pi.until("the read's turn settled", from, |v| {
        v["type"] == "agent_settled"
    })
    .await;

    // Cancel: session/cancel stops pi's running turn (a 30 s command), well before its end.
    model.push(Reply::Tool {
        name: "bash".into(),
        args: json!({"command": "sleep 30"}),
    });
    model.push(Reply::Text("never".into()));
    let from = pi.mark();
    let long = c.prompt(&key, "run the long job").await;
    let bash = c
        .update("the command proposed", |u| {
            u["sessionUpdate"] == "tool_call" && u["kind"] == "execute"
        })
        .await;
    let id = bash.msg["params"]["update"]["toolCallId"].clone();
    c.update("the command running", |u| {
        u["sessionUpdate"] == "tool_call_update"
            && u["status"] == "in_progress"
            && u["toolCallId"] == id
    })
    .await;
    c.cancel(&key).await;
    let end = c.answer(&long).await;
    assert_eq!(end["result"]["stopReason"], "cancelled", "{end}");
    let settled = pi
        .until("agent_settled", from, |v| v["type"] == "agent_settled")
        .await;
    assert_eq!(settled["aborted"], true, "{settled}");
    c.close().await;
    pi.quit().await;
}

/// Issue 53 F2: a 300,000-line file with unsaved changes in the following editor reaches the
/// model within pi's own read limit (its first 2000 lines and its "[Showing lines …]" note,
/// not 6 MB), and a read with `offset`/`limit` gets the buffer's lines in place of the disk's,
/// not after them.
#[tokio::test(flavor = "current_thread")]
async fn a_huge_file_with_unsaved_changes_is_read_within_pis_limit() {
    // A 6 MB buffer through a debug broker on a machine at load 6-8 took over the extension's
    // 3 s bound (then the disk's text stands, by design): this test is of the limits, not that.
    let wait = [(
        "PI_IDE_BROKER_BUFFER_READ_MS",
        std::ffi::OsStr::new("60000"),
    )];
    let Some(FollowedPi {
        b,
        mut pi,
        mut model,
        proj,
        key,
    }) = followed_pi_in(|_, _| {}, &wait).await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    let numbered =
        |word: &str, n: usize| -> String { (1..=n).map(|i| format!("{word} {i}\n")).collect() };
    let big = proj.join("big.txt");
    std::fs::write(&big, numbered("disk", 300_000)).expect("write big.txt");
    let buffer = numbered("editor", 300_000);

    for (args, want) in [
        (
            json!({"path": "big.txt"}),
            "editor 2000\n\n[Showing lines 1-2000 of 300001. Use offset=2001 to continue.]",
        ),
        (
            json!({"path": "big.txt", "offset": 150_000, "limit": 3}),
            "editor 150000\neditor 150001\neditor 150002\n\n[",
        ),
    ] {
        model.received();
        model.push(Reply::Tool {
            name: "read".into(),
            args: args.clone(),
        });
        model.push(Reply::Text("read it".into()));
        let from = pi.mark();
        let r = pi.command("prompt", json!({"message": "look at it"})).await;
        assert_eq!(r["success"], true, "{r}");
        let ask = c
            .until("fs/read_text_file", |m| m["method"] == "fs/read_text_file")
            .await;
        c.send(json!({"jsonrpc": "2.0", "id": ask.msg["id"], "result": {"content": buffer}}))
            .await;
        model.next_chat().await;
        let seen = all_text(&model.next_chat().await);
        assert!(
            seen.len() < 120_000,
            "{args}: the model got {} chars of a 300,000-line buffer",
            seen.len()
        );
        assert!(
            seen.contains(want),
            "{args}: {}",
            &seen[..seen.len().min(4000)]
        );
        assert!(
            seen.contains("unsaved changes in fake-acp-client"),
            "{args}: the note names the editor whose buffer it is"
        );
        assert!(
            !seen.contains("disk "),
            "{args}: the disk's lines came along: {}",
            &seen[..seen.len().min(4000)]
        );
        pi.until("the read's turn settled", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    }
    c.close().await;
    pi.quit().await;
}

/// Issue 53 F3: a permission nobody answers never wedges the turn. A client that cancels its
/// turn without answering the permission (agentic.nvim does) gets `cancelled` and
/// `$/cancel_request` for it, and pi settles; pi's own abort (Esc; here its RPC `abort`) while
/// a follower's permission waits takes the diff back the same way. The file stays untouched.
#[tokio::test(flavor = "current_thread")]
async fn a_permission_left_unanswered_never_wedges_a_cancel_or_pis_abort() {
    let Some(FollowedPi {
        b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    let file = proj.join("never.txt");

    // The client's cancel, the permission unanswered.
    model.push(Reply::Tool {
        name: "write".into(),
        args: json!({"path": "never.txt", "content": "no\n"}),
    });
    let from = pi.mark();
    let turn = c.prompt(&key, "write never.txt").await;
    let ask = c.permission().await;
    let t0 = std::time::Instant::now();
    c.cancel(&key).await;
    let end = c.answer(&turn).await;
    assert_eq!(end["result"]["stopReason"], "cancelled", "{end}");
    let took = t0.elapsed();
    let withdrawn = c
        .until("$/cancel_request", |m| m["method"] == "$/cancel_request")
        .await;
    assert_eq!(withdrawn.msg["params"]["requestId"], ask.msg["id"]);
    pi.until("pi settled after the cancel", from, |v| {
        v["type"] == "agent_settled"
    })
    .await;
    eprintln!("session/cancel with a permission pending: answered after {took:?}");
    assert!(!file.exists(), "the cancelled write reached the disk");

    // pi's own abort while a watching follower's permission waits.
    let watch = c.prompt(&key, "follow").await;
    model.push(Reply::Tool {
        name: "write".into(),
        args: json!({"path": "never.txt", "content": "no\n"}),
    });
    let from = pi.mark();
    let r = pi
        .command("prompt", json!({"message": "write never.txt"}))
        .await;
    assert_eq!(r["success"], true, "{r}");
    let ask = c.permission().await;
    let r = pi.command("abort", json!({})).await;
    assert_eq!(r["success"], true, "{r}");
    let withdrawn = c
        .until("$/cancel_request after pi's abort", |m| {
            m["method"] == "$/cancel_request"
        })
        .await;
    assert_eq!(withdrawn.msg["params"]["requestId"], ask.msg["id"]);
    let settled = pi
        .until("pi settled after its abort", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    assert_eq!(settled["aborted"], true, "{settled}");
    assert!(!file.exists(), "the aborted write reached the disk");
    // A late answer to the withdrawn permission finds nothing, and the thread goes on.
    c.decide(&ask.msg, Some("allow")).await;
    c.cancel(&key).await;
    let end = c.answer(&watch).await;
    assert_eq!(end["result"]["stopReason"], "cancelled", "{end}");
    assert!(!file.exists(), "a late Allow wrote the withdrawn diff");
    c.close().await;
    pi.quit().await;
}

/// Issue 63 fault 1: a cancel in a watching turn (`follow`) while pi's own turn (typed in its
/// terminal) waits on the thread's permission for a write: the diff is answered rejected, the
/// permission withdrawn, and pi settles at once (printed: the bound is 1 s).
#[tokio::test(flavor = "current_thread")]
async fn a_watching_turns_cancel_lets_pis_own_write_settle() {
    let Some(FollowedPi {
        b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    let watch = c.prompt(&key, "follow").await;
    let from = pi.mark();
    pi.toast(from, "Diffs are reviewed in fake-acp-client")
        .await;
    model.push(Reply::Tool {
        name: "write".into(),
        args: json!({"path": "never.txt", "content": "no\n"}),
    });
    model.push(Reply::Text("as you wish".into()));
    let from = pi.mark();
    let r = pi
        .command("prompt", json!({"message": "write never.txt"}))
        .await;
    assert_eq!(r["success"], true, "{r}");
    let ask = c.permission().await;
    let t0 = std::time::Instant::now();
    c.cancel(&key).await;
    let settled = pi
        .until("pi settled after the watching turn's cancel", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    eprintln!(
        "cancel of a follow turn with a permission pending: pi settled after {:?}",
        t0.elapsed()
    );
    assert_eq!(
        settled["aborted"], false,
        "pi's own turn went on: {settled}"
    );
    let withdrawn = c
        .until("$/cancel_request", |m| m["method"] == "$/cancel_request")
        .await;
    assert_eq!(withdrawn.msg["params"]["requestId"], ask.msg["id"]);
    assert_eq!(c.answer(&watch).await["result"]["stopReason"], "cancelled");
    let results = pi.tool_results(from);
    assert!(
        results
            .iter()
            .any(|(tool, error, text)| tool == "write" && *error && text.contains("rejected")),
        "{results:?}"
    );
    assert!(
        !proj.join("never.txt").exists(),
        "the write reached the disk"
    );
    c.close().await;
    pi.quit().await;
}

/// Issue 63 fault 4: an editor's prompt queued behind pi's own turn (a command typed in its
/// terminal), then cancelled, leaves the queue: the terminal's command runs to its end (not
/// "Command aborted"), and the cancelled text never runs.
#[tokio::test(flavor = "current_thread")]
async fn cancelling_a_queued_editor_prompt_leaves_pis_own_turn_alone() {
    let Some(FollowedPi {
        b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    model.push(Reply::Tool {
        name: "bash".into(),
        args: json!({"command": "sleep 4; echo slept"}),
    });
    model.push(Reply::Text("the terminal's turn is done".into()));
    let from = pi.mark();
    let r = pi
        .command("prompt", json!({"message": "run the sleep"}))
        .await;
    assert_eq!(r["success"], true, "{r}");
    let bash = c
        .update("the terminal's command running", |u| {
            u["sessionUpdate"] == "tool_call_update" && u["status"] == "in_progress"
        })
        .await;
    let id = bash.msg["params"]["update"]["toolCallId"].clone();
    let t0 = std::time::Instant::now();
    let queued = c.prompt(&key, "queued from the editor").await;
    c.cancel(&key).await;
    let end = c.answer(&queued).await;
    assert_eq!(end["result"]["stopReason"], "cancelled", "{end}");
    eprintln!(
        "a queued editor prompt cancelled: answered after {:?}",
        t0.elapsed()
    );
    let done = c
        .update("the terminal's command ended", |u| {
            u["sessionUpdate"] == "tool_call_update"
                && u["toolCallId"] == id
                && u["status"] != "in_progress"
        })
        .await;
    assert_eq!(
        done.msg["params"]["update"]["status"], "completed",
        "{}",
        done.msg
    );
    let settled = pi
        .until("the terminal's turn settled", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    assert_eq!(settled["aborted"], false, "{settled}");
    let results = pi.tool_results(from);
    assert!(
        results
            .iter()
            .any(|(tool, error, text)| tool == "bash" && !*error && text.contains("slept")),
        "{results:?}"
    );
    // Another terminal turn, to its end: the cancelled text would have run before it.
    model.push(Reply::Text("next".into()));
    pi.prompt("and now").await;
    let ran = pi.log[from..].iter().any(|v| {
        v["type"] == "message_start"
            && v["message"]["role"] == "user"
            && user_text(v).contains("queued from the editor")
    });
    assert!(!ran, "the cancelled editor prompt ran");
    c.close().await;
    pi.quit().await;
}

/// Issue 63 fault 3: `session/close` while the thread's prompt runs stops it in pi as
/// `session/cancel` would (a 30 s command, aborted), answers it `cancelled`, and says nothing
/// false about pi.
#[tokio::test(flavor = "current_thread")]
async fn close_during_a_running_prompt_stops_it_in_pi() {
    let Some(FollowedPi {
        b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    model.push(Reply::Tool {
        name: "bash".into(),
        args: json!({"command": "sleep 30"}),
    });
    model.push(Reply::Text("never".into()));
    let from = pi.mark();
    let long = c.prompt(&key, "run the long job").await;
    c.update("the command running", |u| {
        u["sessionUpdate"] == "tool_call_update" && u["status"] == "in_progress"
    })
    .await;
    let close = c.close_session(&key).await;
    let told = c.through_answer(&close).await;
    let ended = told
        .iter()
        .find(|m| m["id"] == long)
        .unwrap_or_else(|| panic!("the prompt was not answered before the close: {told:?}"));
    assert_eq!(ended["result"]["stopReason"], "cancelled", "{ended}");
    assert!(!c.agent_text().contains("gone"), "{}", c.agent_text());
    let settled = pi
        .until("pi stopped by the close", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    assert_eq!(settled["aborted"], true, "{settled}");
    c.close().await;
    pi.quit().await;
}

/// Issue 53 F4, the rule of docs/protocol.md ("Who reviews a diff"): with a follower that has
/// no turn open and no editor attached, nobody reviews, so pi writes as it does alone, and the
/// thread sees the write as a tool call that completed; the next write, with the thread's
/// turn open, is the thread's to review.
#[tokio::test(flavor = "current_thread")]
async fn a_write_with_a_follower_but_no_turn_and_no_editor_is_pis_own() {
    let Some(FollowedPi {
        b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    model.push(Reply::Tool {
        name: "write".into(),
        args: json!({"path": "free.txt", "content": "written\n"}),
    });
    model.push(Reply::Text("done".into()));
    let from = pi.mark();
    let r = pi
        .command("prompt", json!({"message": "write free.txt"}))
        .await;
    assert_eq!(r["success"], true, "{r}");
    let call = c
        .update("the write proposed", |u| {
            u["sessionUpdate"] == "tool_call" && u["kind"] == "edit"
        })
        .await;
    assert!(!call.in_turn);
    let id = call.msg["params"]["update"]["toolCallId"].clone();
    c.update("the write completed", |u| {
        u["sessionUpdate"] == "tool_call_update"
            && u["toolCallId"] == id
            && u["status"] == "completed"
    })
    .await;
    pi.until("agent_settled", from, |v| v["type"] == "agent_settled")
        .await;
    assert_eq!(
        std::fs::read_to_string(proj.join("free.txt"))
            .ok()
            .as_deref(),
        Some("written\n")
    );
    // (A permission asked outside the turn would have held the write: nobody answers here.)
    c.close().await;
    pi.quit().await;
}

/// The text of a user message as pi logged it (`message_start`).
pub(crate) fn user_text(started: &Value) -> String {
    let content = &started["message"]["content"];
    match content {
        Value::String(s) => s.clone(),
        _ => content
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|b| b["text"].as_str())
            .collect(),
    }
}

/// Issue 53 F5: a client that re-sends an unfinished message with the next one (CodeCompanion
/// after a cancel: every message of the cancelled turn, whole, then the new one) has pi run
/// only the new one: the cancelled job does not run again and the `follow` word does not ride
/// along.
#[tokio::test(flavor = "current_thread")]
async fn a_resent_unfinished_message_is_not_run_again() {
    let Some(FollowedPi {
        b,
        mut pi,
        mut model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    let watch = c.prompt(&key, "follow").await;
    c.cancel(&key).await;
    c.answer(&watch).await;
    model.push(Reply::Tool {
        name: "bash".into(),
        args: json!({"command": "sleep 30"}),
    });
    let from = pi.mark();
    // CodeCompanion re-sends the cancelled `follow` with the next message.
    let long = c
        .request(
            "session/prompt",
            json!({"sessionId": key, "prompt": [
                {"type": "text", "text": "follow"},
                {"type": "text", "text": "run the long job"},
            ]}),
        )
        .await;
    let started = pi
        .until("the long job's message", from, |v| {
            v["type"] == "message_start" && v["message"]["role"] == "user"
        })
        .await;
    assert_eq!(user_text(&started), "run the long job", "{started}");
    c.update("the command running", |u| {
        u["sessionUpdate"] == "tool_call_update" && u["status"] == "in_progress"
    })
    .await;
    c.cancel(&key).await;
    c.answer(&long).await;
    pi.until("agent_settled", from, |v| v["type"] == "agent_settled")
        .await;
    model.received();
    model.push(Reply::Text("made".into()));
    let from = pi.mark();
    let id = c
        .request(
            "session/prompt",
            json!({"sessionId": key, "prompt": [
                {"type": "text", "text": "follow"},
                {"type": "text", "text": "run the long job"},
                {"type": "text", "text": "create the file please"},
            ]}),
        )
        .await;
    let started = pi
        .until("the user message", from, |v| {
            v["type"] == "message_start" && v["message"]["role"] == "user"
        })
        .await;
    assert_eq!(user_text(&started), "create the file please", "{started}");
    let end = c.answer(&id).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    c.close().await;
    pi.quit().await;
}

/// Issue 53: a second follower sees the first follower's prompt (pi mirrors it to every
/// follower); the first does not get its own prompt twice.
#[tokio::test(flavor = "current_thread")]
async fn a_second_follower_sees_the_first_ones_prompt() {
    let Some(FollowedPi {
        b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut first = acp_following(&b, &proj, &key).await;
    let mut second = acp_following(&b, &proj, &key).await;
    b.wait_status("two followers", |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["followers"].as_array().is_some_and(|f| f.len() == 2))
        })
    })
    .await;
    model.push(Reply::Text("the answer".into()));
    let from = pi.mark();
    let asked = first.prompt(&key, "from the first thread").await;
    second
        .update("the first thread's prompt", |u| {
            is_chunk(u, "user_message_chunk", "from the first thread")
        })
        .await;
    second.until_agent_text("the answer").await;
    let end = first.answer(&asked).await;
    assert_eq!(end["result"]["stopReason"], "end_turn", "{end}");
    pi.until("agent_settled", from, |v| v["type"] == "agent_settled")
        .await;
    let echoes = first
        .updates
        .iter()
        .filter(|u| {
            is_chunk(
                &u.msg["params"]["update"],
                "user_message_chunk",
                "from the first thread",
            )
        })
        .count();
    assert_eq!(echoes, 0, "the first thread got its own prompt back");
    first.close().await;
    second.close().await;
    pi.quit().await;
}

/// A measurement, not a check (issue 53's hold line: pi event → ACP client under 1 ms): the
/// same streamed text seen on pi's own RPC stdout and, mirrored through the extension, the
/// broker and `pi-ide-broker acp`, on the ACP client's stdin; both read by tasks stamping each
/// line as it comes. Prints the ACP path's lag behind pi's own output over 40 turns (median,
/// p90, worst). `cargo test --release --test suite acp_pi::mirror_latency -- --ignored
/// --nocapture`, several times (benches/README.md has the figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run it with --ignored (benches/README.md)"]
async fn mirror_latency() {
    let Some(FollowedPi {
        b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let mut c = acp_following(&b, &proj, &key).await;
    let _watch = c.prompt(&key, "follow").await;
    let mut lags_us: Vec<i64> = Vec::new();
    for i in 0..40 {
        let word = format!("mirrored-{i}-end");
        model.push(Reply::Text(word.clone()));
        let from = pi.mark();
        pi.prompt(&format!("say {i}")).await;
        let w = word.clone();
        pi.until("pi's own event", from, move |v| {
            v["type"] == "message_update" && v.to_string().contains(&w)
        })
        .await;
        let at = pi.log[from..]
            .iter()
            .position(|v| v["type"] == "message_update" && v.to_string().contains(&word))
            .map(|n| pi.log_at[from + n])
            .expect("pi's event was logged");
        let seen = c
            .update("the mirrored text", |u| {
                is_chunk(u, "agent_message_chunk", &word)
            })
            .await;
        let lag = if seen.at >= at {
            (seen.at - at).as_micros() as i64
        } else {
            -((at - seen.at).as_micros() as i64)
        };
        lags_us.push(lag);
        pi.until("agent_settled", from, |v| v["type"] == "agent_settled")
            .await;
    }
    lags_us.sort_unstable();
    let pick = |q: f64| lags_us[((lags_us.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "pi event -> ACP client, lag behind pi's own stdout over {} turns: median {} us, p90 {} us, worst {} us",
        lags_us.len(),
        pick(0.5),
        pick(0.9),
        lags_us[lags_us.len() - 1]
    );
    c.close().await;
    pi.quit().await;
}

/// What the chaos client does with a round's permission.
#[derive(Clone, Copy, Debug)]
enum Chaos {
    Allow,
    Reject,
    Cancel,
    /// The broker restarts (gracefully) with the permission pending, then the client rejects.
    RestartThenReject,
    /// The same, then the client allows.
    RestartThenAllow,
}

/// Issue 53's chaos: rounds of a write reviewed by a following ACP client, each met by one of
/// [`Chaos`], and pi must settle within its bound after every one: no round leaves pi's turn
/// open (one loaded run of the left it unsettled 40 s after a reject right after a
/// broker restart). Rounds: `PI_IDE_BROKER_CHAOS_ROUNDS` (default 10); run it with many
/// rounds beside a load to look for the hang (benches/README.md says how it was run).
#[tokio::test(flavor = "current_thread")]
async fn chaos_rounds_of_reviews_restarts_and_cancels_always_let_pi_settle() {
    let Some(FollowedPi {
        mut b,
        mut pi,
        model,
        proj,
        key,
    }) = followed_pi().await
    else {
        return;
    };
    let rounds: usize = std::env::var("PI_IDE_BROKER_CHAOS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut c = acp_following(&b, &proj, &key).await;
    let order = [
        Chaos::RestartThenReject,
        Chaos::Allow,
        Chaos::Cancel,
        Chaos::Reject,
        Chaos::RestartThenAllow,
    ];
    let file = proj.join("chaos.txt");
    for round in 0..rounds {
        let chaos = order[(round * 7 + round / order.len()) % order.len()];
        let before = std::fs::read_to_string(&file).ok();
        model.clear();
        model.push(Reply::Tool {
            name: "write".into(),
            args: json!({"path": "chaos.txt", "content": format!("round {round}\n")}),
        });
        model.push(Reply::Text("done".into()));
        let from = pi.mark();
        let turn = c.prompt(&key, &format!("write round {round}")).await;
        let ask = c.permission().await;
        match chaos {
            Chaos::Allow => c.decide(&ask.msg, Some("allow")).await,
            Chaos::Reject => c.decide(&ask.msg, Some("reject")).await,
            Chaos::Cancel => c.cancel(&key).await,
            Chaos::RestartThenReject | Chaos::RestartThenAllow => {
                let dir = b.stop_keep_dir().await;
                b = TestBroker::start_in(dir, |_| {}).await;
                let option = match chaos {
                    Chaos::RestartThenAllow => "allow",
                    _ => "reject",
                };
                c.decide(&ask.msg, Some(option)).await;
            }
        }
        let end = c.answer(&turn).await;
        assert!(
            end["result"]["stopReason"].is_string(),
            "round {round} ({chaos:?}): {end}"
        );
        pi.until_within(
            &format!("pi settled after round {round} ({chaos:?})"),
            from,
            std::time::Duration::from_secs(20),
            |v| v["type"] == "agent_settled",
        )
        .await;
        let after = std::fs::read_to_string(&file).ok();
        match chaos {
            Chaos::Allow => assert_eq!(after, Some(format!("round {round}\n")), "round {round}"),
            // Restarted: the broker that asked answered pi as it stopped; the late verdict
            // goes nowhere, so the file is untouched whatever the client said.
            _ => assert_eq!(after, before, "round {round} ({chaos:?}) changed the file"),
        }
        // The follower is back (after a restart, `acp` redials) before the next round.
        b.wait_status("the follower attached", |st| {
            st["sessions"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["followers"].as_array().is_some_and(|f| f.len() == 1))
            })
        })
        .await;
    }
    c.close().await;
    pi.quit().await;
}
