//! The follow connection itself ([`run`]), over in-memory pipes: what the lib tests of the
//! follower's rules leave to the suite (cargo-mutants: `run` → `()` went unseen by them).

use super::*;
use futures_util::SinkExt;

/// A follower dials: it is told it attached and the session counts it; a line that is no
/// JSON-RPC gets its error and the connection goes on; the session ends: the follower hears
/// why, the connection ends and the session no longer counts it.
#[tokio::test]
async fn a_follow_connection_attaches_answers_and_ends_with_its_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let reg = registry_in(dir.path());
    let session = Arc::new(Harness::new().session);
    // One pipe each way: what the follower sends, and what it is sent.
    let (to_broker, from_follower) = tokio::io::duplex(1 << 20);
    let (to_follower, from_broker) = tokio::io::duplex(1 << 20);
    let reader = FrameReader::new(from_follower, Role::Server, 1 << 20, &[]);
    let sink: SessionSink = FrameWriter::new(Box::pin(to_follower), Role::Server);
    let following = tokio::spawn(run(
        reg.clone(),
        reader,
        sink,
        session.clone(),
        "zed".into(),
        false,
    ));
    let mut follower = FrameWriter::new(to_broker, Role::Client);
    let mut peer = Peer(
        FrameReader::new(from_broker, Role::Client, 1 << 20, &[]),
        BTreeMap::new(),
        None,
    );
    let attached = peer
        .until("follow/attached", |m| m["method"] == follow::ATTACHED)
        .await;
    assert_eq!(attached["params"]["session"], "k", "{attached}");
    assert_eq!(lock(&session.followers).len(), 1);
    follower
        .send(crate::wire::wsframe::Out::Text("{not json".into()))
        .await
        .expect("a frame to the broker");
    let refused = peer
        .until("the parse error", |m| m.get("error").is_some())
        .await;
    assert_eq!(refused["error"]["code"], jsonrpc::PARSE_ERROR);
    session.gone.cancel();
    let ended = peer
        .until("follow/ended", |m| m["method"] == follow::ENDED)
        .await;
    assert_eq!(ended["params"]["reason"], "the pi session ended");
    tokio::time::timeout(std::time::Duration::from_secs(10), following)
        .await
        .expect("the connection ended within 10 s")
        .expect("run");
    assert!(lock(&session.followers).is_empty());
    reg.cancel.cancel();
}
