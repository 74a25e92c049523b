use super::*;

#[test]
fn minted_ids_stay_below_2_pow_53_and_start_again_at_1() {
    let counter = AtomicU64::new(1);
    assert_eq!((mint_id(&counter), mint_id(&counter)), (1, 2));
    let counter = AtomicU64::new(MAX_MINTED_ID - 1);
    let ids: Vec<u64> = (0..4).map(|_| mint_id(&counter)).collect();
    assert_eq!(ids, vec![MAX_MINTED_ID - 1, MAX_MINTED_ID, 1, 2]);
    assert!(
        ids.iter().all(|id| (*id as f64) as u64 == *id),
        "exact as doubles"
    );
}

fn test_editor() -> Editor {
    editor_seen_from(None)
}

/// An editor whose lockfile says it runs on Windows (`wsl`) or not.
fn editor_seen_from(wsl: Option<crate::protocol::winpath::Wsl>) -> Editor {
    let lock = Lockfile {
        path: PathBuf::from("/nonexistent/1.lock"),
        family: crate::protocol::family::Family::Pi,
        port: 1,
        pid: 1,
        workspace_folders: Vec::new(),
        ide_name: "test".into(),
        auth_token: Some(crate::sys::secret::Token::new("t".into())),
        wsl,
    };
    Editor::new(
        "test".into(),
        lock,
        Vec::new(),
        Succession::default(),
        CancellationToken::new(),
        Arc::new(DiffJournal::in_memory()),
    )
}

/// A short call in flight under `uid` until `at`.
fn in_flight(editor: &Editor, uid: u64, at: tokio::time::Instant) {
    editor.pending.insert(
        uid,
        Pending {
            owner: Owner::Discard,
            method: "tools/call".into(),
            tool: Some("getDiagnostics".into()),
            tab_name: None,
            started: Instant::now(),
            deadline: Some(at),
            bridge: None,
            map: None,
        },
    );
    lock(&editor.deadlines).push(Reverse((at, uid)));
}

#[test]
fn the_deadline_sweep_wakes_only_for_calls_still_owed() {
    let editor = test_editor();
    let t0 = tokio::time::Instant::now();
    let s = Duration::from_secs;
    in_flight(&editor, 1, t0 + s(5));
    in_flight(&editor, 2, t0 + s(6));
    in_flight(&editor, 3, t0 + s(7));
    // 1 and 2 are answered; nothing is due yet.
    editor.pending.remove(&1);
    editor.pending.remove(&2);
    editor.expire_deadlines(t0);
    assert_eq!(
        editor.next_deadline(),
        Some(t0 + s(7)),
        "the next wake-up is the earliest call still owed, not an answered one's"
    );
    assert!(editor.pending.contains_key(&3), "3 is not due");
    // 3 is due: it times out and leaves the table; nothing is left to wake for.
    editor.expire_deadlines(t0 + s(7));
    assert!(!editor.pending.contains_key(&3));
    assert_eq!(editor.next_deadline(), None);
}

/// Issue 63: a Windows editor seen from WSL gets Windows paths in every frame on its link,
/// not only in the broker's own calls: an answer to its request, a notification forwarded
/// to it and a cancellation go through `send_raw`, and are mapped (or, with no path, left
/// as they were). Read off a real socket as the editor would.
#[tokio::test]
async fn frames_sent_raw_to_a_windows_editor_have_its_paths() {
    let editor = editor_seen_from(Some(crate::protocol::winpath::Wsl {
        mount_root: "/mnt".into(),
        distro: Some("Ubuntu".into()),
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dialled = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    let (_read, write) = dialled.into_split();
    let tracker = tokio_util::task::TaskTracker::new();
    let _broken = editor.out.install(
        FrameWriter::new(write, crate::wire::wsframe::Role::Client),
        16,
        &tracker,
    );
    let inner = json!([{"uri": "file:///mnt/c/p/a%20b.rs"}]).to_string();
    let answer = jsonrpc::result(
        &json!(7),
        json!({"content": [{"type": "text", "text": inner}]}),
    );
    let forwarded = jsonrpc::notification("x/opened", json!({"filePath": "/mnt/c/p/a.rs"}));
    let cancel = jsonrpc::notification(jsonrpc::CANCELLED, json!({"requestId": 3}));
    for frame in [&answer, &forwarded, &cancel] {
        editor.send_raw(frame.clone()).unwrap();
    }
    let mut reader = FrameReader::new(accepted, crate::wire::wsframe::Role::Server, 1 << 20, &[]);
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let frame = crate::testkit::within("the frames on the wire", reader.next()).await;
        match frame {
            Ok(Some(crate::wire::wsframe::Frame::Text(t))) => {
                seen.push(serde_json::from_str::<Value>(t).unwrap())
            }
            other => panic!("not a text frame: {other:?}"),
        }
    }
    let text = seen[0]["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("");
    let inner: Value = serde_json::from_str(text).unwrap();
    assert_eq!(inner[0]["uri"], "file:///C:/p/a%20b.rs", "{}", seen[0]);
    assert_eq!(seen[1]["params"]["filePath"], r"C:\p\a.rs", "{}", seen[1]);
    assert_eq!(seen[2], serde_json::from_str::<Value>(&cancel).unwrap());
}
