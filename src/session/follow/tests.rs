//! The followers of one session held to a model (issue 53): generated sequences of followers
//! attaching, opening and closing their turns, leaving, and the session's diffs and the
//! followers' answers, applied to a real [`Session`] with real [`Follower`]s (their outboxes
//! write WebSocket frames into in-memory pipes this test reads) and to a few lines of rules.
//! After every step: the reviewer is the follower whose turn opened last among those open,
//! a diff goes to it (or, with none, to the editor), an answer goes back to the session under
//! its call id, and a follower that leaves answers each diff it held as not reviewed.

use super::*;
use crate::registry::session::{Door, Intro};
use crate::wire::wsframe::{FrameWriter, Role};
use proptest::prelude::*;
use std::collections::BTreeMap;
use tokio::io::DuplexStream;

mod run;

/// One step.
#[derive(Clone, Debug)]
enum Op {
    /// A follower attaches.
    Attach,
    /// Follower `n` (of those attached) opens (`true`) or closes its turn.
    Turn(usize, bool),
    /// Follower `n` leaves.
    Leave(usize),
    /// The session sends a diff.
    Diff,
    /// Follower `n` answers the oldest diff it holds (Allow).
    Answer(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::Attach),
        4 => (0usize..4, any::<bool>()).prop_map(|(n, open)| Op::Turn(n, open)),
        1 => (0usize..4).prop_map(Op::Leave),
        3 => Just(Op::Diff),
        2 => (0usize..4).prop_map(Op::Answer),
    ]
}

/// A pipe's reading end, as the peer of an outbox reads it: the answers by id, and the last
/// `broker/followers` notice.
struct Peer(
    FrameReader<DuplexStream>,
    BTreeMap<u64, Value>,
    Option<Value>,
);

impl Peer {
    /// The next frame, parsed (`None` once the pipe has ended).
    async fn read(&mut self) -> Option<Value> {
        match self.0.next().await {
            Ok(Some(Frame::Text(t))) => Some(serde_json::from_str(t).expect("a JSON frame")),
            _ => None,
        }
    }

    /// The answer to call `id` (bounded wait), the frames before it kept by their ids.
    async fn answer(&mut self, id: u64) -> Value {
        if let Some(v) = self.1.remove(&id) {
            return v;
        }
        self.until(&format!("the answer to call {id}"), |v| {
            v.get("method").is_none() && v["id"].as_u64() == Some(id)
        })
        .await
    }

    /// The next frame matching `pred` (bounded wait), the others kept as `keep` keeps them.
    async fn until(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        crate::testkit::within(what, async {
            loop {
                let v = self
                    .read()
                    .await
                    .unwrap_or_else(|| panic!("the pipe ended before {what}"));
                if pred(&v) {
                    return v;
                }
                self.keep(v);
            }
        })
        .await
    }

    fn keep(&mut self, v: Value) {
        if v["method"] == follow::FOLLOWERS {
            self.2 = Some(v["params"].clone());
        } else if let Some(n) = v["id"].as_u64() {
            self.1.insert(n, v);
        }
    }

    /// The session's view of its followers once it equals `want` (frames read for at most
    /// 2 s): the last `broker/followers` it was sent.
    async fn followers_notice(&mut self, want: &Value) -> Option<Value> {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while self.2.as_ref() != Some(want) {
                match self.read().await {
                    Some(v) => self.keep(v),
                    None => return,
                }
            }
        })
        .await;
        self.2.clone()
    }
}

/// An outbox writing into a pipe, and the pipe's other end.
fn piped(id: u64, tracker: &tokio_util::task::TaskTracker) -> (Outbox, Peer) {
    let (ours, theirs) = tokio::io::duplex(1 << 20);
    let sink: SessionSink = FrameWriter::new(Box::pin(ours), Role::Server);
    let outbox = Outbox::new(
        id,
        sink,
        tokio_util::sync::CancellationToken::new(),
        tracker,
    );
    let reader = FrameReader::new(theirs, Role::Client, 1 << 20, &[]);
    (outbox, Peer(reader, BTreeMap::new(), None))
}

