//! Issue 63's faults as the real agentic.nvim and CodeCompanion.nvim meet them (each test
//! fails with its fix reverted; the commit that added them says which): a cancel in a
//! `follow` turn while pi's terminal turn waits on the thread's permission withdraws it and
//! pi settles (fault 1; the time printed); the re-send filter keeps what each plugin really
//! sends whole (fault 2: agentic.nvim's text + `resource_link` prompts, CodeCompanion's shared
//! file sent again) and still drops CodeCompanion's re-sent cancelled message; CodeCompanion's
//! `/resume` lists the folder's session only, dated, and loads it (fault 5); agentic.nvim's
//! "new session" leaves pi one follower (fault 6's dropped follow connection); a queued editor
//! prompt's cancel leaves pi's terminal command running to its end (fault 4).
//!
//! What neither plugin can send, and the spec-level suite test that covers it instead:
//! `session/close` (faults 3 and 6: neither plugin has it; agentic.nvim ends a thread with
//! `session/cancel`, `lua/agentic/acp/acp_client.lua:515-525`, CodeCompanion by killing the
//! agent process, `lua/codecompanion/acp/init.lua:547-548`):
//! `acp::close_during_a_prompt_stops_it_and_lets_go`,
//! `acp::a_watching_turns_cancel_settles_its_permission_and_close_lets_go`,
//! `acp_pi::close_during_a_running_prompt_stops_it_in_pi`; `$/cancel_request` from the client
//! (neither sends one to an agent: CodeCompanion's `cancel_request` is its MCP client's,
//! `lua/codecompanion/mcp/client.lua:513`), a `session/list` cursor (CodeCompanion sends one
//! only when the agent handed out `nextCursor`, `lua/codecompanion/acp/init.lua:314-330`), and
//! `session/resume` or an unknown session's load (agentic.nvim never loads:
//! `ACPClient:load_session`, `acp_client.lua:478`, has no caller; CodeCompanion loads only an
//! id `session/list` gave, and falls back to `session/new` on any error,
//! `lua/codecompanion/acp/init.lua:388-402`):
//! `acp::list_cancel_request_and_not_found_as_acp_says`.

use crate::acp_nvim::{is_cancelled_answer, lua_str, plugins, tapped, transcript, Nvim, Thread};
use crate::acp_pi::{user_text, FollowedPi};
use crate::common::fake_model::Reply;
use crate::common::pi::Pi;
use serde_json::{json, Value};
use std::path::Path;

#[tokio::test(flavor = "current_thread")]
async fn agentic_nvim_meets_issue_63s_faults() {
    let Some((nvim, rtp)) = plugins(&["PI_IDE_BROKER_AGENTIC_NVIM"]) else {
        return;
    };
    // Beside agentic.nvim's 300,000-line read (acp_nvim::), whose 3 s bound a second pi and
    // Neovim would stretch: they take turns.
    let _heavy = crate::common::machine_heavy().await;
    let Some(mut t) = Thread::open(&nvim, &rtp, "agentic.lua").await else {
        return;
    };
    mentions_sent_again_reach_pi(&mut t, "explain").await;
    follow_turns_cancel_settles_pi(&mut t, "agentic.nvim").await;
    // agentic.nvim's cancel drops the thread (one cancel a thread): its "new session" follows
    // pi again on the same door, which drops the old follow connection (fault 6: forget()
    // kept it open when no turn was open).
    assert_eq!(t.nv.call("new_session()").await, "ok");
    let key = t.pi.key.clone();
    t.nv.until("the new session/new answered", "session_id()", |s| s == key)
        .await;
    one_follower(&t.pi, &key).await;
    queued_prompts_cancel_leaves_pis_turn_alone(&mut t, "agentic.nvim").await;
    t.pi.pi.quit().await;
}

