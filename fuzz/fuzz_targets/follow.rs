//! The follow protocol's frames (`session::follow`), one per line, from either side: `a…` and
//! `b…` are frames of two followers of one session, `s…` the session's answers, `r…` the
//! session's `openDiff` offered for review. Nothing panics, and after every frame the books
//! agree: the reviewer count is the number of followers whose turn is open, and every call
//! a follower sent on to the session names a follower that is there.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pi_ide_broker::protocol::family::Family;
use pi_ide_broker::protocol::jsonrpc::{self, Incoming};
use pi_ide_broker::session::follow;
use pi_ide_broker::registry::session::{Door, Follower, Intro, Session};
use pi_ide_broker::wire::outbox::Outbox;
use pi_ide_broker::wire::wsframe::{FrameWriter, Role};
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn outbox(id: u64, tracker: &tokio_util::task::TaskTracker) -> Outbox {
    let sink = FrameWriter::new(
        Box::pin(tokio::io::sink()) as std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
        Role::Server,
    );
    Outbox::new(id, sink, tokio_util::sync::CancellationToken::new(), tracker)
}

fn books_agree(s: &Session) {
    let owed = s.forwarded_to();
    let followers = s.followers.lock().expect("followers");
    let open = followers.iter().filter(|f| f.reviewing.load(Ordering::Acquire)).count();
    assert_eq!(s.reviewers(), open, "the reviewer count drifted");
    for fid in owed {
        assert!(followers.iter().any(|f| f.id == fid), "a call of no follower");
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    rt.block_on(async {
        let tracker = tokio_util::task::TaskTracker::new();
        let intro = Intro {
            door: Door::Native,
            cwd: "/p".into(),
            key: Some("k".into()),
            editor: None,
            inherit: None,
            pinned: false,
            remote: None,
            family: Family::Pi,
            client: None,
            realm: None,
        };
        let (control, _rx) = tokio::sync::mpsc::unbounded_channel();
        let session = Session::new(1, &intro, outbox(1, &tracker), control, 0, None);
        let a = Arc::new(Follower::new(2, "a".into(), outbox(2, &tracker), true));
        let b = Arc::new(Follower::new(3, "b".into(), outbox(3, &tracker), false));
        session.followers.lock().expect("followers").extend([a.clone(), b.clone()]);
        for line in text.split('\n') {
            let mut chars = line.chars();
            let who = chars.next();
            let frame = chars.as_str();
            match who {
                Some('a') => follow::on_follower_text(&session, &a, frame),
                Some('b') => follow::on_follower_text(&session, &b, frame),
                Some('s') => {
                    if let Ok(Incoming::Response { id, msg }) = jsonrpc::classify(frame) {
                        if follow::is_forwarded(&id) {
                            follow::answer_forwarded(&session, &id, msg);
                        }
                    }
                }
                Some('r') => {
                    if let Some(f) = session.reviewer() {
                        let args = serde_json::from_str(frame).ok();
                        follow::review(&session, &f, serde_json::json!(frame.len()), frame.into(), args.as_ref());
                    }
                }
                _ => {}
            }
            books_agree(&session);
        }
        tracker.close();
    });
});