/// The model: followers in attach order, whose turns are open, and who holds which diff.
#[derive(Default)]
struct Model {
    /// Attached followers (test ids), in attach order.
    attached: Vec<u64>,
    /// Open turns, the latest opened last.
    open: Vec<u64>,
    /// Diffs held: call id → follower.
    held: BTreeMap<u64, u64>,
}

impl Model {
    fn reviewer(&self) -> Option<u64> {
        self.open.last().copied()
    }
}

struct Harness {
    tracker: tokio_util::task::TaskTracker,
    session: Session,
    session_peer: Peer,
    followers: BTreeMap<u64, (Arc<Follower>, Peer)>,
    model: Model,
    next_follower: u64,
    next_call: u64,
}

impl Harness {
    fn new() -> Harness {
        Harness::in_realm(None)
    }

    /// A harness whose session is an agent's of `realm` (`None`: the owner's).
    fn in_realm(realm: Option<&str>) -> Harness {
        let tracker = tokio_util::task::TaskTracker::new();
        let (outbox, session_peer) = piped(1, &tracker);
        let intro = Intro {
            door: Door::Native,
            cwd: "/p".into(),
            key: Some("k".into()),
            editor: None,
            remote: None,
            pinned: false,
            inherit: None,
            family: crate::protocol::family::Family::Pi,
            client: None,
            realm: realm.map(String::from),
        };
        let (control, _) = tokio::sync::mpsc::unbounded_channel();
        let session = Session::new(1, &intro, outbox, control, 1, None);
        session.greeted.store(true, Ordering::Release);
        Harness {
            tracker,
            session,
            session_peer,
            followers: BTreeMap::new(),
            model: Model::default(),
            next_follower: 10,
            next_call: 100,
        }
    }