#[tokio::test(flavor = "current_thread")]
async fn codecompanion_meets_issue_63s_faults() {
    let Some((nvim, rtp)) = plugins(&[
        "PI_IDE_BROKER_CODECOMPANION_NVIM",
        "PI_IDE_BROKER_PLENARY_NVIM",
    ]) else {
        return;
    };
    // Beside agentic.nvim's 300,000-line read (acp_nvim::), whose 3 s bound a second pi and
    // Neovim would stretch: they take turns.
    let _heavy = crate::common::machine_heavy().await;
    let Some(mut t) = Thread::open(&nvim, &rtp, "codecompanion.lua").await else {
        return;
    };
    resume_lists_the_folders_session(&mut t).await;
    mentions_sent_again_reach_pi(&mut t, "now fix it").await;
    a_resent_cancelled_message_is_not_run_again(&mut t).await;
    follow_turns_cancel_settles_pi(&mut t, "CodeCompanion").await;
    queued_prompts_cancel_leaves_pis_turn_alone(&mut t, "CodeCompanion").await;
    t.pi.pi.quit().await;
}

/// Waits until the plugin would send a new prompt (CodeCompanion refuses one while its request
/// runs), then submits `text` as typed in the chat.
async fn submit(nv: &Nvim, text: &str) {
    nv.until("the chat idle", "idle()", |s| s == "yes").await;
    assert_eq!(nv.call(&format!("submit({})", lua_str(text))).await, "ok");
}

/// The text of the next user message pi starts at or after `from`.
async fn pi_was_asked(pi: &mut Pi, from: usize) -> String {
    let started = pi
        .until("the editor's message in pi", from, |v| {
            v["type"] == "message_start" && v["message"]["role"] == "user"
        })
        .await;
    user_text(&started)
}

/// How many answers to the client's prompts the tap saw so far.
fn prompt_answers(tap: &Path) -> usize {
    transcript(tap)
        .iter()
        .filter(|m| m["result"]["stopReason"].is_string())
        .count()
}

/// Issue 63 fault 2: a file the thread mentioned before, mentioned again with the same words
/// (agentic.nvim: `[text, resource_link]`) or shared again before new words (CodeCompanion:
/// `[text "Sharing the following file as context: …", text]`), reaches pi whole: the old
/// filter dropped every leading block sent before.
async fn mentions_sent_again_reach_pi(t: &mut Thread, second_words: &str) {
    let Thread { pi: f, nv, tap } = t;
    let (a, b) = (f.proj.join("a.rs"), f.proj.join("b.rs"));
    std::fs::write(&a, "fn a() {}\n").expect("write a.rs");
    std::fs::write(&b, "fn b() {}\n").expect("write b.rs");
    let mut asked = Vec::new();
    for (file, words) in [(&a, "explain"), (&b, "explain"), (&a, second_words)] {
        f.model.push(Reply::Text(format!("answered {words}")));
        let answers = prompt_answers(tap);
        let added = nv
            .call(&format!(
                "add_file({})",
                lua_str(&file.display().to_string())
            ))
            .await;
        assert_eq!(added, "ok");
        let from = f.pi.mark();
        submit(nv, words).await;
        asked.push(pi_was_asked(&mut f.pi, from).await);
        f.pi.until("the turn settled", from, |v| v["type"] == "agent_settled")
            .await;
        tapped(tap, "the prompt answered", answers, |m| {
            m["result"]["stopReason"].is_string()
        })
        .await;
    }
    eprintln!("mentions sent again: pi was asked {asked:?}");
    for (said, (file, words)) in
        asked
            .iter()
            .zip([(&a, "explain"), (&b, "explain"), (&a, second_words)])
    {
        let path = file.display().to_string();
        assert!(
            said.contains(&path) && said.contains(words),
            "pi was asked {said:?}, not {words:?} with {path}"
        );
    }
}