    fn nth(&self, n: usize) -> Option<u64> {
        let ids = &self.model.attached;
        ids.get(n % ids.len().max(1)).copied()
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Attach => {
                let id = self.next_follower;
                self.next_follower += 1;
                let (outbox, peer) = piped(id, &self.tracker);
                let f = Arc::new(Follower::new(id, format!("f{id}"), outbox, false));
                join(&self.session, f.clone());
                self.followers.insert(id, (f, peer));
                self.model.attached.push(id);
            }
            Op::Turn(n, open) => {
                if let Some(id) = self.nth(n) {
                    let f = self.followers[&id].0.clone();
                    let ready = jsonrpc::notification(follow::READY, json!({"ready": open}));
                    on_follower_text(&self.session, &f, &ready);
                    self.model.open.retain(|x| *x != id);
                    if open {
                        self.model.open.push(id);
                    }
                }
            }
            Op::Leave(n) => {
                if let Some(id) = self.nth(n) {
                    let (f, _) = self.followers.remove(&id).expect("attached");
                    let_go(&self.session, &f);
                    self.model.attached.retain(|x| *x != id);
                    self.model.open.retain(|x| *x != id);
                    let dropped: Vec<u64> = self
                        .model
                        .held
                        .iter()
                        .filter(|(_, by)| **by == id)
                        .map(|(call, _)| *call)
                        .collect();
                    for call in dropped {
                        self.model.held.remove(&call);
                        let a = self.session_peer.answer(call).await;
                        prop_assert!(
                            a["result"]["_meta"]["pi-ide-broker/undelivered"].is_string(),
                            "diff {} held by the leaving follower {} was not answered as not reviewed: {:?}",
                            call,
                            id,
                            a
                        );
                    }
                }
            }
            Op::Diff => {
                let call = self.next_call;
                self.next_call += 1;
                let reviewer = self.session.reviewer().map(|f| f.id);
                prop_assert_eq!(reviewer, self.model.reviewer(), "the reviewer");
                if let Some(f) = self.session.reviewer() {
                    let params = json!({"name": "openDiff", "arguments": {"tab_name": format!("t{call}"), "new_file_contents": "x"}});
                    review(
                        &self.session,
                        &f,
                        json!(call),
                        format!("t{call}"),
                        Some(&params),
                    );
                    self.model.held.insert(call, f.id);
                }
            }
            Op::Answer(n) => {
                let Some(id) = self.nth(n) else { return Ok(()) };
                let Some((&call, _)) = self.model.held.iter().find(|(_, by)| **by == id) else {
                    return Ok(());
                };
                let f = self.followers[&id].0.clone();
                let ours = lock(&f.reviews)
                    .iter()
                    .find(|(_, (c, _))| *c == json!(call))
                    .map(|(k, _)| k.clone());
                prop_assert!(
                    ours.is_some(),
                    "follower {} does not hold diff {}",
                    id,
                    call
                );
                let answer = json!({"jsonrpc": "2.0", "id": ours, "result": {"content": [{"type": "text", "text": "FILE_SAVED"}, {"type": "text", "text": "x"}]}});
                on_follower_text(&self.session, &f, &answer.to_string());
                self.model.held.remove(&call);
                let a = self.session_peer.answer(call).await;
                prop_assert_eq!(
                    &a["result"]["content"][0]["text"],
                    &json!("FILE_SAVED"),
                    "the Allow of diff {} reached the session",
                    call
                );
            }
        }
        self.check().await
    }

    /// What the followers were sent matches who holds which diff; the session's view of
    /// reviewers matches the model's, and so does what it was last told of its followers.
    async fn check(&mut self) -> Result<(), TestCaseError> {
        if !self.model.attached.is_empty() {
            let reviewer = self.model.reviewer().map(|id| format!("f{id}"));
            let want =
                json!({"count": self.model.attached.len(), "reviewer": reviewer, "buffers": false});
            let told = self.session_peer.followers_notice(&want).await;
            prop_assert_eq!(
                told.as_ref(),
                Some(&want),
                "what the session was told of its followers"
            );
        }
        let want = self.model.reviewer();
        prop_assert_eq!(self.session.reviewer().map(|f| f.id), want, "the reviewer");
        prop_assert_eq!(
            self.session.reviewers(),
            self.model.open.len(),
            "open turns"
        );
        for (id, (f, _)) in self.followers.iter() {
            let held: Vec<u64> = self
                .model
                .held
                .iter()
                .filter(|(_, by)| *by == id)
                .map(|(c, _)| *c)
                .collect();
            let mut real: Vec<u64> = lock(&f.reviews)
                .values()
                .filter_map(|(c, _)| c.as_u64())
                .collect();
            real.sort_unstable();
            prop_assert_eq!(&real, &held, "diffs follower {} holds", id);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::Direct(
            "target/proptest-regressions/follow-model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// The followers of a session and its diffs agree with the model after every step.
    #[test]
    fn followers_review_as_the_model_says(ops in prop::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let mut h = Harness::new();
            for (n, op) in ops.iter().enumerate() {
                h.step(op).await.map_err(|e| TestCaseError::fail(format!("after step {n} ({op:?}): {e}")))?;
            }
            Ok::<(), TestCaseError>(())
        })?;
    }
}

/// A session of `door` in `cwd` with sticky key `key`, speaking native protocol `protocol`,
/// last active at `stamp`.
fn listed(
    id: u64,
    cwd: &str,
    key: &str,
    protocol: Option<u32>,
    door: Door,
    stamp: u64,
) -> Arc<Session> {
    listed_in(id, cwd, key, protocol, door, stamp, None)
}

/// [`listed`], for a session of the agent realm `realm` (its key then carries the realm, as
/// `frontdoor::native` makes it).
fn listed_in(
    id: u64,
    cwd: &str,
    key: &str,
    protocol: Option<u32>,
    door: Door,
    stamp: u64,
    realm: Option<&str>,
) -> Arc<Session> {
    let tracker = tokio_util::task::TaskTracker::new();
    let (outbox, _) = piped(id, &tracker);
    let intro = Intro {
        door,
        cwd: cwd.into(),
        key: Some(key.into()),
        editor: None,
        remote: None,
        pinned: false,
        inherit: None,
        family: crate::protocol::family::Family::Pi,
        client: Some(crate::protocol::version::ClientInfo {
            name: "pi-ide-broker-pi".into(),
            version: None,
            protocol,
        }),
        realm: realm.map(String::from),
    };
    let (control, _) = tokio::sync::mpsc::unbounded_channel();
    Arc::new(Session::new(id, &intro, outbox, control, stamp, None))
}

/// A registry whose state dir (and socket path) is `dir`, with default config.
fn registry_in(dir: &std::path::Path) -> Arc<Registry> {
    let config = Arc::new(crate::sys::config::Config {
        state_dir: Some(dir.to_path_buf()),
        ..Default::default()
    });
    Registry::new(
        config,
        crate::registry::state::StateStore::load(dir),
        dir.join("sock"),
        tokio_util::sync::CancellationToken::new(),
    )
}

/// What `GET /v1/pi-sessions` lists and `acp` follows: native sessions of a protocol-2 client,
/// in the folder or below it, the most recently active first; a key finds its session.
#[tokio::test]
async fn the_followable_sessions_of_a_folder_are_listed_latest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = registry_in(dir.path());
    let old = listed(1, "/p", "old", Some(FOLLOW_PROTOCOL), Door::Native, 5);
    let new = listed(
        2,
        "/p/sub",
        "new",
        Some(FOLLOW_PROTOCOL + 1),
        Door::Native,
        9,
    );
    let v1 = listed(3, "/p", "v1", Some(FOLLOW_PROTOCOL - 1), Door::Native, 10);
    let unknown = listed(4, "/p", "unknown", None, Door::Native, 11);
    let stdio = listed(5, "/p", "stdio", Some(FOLLOW_PROTOCOL), Door::Stdio, 12);
    let elsewhere = listed(
        6,
        "/q",
        "elsewhere",
        Some(FOLLOW_PROTOCOL),
        Door::Native,
        13,
    );
    // An agent's session, the most recently active of all: never listed (the owner's editor
    // would follow it unasked), found only by the key that names its realm.
    let agent = listed_in(
        7,
        "/p",
        "remote:box/evil",
        Some(FOLLOW_PROTOCOL),
        Door::Native,
        99,
        Some("remote:box"),
    );
    for s in [&old, &new, &v1, &unknown, &stdio, &elsewhere, &agent] {
        reg.add_session(s.clone());
    }
    assert_eq!(by_key(&reg, "remote:box/evil").map(|s| s.id), Some(7));
    assert!(by_key(&reg, "evil").is_none());
    assert!(followable(&old) && followable(&new));
    assert!(!followable(&v1) && !followable(&unknown) && !followable(&stdio));
    let keys = |found: Vec<Arc<Session>>| -> Vec<String> {
        found.iter().filter_map(|s| s.key.clone()).collect()
    };
    assert_eq!(
        keys(candidates(&reg, std::path::Path::new("/p"))),
        ["new", "old"]
    );
    assert_eq!(
        keys(candidates(&reg, std::path::Path::new("/p/sub"))),
        ["new"]
    );
    assert!(candidates(&reg, std::path::Path::new("/r")).is_empty());
    assert_eq!(by_key(&reg, "old").map(|s| s.id), Some(1));
    assert!(
        by_key(&reg, "v1").is_none(),
        "an unfollowable session is not found by its key"
    );
    assert!(by_key(&reg, "nobody").is_none());
    let d = describe(&old);
    assert_eq!(d.session.as_deref(), Some("old"));
    assert_eq!(d.cwd, "/p");
    assert_eq!(d.followers, 0);
    assert!(d.since > 0);
    reg.cancel.cancel();
}