/// Issue 63 fault 1: pi's terminal turn asks the thread's watching turn (`follow`) for a
/// write; the thread's cancel withdraws the permission (`$/cancel_request`), the diff is
/// answered rejected, and pi's turn settles, not aborted: printed, the issue's bound is 1 s.
async fn follow_turns_cancel_settles_pi(t: &mut Thread, plugin: &str) {
    let Thread { pi: f, nv, tap } = t;
    let from = f.pi.mark();
    submit(nv, "follow").await;
    f.pi.toast(from, "Diffs are reviewed in").await;
    f.model.push(Reply::Tool {
        name: "write".into(),
        args: json!({"path": "never.txt", "content": "no\n"}),
    });
    f.model.push(Reply::Text("as you wish".into()));
    let from = f.pi.mark();
    let r =
        f.pi.command("prompt", json!({"message": "write never.txt"}))
            .await;
    assert_eq!(r["success"], true, "{r}");
    nv.until("the permission in the chat", "pending()", |s| !s.is_empty())
        .await;
    let asked = transcript(tap)
        .into_iter()
        .rfind(|m| m["method"] == "session/request_permission")
        .expect("the door asked the permission");
    let cancelled = transcript(tap)
        .iter()
        .filter(|m| is_cancelled_answer(m))
        .count();
    let t0 = std::time::Instant::now();
    assert_eq!(nv.call("cancel()").await, "ok");
    let settled =
        f.pi.until("pi settled after the follow turn's cancel", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    let took = t0.elapsed();
    eprintln!(
        "{plugin}: cancel in a follow turn with a permission pending: pi settled after {} ms",
        took.as_millis()
    );
    assert_eq!(
        settled["aborted"], false,
        "pi's own turn went on: {settled}"
    );
    tapped(
        tap,
        "the follow turn answered cancelled",
        cancelled,
        is_cancelled_answer,
    )
    .await;
    let results = f.pi.tool_results(from);
    assert!(
        results
            .iter()
            .any(|(tool, error, text)| tool == "write" && *error && text.contains("rejected")),
        "{results:?}"
    );
    assert!(
        !f.proj.join("never.txt").exists(),
        "the write reached the disk"
    );
    // Withdrawn from the client, unless the client answered it first (CodeCompanion answers
    // its pending permissions `cancelled` as it stops, as the spec asks).
    let withdrawn = transcript(tap)
        .iter()
        .any(|m| m["method"] == "$/cancel_request" && m["params"]["requestId"] == asked["id"]);
    eprintln!("{plugin}: the permission withdrawn by the door: {withdrawn}");
}

/// CodeCompanion after a stop: the stopped message is sent again, whole, ahead of the next; pi
/// runs only the next (the re-send rule of docs/acp.md), and the stopped job does not run
/// again.
async fn a_resent_cancelled_message_is_not_run_again(t: &mut Thread) {
    let Thread { pi: f, nv, .. } = t;
    f.model.push(Reply::Tool {
        name: "bash".into(),
        args: json!({"command": "sleep 30"}),
    });
    let from = f.pi.mark();
    let replies = nv.call("chat()").await.matches("## CodeCompanion").count();
    submit(nv, "run the long job").await;
    assert_eq!(pi_was_asked(&mut f.pi, from).await, "run the long job");
    f.pi.until("the command running", from, |v| {
        v["type"] == "tool_execution_start"
    })
    .await;
    // Stopped once the job shows in the chat, as a user sees it: stopped before anything of
    // the turn shows, CodeCompanion leaves the user's section open and the next words join
    // the stopped message (one message, not a re-send).
    nv.until("the job in the chat", "chat()", |c| {
        c.matches("## CodeCompanion").count() > replies
    })
    .await;
    assert_eq!(nv.call("cancel()").await, "ok");
    let settled =
        f.pi.until("the long job stopped", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    assert_eq!(settled["aborted"], true, "{settled}");
    f.model.push(Reply::Text("created".into()));
    let from = f.pi.mark();
    submit(nv, "create the file please").await;
    assert_eq!(
        pi_was_asked(&mut f.pi, from).await,
        "create the file please"
    );
    f.pi.until("the next turn settled", from, |v| {
        v["type"] == "agent_settled"
    })
    .await;
}

/// Issue 63 fault 4: pi's terminal runs a command; the thread's prompt, sent meanwhile, waits
/// in pi's extension; the thread's cancel drops it: the terminal's command runs to its end
/// (not "Command aborted"), pi's turn is not aborted, and the cancelled text never runs.
async fn queued_prompts_cancel_leaves_pis_turn_alone(t: &mut Thread, plugin: &str) {
    let Thread { pi: f, nv, tap } = t;
    f.model.push(Reply::Tool {
        name: "bash".into(),
        args: json!({"command": "sleep 3; echo slept"}),
    });
    f.model
        .push(Reply::Text("the terminal's turn is done".into()));
    let from = f.pi.mark();
    let r =
        f.pi.command("prompt", json!({"message": "run the sleep"}))
            .await;
    assert_eq!(r["success"], true, "{r}");
    f.pi.until("the terminal's command running", from, |v| {
        v["type"] == "tool_execution_start"
    })
    .await;
    let cancelled = transcript(tap)
        .iter()
        .filter(|m| is_cancelled_answer(m))
        .count();
    submit(nv, "queued from the editor").await;
    let t0 = std::time::Instant::now();
    assert_eq!(nv.call("cancel()").await, "ok");
    tapped(
        tap,
        "the queued prompt answered cancelled",
        cancelled,
        is_cancelled_answer,
    )
    .await;
    eprintln!(
        "{plugin}: a queued prompt cancelled: answered after {} ms",
        t0.elapsed().as_millis()
    );
    let settled =
        f.pi.until("the terminal's turn settled", from, |v| {
            v["type"] == "agent_settled"
        })
        .await;
    assert_eq!(settled["aborted"], false, "{settled}");
    let results = f.pi.tool_results(from);
    assert!(
        results
            .iter()
            .any(|(tool, error, text)| tool == "bash" && !*error && text.contains("slept")),
        "the terminal's command did not run to its end: {results:?}"
    );
    // Another terminal turn, to its end: the cancelled text would have run before it.
    f.model.push(Reply::Text("next".into()));
    f.pi.prompt("and now").await;
    let ran = f.pi.log[from..].iter().any(|v| {
        v["type"] == "message_start"
            && v["message"]["role"] == "user"
            && user_text(v).contains("queued from the editor")
    });
    assert!(!ran, "the cancelled editor prompt ran");
}

/// The broker's status shows pi's session `key` with one follower.
async fn one_follower(f: &FollowedPi, key: &str) {
    f.b.wait_status("pi's session followed once", |st| {
        st["sessions"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["key"] == key && s["followers"].as_array().is_some_and(|f| f.len() == 1))
        })
    })
    .await;
}