/// A follower's request: one the follow protocol forwards goes to the session under a
/// `follow-…` id (and is forgotten when the follower leaves); any other is refused to it; and
/// with the session gone, the follower hears so.
#[tokio::test]
async fn a_followers_requests_are_forwarded_refused_or_answered_as_gone() {
    let mut h = Harness::new();
    h.step(&Op::Attach).await.expect("attach");
    h.step(&Op::Attach).await.expect("attach");
    let (a, b) = (h.followers[&10].0.clone(), h.followers[&11].0.clone());
    let prompt = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": follow::PROMPT, "params": {"text": "hi"}})
            .to_string()
    };
    on_follower_text(&h.session, &a, &prompt(1));
    on_follower_text(&h.session, &b, &prompt(2));
    assert_eq!(
        h.session.forwarded_to().len(),
        2,
        "both prompts went on to the session"
    );
    let stray =
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {}}).to_string();
    on_follower_text(&h.session, &a, &stray);
    assert_eq!(
        h.session.forwarded_to().len(),
        2,
        "a method the protocol does not forward went on"
    );
    let (_, mut peer_a) = h.followers.remove(&10).expect("a");
    let refused = peer_a.answer(3).await;
    assert_eq!(
        refused["error"]["code"],
        jsonrpc::METHOD_NOT_FOUND,
        "{refused}"
    );
    let_go(&h.session, &a);
    assert_eq!(
        h.session.forwarded_to(),
        vec![11],
        "only the leaving follower's call is forgotten"
    );
    // The session's connection ends: its outbox refuses from now on.
    h.session
        .outbox
        .finish(std::time::Duration::from_millis(50))
        .await;
    let (_, mut peer_b) = h.followers.remove(&11).expect("b");
    on_follower_text(&h.session, &b, &prompt(4));
    let gone = peer_b.answer(4).await;
    assert_eq!(gone["error"]["code"], jsonrpc::NO_EDITOR, "{gone}");
}

/// The session's side of following: its transcript to every follower, a follower's answer to
/// a forwarded prompt back under the follower's own id, a buffer read asked of a follower that
/// reads buffers (answered naming it) and refused with none, a diff withdrawn, and a malformed
/// verdict never taken for one.
#[tokio::test]
async fn the_sessions_side_fans_out_answers_reads_and_withdraws() {
    let mut h = Harness::new();
    let tracker = tokio_util::task::TaskTracker::new();
    let (outbox, mut reader_peer) = piped(20, &tracker);
    let reader = Arc::new(Follower::new(20, "Zed".into(), outbox, true));
    join(&h.session, reader.clone());
    let (outbox, mut plain_peer) = piped(21, &tracker);
    let plain = Arc::new(Follower::new(21, "CodeCompanion".into(), outbox, false));
    join(&h.session, plain.clone());
    // Fan-out: an update reaches every follower as it came.
    let update = jsonrpc::notification(follow::UPDATE, json!({"update": {"n": 1}}));
    fan_out(&h.session, &update);
    let got = reader_peer
        .until("the update", |m| m["method"] == follow::UPDATE)
        .await;
    assert_eq!(got["params"]["update"]["n"], 1);
    plain_peer
        .until("the update, to the other follower", |m| {
            m["method"] == follow::UPDATE
        })
        .await;
    // A forwarded prompt's answer goes back under the follower's own id.
    let prompt =
        json!({"jsonrpc": "2.0", "id": 7, "method": follow::PROMPT, "params": {"text": "hi"}})
            .to_string();
    on_follower_text(&h.session, &plain, &prompt);
    let sent = h
        .session_peer
        .until("the prompt, forwarded", |m| m["method"] == follow::PROMPT)
        .await;
    let ours = sent["id"].clone();
    assert!(is_forwarded(&ours) && !is_forwarded(&json!(7)) && !is_forwarded(&json!("review-1")));
    let mut answer = serde_json::Map::new();
    answer.insert("jsonrpc".into(), json!("2.0"));
    answer.insert("result".into(), json!({"stopReason": "end_turn"}));
    answer_forwarded(&h.session, &ours, answer);
    let back = plain_peer.answer(7).await;
    assert_eq!(back["result"]["stopReason"], "end_turn");
    // A buffer read goes to the follower that reads buffers, and its answer names it.
    read(&h.session, json!(31), Some(&json!({"path": "/p/a.txt"})));
    let ask = reader_peer
        .until("the buffer read", |m| m["method"] == follow::READ_BUFFER)
        .await;
    assert_eq!(ask["params"]["path"], "/p/a.txt");
    let text =
        json!({"jsonrpc": "2.0", "id": ask["id"], "result": {"content": "unsaved"}}).to_string();
    on_follower_text(&h.session, &reader, &text);
    let read_back = h.session_peer.answer(31).await;
    assert_eq!(
        read_back["result"],
        json!({"content": "unsaved", "editor": "Zed"})
    );
    read(&h.session, json!(32), None);
    assert_eq!(
        h.session_peer.answer(32).await["error"]["code"],
        jsonrpc::INVALID_PARAMS
    );
    // A malformed verdict is no verdict: the diff is answered as not reviewed.
    let params = json!({"name": "openDiff", "arguments": {"tab_name": "t"}});
    review(&h.session, &reader, json!(41), "t".into(), Some(&params));
    let asked = reader_peer
        .until("the review", |m| m["method"] == follow::REVIEW)
        .await;
    let bad = json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"nothing": true}}).to_string();
    on_follower_text(&h.session, &reader, &bad);
    let verdict = h.session_peer.answer(41).await;
    assert!(
        verdict["result"]["_meta"]["pi-ide-broker/undelivered"].is_string(),
        "{verdict}"
    );
    // A diff the session takes back is withdrawn from its follower, once.
    review(&h.session, &reader, json!(42), "t2".into(), Some(&params));
    let asked = reader_peer
        .until("the second review", |m| m["method"] == follow::REVIEW)
        .await;
    assert!(
        !withdraw(&h.session, &json!(99)),
        "no follower holds call 99"
    );
    assert!(withdraw(&h.session, &json!(42)));
    let told = reader_peer
        .until("the withdrawal", |m| m["method"] == jsonrpc::CANCELLED)
        .await;
    assert_eq!(told["params"]["requestId"], asked["id"]);
    assert!(lock(&reader.reviews).is_empty());
    assert!(!withdraw(&h.session, &json!(42)), "withdrawn once");
    // With no follower reading buffers, a read is refused.
    let_go(&h.session, &reader);
    read(&h.session, json!(33), Some(&json!({"path": "/p/a.txt"})));
    assert_eq!(
        h.session_peer.answer(33).await["error"]["code"],
        jsonrpc::NO_EDITOR
    );
}

/// Who may take a diff back: only the session whose diff it is. Another session's
/// `notifications/cancelled` naming the same call id (ids are per session) withdraws nothing.
#[tokio::test]
async fn only_the_session_whose_diff_it_is_can_take_it_back() {
    let h = Harness::new();
    let tracker = tokio_util::task::TaskTracker::new();
    let (outbox, _peer) = piped(30, &tracker);
    let f = Arc::new(Follower::new(30, "Zed".into(), outbox, false));
    join(&h.session, f.clone());
    let ready = jsonrpc::notification(follow::READY, json!({"ready": true}));
    on_follower_text(&h.session, &f, &ready);
    let params = json!({"name": "openDiff", "arguments": {"tab_name": "t"}});
    review(&h.session, &f, json!(5), "t".into(), Some(&params));
    let other = listed(31, "/p", "other", Some(FOLLOW_PROTOCOL), Door::Native, 1);
    assert!(
        !withdraw(&other, &json!(5)),
        "another session took back this session's diff"
    );
    assert_eq!(
        lock(&f.reviews).len(),
        1,
        "the review is still the follower's"
    );
    assert!(withdraw(&h.session, &json!(5)));
}