/// Issue 63 fault 5: another pi runs in a folder inside the project; CodeCompanion's `/resume`
/// (`session/list {cwd}`, then `session/load` of the pick) offers the project's session only,
/// labelled with its `updatedAt`, and loads it.
async fn resume_lists_the_folders_session(t: &mut Thread) {
    let f = &mut t.pi;
    let sub = f.proj.join("sub");
    std::fs::create_dir_all(&sub).expect("mkdir sub");
    let install = crate::common::pi::find_pi().expect("pi runs here");
    let other = Pi::start(
        &install,
        &f.b.dir.path().join("pi-home"),
        &sub,
        &f.b.socket,
        &[],
    )
    .await;
    f.b.wait_status("both pi sessions", |st| {
        st["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().filter(|s| s["door"] == "native").count() == 2)
    })
    .await;
    let resumed = t.nv.call("resume()").await;
    let r: Value = serde_json::from_str(&resumed).unwrap_or_else(|_| panic!("{resumed}"));
    eprintln!("CodeCompanion's /resume offered {}", r["offered"]);
    let offered = r["offered"].as_array().cloned().unwrap_or_default();
    assert_eq!(offered.len(), 1, "only the folder's own session: {r}");
    let label = offered[0].as_str().unwrap_or_default();
    let proj = f.proj.display().to_string();
    // format_session: "(<updatedAt, relative>) <title>".
    assert!(
        label.starts_with('(') && label.ends_with(&format!("pi in {proj}")),
        "{label}"
    );
    assert_eq!(r["session"], f.key.as_str(), "{r}");
    let refused: Vec<Value> = transcript(&t.tap)
        .into_iter()
        .filter(|m| m.get("error").is_some())
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
    other.quit().await;
}