/// A following editor reads the owner's files for the owner's sessions only: an agent's
/// session (a container's, a remote's) asking `broker/read` is refused, and the follower is
/// never asked.
#[tokio::test]
async fn an_agents_session_never_gets_a_followers_buffer_read() {
    let mut h = Harness::in_realm(Some("remote:box"));
    let tracker = tokio_util::task::TaskTracker::new();
    let (outbox, mut reader_peer) = piped(20, &tracker);
    let reader = Arc::new(Follower::new(20, "Zed".into(), outbox, true));
    join(&h.session, reader.clone());
    read(
        &h.session,
        json!(51),
        Some(&json!({"path": "/home/u/.ssh/id_ed25519"})),
    );
    let refused = h.session_peer.answer(51).await;
    assert_eq!(refused["error"]["code"], jsonrpc::NO_EDITOR, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("remote:box")),
        "{refused}"
    );
    assert!(
        lock(&reader.reads).is_empty(),
        "nothing asked of the follower"
    );
    // The follower heard nothing but its attach notice: the next thing it reads is an update.
    fan_out(
        &h.session,
        &jsonrpc::notification(follow::UPDATE, json!({"update": {"n": 2}})),
    );
    let next = reader_peer
        .until("the next frame", |m| m.get("method").is_some())
        .await;
    assert_ne!(next["method"], follow::READ_BUFFER, "{next}");
}

/// A verdict is an `openDiff` result only with a `content` array: one whose `content` is
/// text, an object or null is no verdict, and the diff is answered as not reviewed.
#[tokio::test]
async fn a_verdict_whose_content_is_not_an_array_never_reaches_the_session() {
    let mut h = Harness::new();
    h.step(&Op::Attach).await.expect("attach");
    let (f, mut peer) = h.followers.remove(&10).expect("follower");
    let params = json!({"name": "openDiff", "arguments": {"tab_name": "t"}});
    for (call, content) in [
        (61, json!("FILE_SAVED")),
        (62, json!({"type": "text", "text": "FILE_SAVED"})),
        (63, Value::Null),
    ] {
        review(&h.session, &f, json!(call), "t".into(), Some(&params));
        let asked = peer
            .until("the review", |m| m["method"] == follow::REVIEW)
            .await;
        let bad = json!({"jsonrpc": "2.0", "id": asked["id"], "result": {"content": content}});
        on_follower_text(&h.session, &f, &bad.to_string());
        let verdict = h.session_peer.answer(call).await;
        assert!(
            verdict["result"]["_meta"]["pi-ide-broker/undelivered"].is_string(),
            "content {content} reached the session as a verdict: {verdict}"
        );
        assert_eq!(verdict["result"]["content"][0]["text"], "DIFF_REJECTED");
    }
}

/// A follower's `pi/prompt` reaches the session named by the id the session sees (whatever
/// the follower wrote there); its `pi/cancel {prompt}` names that prompt the same way. A
/// cancel naming a prompt answered already, or another follower's, goes nowhere: the broker
/// answers it, and nothing of the session is stopped.
#[tokio::test]
async fn a_cancel_names_the_followers_own_prompt_and_no_other() {
    let mut h = Harness::new();
    h.step(&Op::Attach).await.expect("attach");
    h.step(&Op::Attach).await.expect("attach");
    let (a, mut peer_a) = h.followers.remove(&10).expect("a");
    let (b, mut peer_b) = h.followers.remove(&11).expect("b");
    let req = |id: &str, method: &str, params: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
    };
    on_follower_text(
        &h.session,
        &a,
        &req(
            "prompt-1",
            follow::PROMPT,
            json!({"text": "hi", "prompt": "forged"}),
        ),
    );
    let sent = h
        .session_peer
        .until("a's prompt", |m| m["method"] == follow::PROMPT)
        .await;
    assert_eq!(sent["params"]["prompt"], sent["id"], "{sent}");
    assert_eq!(sent["params"]["text"], "hi");
    // b names a's prompt by a's id: not b's, so nothing is forwarded.
    on_follower_text(
        &h.session,
        &b,
        &req("cancel-1", follow::CANCEL, json!({"prompt": "prompt-1"})),
    );
    let answered = peer_b
        .until("b's cancel answered", |m| m["id"] == "cancel-1")
        .await;
    assert_eq!(answered["result"], json!({}));
    // a's own cancel goes on, naming the prompt as the session knows it.
    on_follower_text(
        &h.session,
        &a,
        &req("cancel-2", follow::CANCEL, json!({"prompt": "prompt-1"})),
    );
    let stop = h
        .session_peer
        .until("a's cancel", |m| m["method"] == follow::CANCEL)
        .await;
    assert_eq!(stop["params"]["prompt"], sent["id"], "{stop}");
    // Once the prompt is answered, a cancel naming it stops nothing.
    let mut answer = serde_json::Map::new();
    answer.insert("jsonrpc".into(), json!("2.0"));
    answer.insert("result".into(), json!({"stopReason": "cancelled"}));
    answer_forwarded(&h.session, &sent["id"], answer);
    peer_a
        .until("the prompt's answer", |m| m["id"] == "prompt-1")
        .await;
    on_follower_text(
        &h.session,
        &a,
        &req("cancel-3", follow::CANCEL, json!({"prompt": "prompt-1"})),
    );
    let late = peer_a
        .until("the late cancel answered", |m| m["id"] == "cancel-3")
        .await;
    assert_eq!(late["result"], json!({}));
    // An older follower's cancel names no prompt: it goes on as it came.
    on_follower_text(&h.session, &a, &req("cancel-4", follow::CANCEL, json!({})));
    let old = h
        .session_peer
        .until("the old follower's cancel", |m| {
            m["method"] == follow::CANCEL
        })
        .await;
    assert_eq!(old["params"], json!({}));
}

/// A follower leaving: its held diff is answered as not reviewed; it hears `follow/ended`
/// when the session ended, and nothing when the broker stops (the session comes back with the
/// broker, and the follower redials it).
#[tokio::test]
async fn a_follower_leaving_hears_why_only_when_the_session_ended() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = registry_in(dir.path());
    for stopping in [false, true] {
        let mut h = Harness::new();
        h.step(&Op::Attach).await.expect("attach");
        let (f, mut peer) = h.followers.remove(&10).expect("follower");
        let params = json!({"name": "openDiff", "arguments": {"tab_name": "t"}});
        review(&h.session, &f, json!(71), "t".into(), Some(&params));
        peer.until("the review", |m| m["method"] == follow::REVIEW)
            .await;
        h.session.gone.cancel();
        if stopping {
            reg.accepting.cancel();
        }
        leave(&reg, &h.session, &f, "the pi session ended").await;
        let held = h.session_peer.answer(71).await;
        assert!(
            held["result"]["_meta"]["pi-ide-broker/undelivered"].is_string(),
            "{held}"
        );
        assert!(lock(&h.session.followers).is_empty());
        let mut told = Vec::new();
        while let Some(m) = peer.read().await {
            told.push(m["method"].clone());
        }
        let ended = told.iter().any(|m| m == follow::ENDED);
        assert_eq!(ended, !stopping, "stopping: {stopping}, told: {told:?}");
    }
    reg.cancel.cancel();
}
