//! Issue: hostile input — lockfiles, frames on every door, who may connect. Each case: the
//! daemon keeps serving everyone else, and a peer owed an answer gets a JSON-RPC error.

use crate::common::*;
use futures_util::SinkExt;
use pi_ide_broker::testkit::pi_client::PiClient;
use pi_ide_broker::testkit::within;
use proptest::prelude::*;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use tokio::io::AsyncWriteExt;

/// A client's frame as a peer writes it by hand: `first` (FIN bit and opcode), the masked
/// length (under 126 bytes) and the masked `payload`.
fn masked_frame(first: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126, "a one-byte length only");
    let mask = [9u8, 8, 7, 6];
    let mut f = vec![first, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// Reads raw frames (skipping notices) until the broker's close frame; its status code.
async fn close_code(a: &mut Agent) -> Option<u16> {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::Message;
    within("the close frame", async {
        loop {
            match a.raw_mut().next().await {
                Some(Ok(Message::Close(c))) => return c.map(|c| u16::from(c.code)),
                Some(Ok(_)) => {}
                other => panic!("the connection ended without a close frame: {other:?}"),
            }
        }
    })
    .await
}

/// Why status says `path` is refused, if it does.
fn refusal(st: &Value, path: &std::path::Path) -> Option<String> {
    st["lockfiles_rejected"]
        .as_array()?
        .iter()
        .find(|r| r["path"].as_str() == path.to_str())
        .and_then(|r| r["reason"].as_str())
        .map(String::from)
}

/// The good editor still answers through a fresh session.
async fn still_serving(b: &TestBroker, cwd: &str) {
    let mut a = Agent::open(&b.socket, cwd, None).await;
    a.attached().await;
    let r = a.call("echo", json!({"ok": true})).await;
    assert!(r.get("result").is_some(), "{r}");
}

#[tokio::test]
async fn malformed_lockfiles_at_a_high_rate_leave_the_good_editor_alone() {
    let b = TestBroker::start().await;
    let (_good, good_id) = b.editor(&["/good"]).await;
    let d = b.pi_dir.clone();
    // A lock dir anyone can write to: others' files are refused, ours still work.
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    let me = std::process::id();
    let huge_folders: Vec<String> = (0..5000).map(|i| format!("/f/{i}")).collect();
    let shapes: Vec<(String, Vec<u8>)> = vec![
        ("41001.lock".into(), b"{not json".to_vec()),
        (
            "41002.lock".into(),
            br#"{"pid":"12","authToken":"0123456789abc"}"#.to_vec(),
        ),
        (
            "41003.lock".into(),
            json!({"pid": me, "authToken": "0123456789abc", "workspaceFolders": huge_folders})
                .to_string()
                .into_bytes(),
        ),
        ("41004.lock".into(), vec![b'{'; 10 * 1024 * 1024]),
        ("41005.lock".into(), br#"[]"#.to_vec()),
        (
            "0.lock".into(),
            json!({"pid": me, "authToken": "0123456789abc"})
                .to_string()
                .into_bytes(),
        ),
        (
            "70000.lock".into(),
            json!({"pid": me, "authToken": "0123456789abc"})
                .to_string()
                .into_bytes(),
        ),
        (
            "41006.lock".into(),
            json!({"pid": 0, "authToken": "0123456789abc"})
                .to_string()
                .into_bytes(),
        ),
        (
            "41007.lock".into(),
            json!({"pid": me, "authToken": 12345678901u64})
                .to_string()
                .into_bytes(),
        ),
        (
            "41008.lock".into(),
            json!({"pid": me, "authToken": "x".repeat(600)})
                .to_string()
                .into_bytes(),
        ),
    ];
    std::os::unix::fs::symlink("/dev/zero", d.join("41009.lock")).unwrap();
    assert!(std::process::Command::new("mkfifo")
        .arg(d.join("41010.lock"))
        .status()
        .unwrap()
        .success());
    // Another owner (the suite runs as root in CI; elsewhere chown fails and the case is skipped).
    let foreign = d.join("41011.lock");
    std::fs::write(
        &foreign,
        json!({"pid": me, "authToken": "0123456789abc"}).to_string(),
    )
    .unwrap();
    let chowned = std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).is_ok();
    if !chowned {
        crate::common::cannot_run("foreign-owner lockfile: chown needs root");
    }
    // Create, rewrite and delete them 30 times over, ending with every one of them written.
    for round in 0..31 {
        for (name, body) in &shapes {
            let p = d.join(name);
            if round % 3 == 2 {
                let _ = std::fs::remove_file(&p);
            } else {
                std::fs::write(&p, body).unwrap();
            }
        }
    }
    still_serving(&b, "/good").await;
    // A good editor's lockfile written after all of them: once it is ready, the watcher has
    // handled every earlier event (it reads them in order), so what status shows is final.
    let (_sentinel, sentinel_id) = b.editor(&["/sentinel"]).await;
    let st = b.status().await;
    let mut ids: Vec<&str> = st["editors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    ids.sort_unstable();
    let mut want = vec![good_id.as_str(), sentinel_id.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want, "no bad lockfile became an editor");
    // Every bad file is listed as refused, each with its reason: none is silently dropped.
    let mut refused: Vec<String> = st["lockfiles_rejected"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["reason"].as_str().is_some_and(|why| !why.is_empty()))
        .filter_map(|r| {
            let path = std::path::Path::new(r["path"].as_str()?);
            Some(path.file_name()?.to_str()?.to_string())
        })
        .collect();
    refused.sort_unstable();
    let mut bad: Vec<String> = shapes.iter().map(|(name, _)| name.clone()).collect();
    bad.extend(["41009.lock".into(), "41010.lock".into()]);
    if chowned {
        bad.push("41011.lock".into());
    }
    bad.sort_unstable();
    assert_eq!(
        refused, bad,
        "every bad file is refused: {}",
        st["lockfiles_rejected"]
    );
    // pid 1 is alive (init) but is no editor. Run as root, it is ours: listed, never ready,
    // and it costs nobody else anything (a closed port: the link backs off). Run as anyone
    // else, it is another user's process: refused as such.
    let (_held, closed_port) = crate::common::closed_port();
    let pid1 = d.join(format!("{closed_port}.lock"));
    std::fs::write(
        &pid1,
        json!({"pid": 1, "authToken": "0123456789abc", "workspaceFolders": ["/good"]}).to_string(),
    )
    .unwrap();
    if rustix::process::getuid().is_root() {
        b.wait_status("the pid-1 entry in backoff", |st| {
            editor_by_port(st, closed_port).is_some_and(|e| e["state"] == "backoff")
        })
        .await;
    } else {
        b.wait_status("the pid-1 entry refused as root's", |st| {
            refusal(st, &pid1).is_some_and(|r| r.contains("pid 1 belongs to uid 0, not you"))
        })
        .await;
    }
    still_serving(&b, "/good").await;
    std::fs::remove_file(&pid1).unwrap();
    b.wait_editor_gone(closed_port).await;
    // The lock dir deleted and recreated: the editor comes back when its file does.
    let (fe2, _) = b.editor(&["/second"]).await;
    let backup = std::fs::read(d.join(format!("{}.lock", fe2.port))).unwrap();
    std::fs::remove_dir_all(&d).unwrap();
    b.wait_editor_gone(fe2.port).await;
    // The daemon may have made the dir again already (it keeps its lock dirs in place).
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join(format!("{}.lock", fe2.port)), backup).unwrap();
    b.wait_editor(fe2.port, "ready").await;
    b.stop().await;
}

#[tokio::test]
async fn garbage_frames_on_the_native_and_compat_doors() {
    let b = TestBroker::start_with(|c| c.max_frame_bytes = 1024 * 1024).await;
    let (_fe, _) = b.editor(&["/h"]).await;
    let mut a = Agent::open(&b.socket, "/h", None).await;
    let compat = compat_entry(&b.dir.path().join("compat"), "/h").await;
    let mut pi = PiClient::connect(&compat).await.unwrap();
    let cases: Vec<(&str, i64)> = vec![
        ("not json", -32700),
        ("{\"jsonrpc\":\"2.0\",\"id\":1", -32700),
        ("{\"hello\":\"world\"}", -32600),
        (
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}]",
            -32600,
        ),
        (
            "{\"jsonrpc\":\"2.0\",\"id\":{\"o\":1},\"method\":\"ping\"}",
            -32600,
        ),
        (
            "{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"ping\"}",
            -32600,
        ),
        ("{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"ping\"}", -32600),
        ("\"just a string\"", -32600),
        ("null", -32600),
    ];
    for (text, code) in &cases {
        a.send_text(text).await;
        let v = a.until("an error", |v| v.get("error").is_some()).await;
        assert_eq!(v["error"]["code"], *code, "native: {text}");
    }
    // Ids of every JSON type, huge ones included, and a request without params.
    for id in [
        json!(null),
        json!(0),
        json!(-1),
        json!(1.25),
        json!("s"),
        json!("1"),
        json!(1),
    ] {
        let r = a
            .request(
                id.clone(),
                "tools/call",
                json!({"name": "echo", "arguments": {}}),
            )
            .await;
        assert_eq!(r["id"].to_string(), id.to_string());
    }
    a.send_text(r#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"ping"}"#)
        .await;
    let huge: Value = serde_json::from_str("123456789012345678901234567890").unwrap();
    let v = a.until("huge id", |v| v["id"] == huge).await;
    assert!(v.get("result").is_some());
    a.send_text(r#"{"jsonrpc":"2.0","id":"np","method":"tools/list"}"#)
        .await;
    assert!(a
        .until("no params", |v| v["id"] == "np")
        .await
        .get("result")
        .is_some());
    // Binary frames are read as text; invalid UTF-8 in one is a parse error, not a crash.
    let binary = a.raw_mut();
    binary
        .send(tokio_tungstenite::tungstenite::Message::Binary(
            b"{\"jsonrpc\":\"2.0\",\"id\":\"bin\",\"method\":\"ping\"}"
                .to_vec()
                .into(),
        ))
        .await
        .unwrap();
    assert!(a
        .until("binary", |v| v["id"] == "bin")
        .await
        .get("result")
        .is_some());
    a.raw_mut()
        .send(tokio_tungstenite::tungstenite::Message::Binary(
            vec![0xff, 0xfe, 0x00].into(),
        ))
        .await
        .unwrap();
    assert_eq!(
        a.until("utf8", |v| v.get("error").is_some()).await["error"]["code"],
        -32700
    );
    // A ping flood is answered and the session still works.
    for _ in 0..5000 {
        a.raw_mut()
            .feed(tokio_tungstenite::tungstenite::Message::Ping(
                b"x".to_vec().into(),
            ))
            .await
            .unwrap();
    }
    a.raw_mut().flush().await.unwrap();
    let r = a.request(json!("after-pings"), "ping", json!({})).await;
    assert!(r.get("result").is_some());
    // The same garbage on the compat door.
    for (text, code) in &cases[..4] {
        let v = pi.raw(text).await;
        assert_eq!(v["error"]["code"], *code, "compat: {text}");
    }
    assert!(pi
        .tool("echo", json!({}))
        .await
        .unwrap()
        .get("result")
        .is_some());
    // An oversized frame is refused by the cap before it is read: that connection closes,
    // nobody else notices.
    let mut big = Agent::open(&b.socket, "/h", None).await;
    let header_only = {
        // A masked text frame header announcing 100 MiB, then nothing: never allocated.
        let mut f = vec![0x81u8, 0x80 | 127];
        f.extend_from_slice(&(100u64 * 1024 * 1024).to_be_bytes());
        f.extend_from_slice(&[1, 2, 3, 4]);
        f
    };
    big.raw_mut()
        .get_mut()
        .write_all(&header_only)
        .await
        .unwrap();
    assert_eq!(
        close_code(&mut big).await,
        Some(1009),
        "the oversized frame closes that connection as too big"
    );
    still_serving(&b, "/h").await;
    let r = a.request(json!("end"), "ping", json!({})).await;
    assert!(r.get("result").is_some(), "the first session is unaffected");
    b.stop().await;
}

#[tokio::test]
async fn invalid_utf8_in_a_text_frame_closes_only_that_session() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/u"]).await;
    let mut bad = Agent::open(&b.socket, "/u", None).await;
    // A text frame (FIN, opcode 1) with 2 bytes that are not UTF-8.
    let f = masked_frame(0x81, &[0xc3, 0x28]);
    bad.raw_mut().get_mut().write_all(&f).await.unwrap();
    assert_eq!(
        close_code(&mut bad).await,
        Some(1007),
        "invalid payload data"
    );
    still_serving(&b, "/u").await;
    b.stop().await;
}

#[tokio::test]
async fn a_fragmented_message_is_reassembled_and_answered() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/frag"]).await;
    let mut a = Agent::open(&b.socket, "/frag", None).await;
    a.attached().await;
    let msg = br#"{"jsonrpc":"2.0","id":"frag","method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    let (first, rest) = msg.split_at(20);
    let stream = a.raw_mut().get_mut();
    stream.write_all(&masked_frame(0x01, first)).await.unwrap(); // text, FIN=0
    stream.write_all(&masked_frame(0x80, rest)).await.unwrap(); // continuation, FIN=1
    let r = a.until("the answer", |v| v["id"] == "frag").await;
    assert!(r.get("result").is_some(), "{r}");
    b.stop().await;
}

/// A listener of uid 65534 on 127.0.0.1 (Python under `setpriv`) that writes down every
/// byte any connection sends it. Each round it reads every connection it holds before it
/// takes a new one: what reached it before a later connection was made is written down
/// before that connection's bytes.
struct ForeignListener {
    port: u16,
    /// Every byte received so far, all connections together.
    received: tokio::sync::watch::Receiver<Vec<u8>>,
    child: tokio::process::Child,
}

const RECORDER: &str = r#"
import select, socket, sys
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(('127.0.0.1', int(sys.argv[1])))
l.listen(16)
print('port', l.getsockname()[1], flush=True)
conns = []
while True:
    ready, _, _ = select.select([l] + conns, [], [])
    for c in list(conns):
        c.setblocking(False)
        try:
            d = c.recv(65536)
        except BlockingIOError:
            continue
        except ConnectionError:
            d = b''
        if d:
            print('bytes', d.hex(), flush=True)
        else:
            conns.remove(c)
            c.close()
    if l in ready:
        conns.append(l.accept()[0])
"#;

impl ForeignListener {
    /// Listens on `port` (0: any free one) as uid 65534.
    async fn start(python: &str, port: u16) -> ForeignListener {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", python])
            .args(["-c", RECORDER, &port.to_string()])
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("setpriv");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = within("the foreign listener", lines.next_line())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("uid 65534 could not listen on port {port}"));
        let port = first
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .expect("its port");
        let (tx, received) = tokio::sync::watch::channel(Vec::new());
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Some(hex) = line.strip_prefix("bytes ") else {
                    continue;
                };
                let bytes: Vec<u8> = (0..hex.len() / 2)
                    .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                    .collect();
                tx.send_modify(|all| all.extend(bytes));
            }
        });
        ForeignListener {
            port,
            received,
            child,
        }
    }

    /// Stops it: once this returns its port is closed.
    async fn stop(mut self) {
        let _ = self.child.kill().await;
    }

    /// Returns once `needle` is among the bytes received.
    async fn saw(&self, needle: &str) {
        let mut rx = self.received.clone();
        let _ = rx
            .wait_for(|all| all.windows(needle.len()).any(|w| w == needle.as_bytes()))
            .await;
    }

    /// Every byte received up to now: a connection of our own writes a marker, and once the
    /// listener has written it down, whatever reached it before is written down too.
    async fn received_so_far(&self, marker: &str) -> Vec<u8> {
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .expect("connect to the foreign listener");
        c.write_all(marker.as_bytes()).await.expect("the marker");
        within("the marker", self.saw(marker)).await;
        self.received.borrow().clone()
    }
}

/// Waits until status shows `lockfile` refused for the reason `why`, failing at once if
/// `token` reaches `listener` meanwhile.
async fn refused_without_the_token(
    b: &TestBroker,
    lockfile: &std::path::Path,
    why: &str,
    listener: &ForeignListener,
    token: &str,
) -> Value {
    let what = format!("{} refused: {why}", lockfile.display());
    tokio::select! {
        st = b.wait_status(&what, |st| {
            refusal(st, lockfile).is_some_and(|r| r.contains(why))
        }) => st,
        _ = listener.saw(token) => panic!("the editor's token reached uid 65534's listener"),
    }
}

/// Issue 61: a lockfile of ours, naming a live pid of ours, whose port another user listens
/// on. The broker never sends that user the token: whether the listener was there when the
/// file was read, or came after the editor was admitted (the link's look before each
/// dial). Status and doctor say why; our other editor works throughout.
#[tokio::test]
async fn a_lockfile_whose_port_another_user_listens_on_never_gets_its_token_sent() {
    if !crate::common::process::other_uid_or_skip("foreign-listener test").await {
        return;
    }
    let Some(python) = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        crate::common::cannot_run("foreign-listener test: python3 in /usr/bin, run as uid 65534");
        return;
    };
    let b = TestBroker::start().await;
    let (_good, _) = b.editor(&["/good"]).await;
    let me = std::process::id();
    let write_lockfile = |port: u16, token: &str, folder: &str| {
        let path = b.pi_dir.join(format!("{port}.lock"));
        let body = json!({
            "pid": me,
            "authToken": token,
            "workspaceFolders": [folder],
            "ideName": "Neovim",
        });
        std::fs::write(&path, body.to_string()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        path
    };
    let why = |port: u16| {
        format!(
            "port {port} is listened on by uid 65534, not you: the lockfile's editor is not \
             yours; the token was not sent"
        )
    };

    // There before the lockfile: refused when the file is read.
    let first = ForeignListener::start(python, 0).await;
    let token = "ISSUE-61-TOKEN-READ-TIME";
    let at_read = write_lockfile(first.port, token, "/first");
    let st = refused_without_the_token(&b, &at_read, &why(first.port), &first, token).await;
    assert!(editor_by_port(&st, first.port).is_none(), "never an editor");
    still_serving(&b, "/good").await;
    let got = first.received_so_far("MARKER-1").await;
    assert_eq!(got, b"MARKER-1", "nothing but our marker reached it");

    // Came after the editor was admitted (nothing listened: the link backs off): refused at
    // the link's next dial, before a byte is sent.
    let (held, port) = crate::common::closed_port();
    let token = "ISSUE-61-TOKEN-DIAL-TIME";
    let at_dial = write_lockfile(port, token, "/second");
    b.wait_editor(port, "backoff").await;
    drop(held);
    let second = ForeignListener::start(python, port).await;
    let st = refused_without_the_token(&b, &at_dial, &why(port), &second, token).await;
    assert!(editor_by_port(&st, port).is_none(), "the editor is gone");
    still_serving(&b, "/good").await;
    let got = second.received_so_far("MARKER-2").await;
    assert_eq!(got, b"MARKER-2", "nothing but our marker reached it");

    // That listener gone and the file written again: valid, no longer listed as refused (the
    // refusal was the link's: the watcher had never refused it), an editor again.
    second.stop().await;
    write_lockfile(port, token, "/second");
    b.wait_status("the lockfile valid again", |st| {
        refusal(st, &at_dial).is_none() && editor_by_port(st, port).is_some()
    })
    .await;
    // Another user's listener once more, refused at the dial again; then the file removed:
    // no longer listed.
    let third = ForeignListener::start(python, port).await;
    refused_without_the_token(&b, &at_dial, &why(port), &third, token).await;
    let got = third.received_so_far("MARKER-3").await;
    assert_eq!(got, b"MARKER-3", "nothing but our marker reached it");
    let kept = std::fs::read(&at_dial).unwrap();
    std::fs::remove_file(&at_dial).unwrap();
    b.wait_status("a removed lockfile no longer listed", |st| {
        refusal(st, &at_dial).is_none()
    })
    .await;
    std::fs::write(&at_dial, kept).unwrap();
    std::fs::set_permissions(&at_dial, std::fs::Permissions::from_mode(0o600)).unwrap();

    // Doctor says why, and what to do.
    let (_, report) = crate::doctor::doctor(b.dir.path(), "/good", "").await;
    for (path, port) in [(&at_read, first.port), (&at_dial, port)] {
        let name = path.file_name().unwrap().to_str().unwrap();
        let verdict = crate::doctor::check(&report, name);
        assert_eq!(verdict["level"], "fail", "{verdict}");
        assert!(
            verdict["message"]
                .as_str()
                .unwrap_or_default()
                .contains(&why(port)),
            "{verdict}"
        );
        assert!(
            verdict["fix"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("another user's program holds port {port}")),
            "{verdict}"
        );
    }
    still_serving(&b, "/good").await;
    b.stop().await;
}

#[tokio::test]
async fn another_uid_cannot_use_the_native_socket() {
    // The probe runs as uid 65534 and says exactly how far it got.
    if !crate::common::process::other_uid_or_skip("other-uid test").await {
        return;
    }
    let b = TestBroker::start().await;
    let eacces = rustix::io::Errno::ACCESS.raw_os_error();
    assert_eq!(
        crate::common::process::probe_as_nobody(&b.socket)
            .await
            .as_deref(),
        Some(format!("connect-failed {eacces}").as_str()),
        "the 0700 dir keeps other users from even connecting"
    );
    // Open the path up (a misconfiguration): the connection is made, and the broker's peer
    // uid check drops it without a byte of answer.
    crate::common::process::expose_socket(&b.socket, b.dir.path(), true);
    assert_eq!(
        crate::common::process::probe_as_nobody(&b.socket)
            .await
            .as_deref(),
        Some("dropped")
    );
    crate::common::process::expose_socket(&b.socket, b.dir.path(), false);
    assert!(
        b.status().await["editors"].is_array(),
        "still serving its own user"
    );
    b.stop().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn any_id_round_trips_through_the_broker(ids in proptest::collection::vec(prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        "[ -~]{0,24}".prop_map(|s| json!(s)),
        (-1e9f64..1e9).prop_map(|f| json!(f)),
        Just(Value::Null),
    ], 1..6)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let b = TestBroker::start().await;
            let (_fe, _) = b.editor(&["/p"]).await;
            let mut a = Agent::open(&b.socket, "/p", None).await;
            for id in &ids {
                a.call_tool(id.clone(), "echo", json!({})).await;
            }
            let mut seen = Vec::new();
            while seen.len() < ids.len() {
                let v = within("answers", a.next()).await.expect("answer");
                if v.get("method").is_none() {
                    seen.push(v["id"].to_string());
                }
            }
            let mut want: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
            want.sort();
            seen.sort();
            assert_eq!(seen, want);
            b.stop().await;
        });
    }
}

#[tokio::test]
async fn browser_origins_are_refused_on_the_native_socket_too() {
    use tokio::io::AsyncReadExt;
    let b = TestBroker::start().await;
    let mut s = tokio::net::UnixStream::connect(&b.socket).await.unwrap();
    s.write_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut resp = String::new();
    within("response", s.read_to_string(&mut resp))
        .await
        .unwrap();
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    assert!(!resp.contains("\"editors\""), "no status for a browser");
    b.stop().await;
}

/// Every TCP socket of this machine (IPv4 and IPv6), as the columns of its line in
/// `/proc/net/tcp{,6}`. Linux only: a missing `/proc` fails the test (ignored elsewhere).
fn tcp_sockets() -> Vec<Vec<String>> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .flat_map(|table| {
            std::fs::read_to_string(table)
                .expect("/proc/net/tcp")
                .lines()
                .skip(1)
                .map(|l| l.split_whitespace().map(String::from).collect())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Open fds of process `pid` (this one: `"self"`) on the broker's side of its two doors: sockets whose local address
/// is the compat port or the native socket path (the listeners and every accepted connection).
/// Read through `/proc/net`, so the clients' own sockets, connections still in a listen backlog
/// and whatever other tests in this binary open meanwhile do not count. Linux only: a missing
/// `/proc` fails the test (ignored elsewhere) instead of reading as 0.
fn door_fds(pid: &str, port: u16, socket: &std::path::Path) -> usize {
    let mut inodes = std::collections::HashSet::new();
    let local_port = format!(":{port:04X}");
    for cols in tcp_sockets() {
        if cols.get(1).is_some_and(|a| a.ends_with(&local_port)) {
            inodes.extend(cols.get(9).cloned());
        }
    }
    let path = socket.to_string_lossy();
    for line in std::fs::read_to_string("/proc/net/unix")
        .expect("/proc/net/unix")
        .lines()
        .skip(1)
    {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.get(7) == Some(&path.as_ref()) {
            inodes.extend(cols.get(6).map(|i| i.to_string()));
        }
    }
    crate::common::process::socket_inodes(pid)
        .iter()
        .filter(|i| inodes.contains(*i))
        .count()
}

/// 5,000 idle TCP connections to a compat port and 5,000 idle connections to the socket: the
/// excess is closed (the oldest silent ones make room), a real session keeps working
/// throughout, and once the flood goes, the fds come back to where they were.
#[tokio::test]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc")]
async fn connection_floods_are_capped_on_both_doors() {
    // 10,000 client sockets in this process: its soft fd limit raised to fit (as far as the
    // hard limit allows; a machine whose hard limit is lower cannot run this test).
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut limit = getrlimit(Resource::Nofile);
    let want = 16_384;
    if limit.current.is_some_and(|c| c < want) {
        limit.current = Some(limit.maximum.map_or(want, |m| m.min(want)));
        let _ = setrlimit(Resource::Nofile, limit);
    }
    if getrlimit(Resource::Nofile)
        .current
        .is_some_and(|c| c < 11_000)
    {
        crate::common::cannot_run("the 10,000-connection flood: the hard fd limit is under 11,000");
        return;
    }
    let b = TestBroker::start_with(|c| {
        c.max_handshakes = 64;
        c.max_sessions = 256;
    })
    .await;
    let (_fe, _) = b.editor(&["/flood"]).await;
    let cand = compat_entry(&b.dir.path().join("compat"), "/flood").await;
    let mut worker = Agent::open(&b.socket, "/flood", None).await;
    worker.attached().await;
    let open_fds = || door_fds("self", cand.port, &b.socket);
    let baseline = open_fds();
    let mut tcp = Vec::new();
    let mut unix = Vec::new();
    for i in 0..5000 {
        if let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", cand.port)).await {
            tcp.push(s);
        }
        if let Ok(s) = tokio::net::UnixStream::connect(&b.socket).await {
            unix.push(s);
        }
        if i % 1000 == 999 {
            let r = worker.call("echo", json!({"i": i})).await;
            assert!(r.get("result").is_some(), "the real session stalled: {r}");
        }
    }
    let peak = open_fds();
    eprintln!(
        "broker-side fds on its doors: baseline {baseline}, with {} idle clients {peak}",
        tcp.len() + unix.len()
    );
    // The broker side keeps at most the handshake caps (64 per door, one fd each) open, not
    // one per client (~10,000).
    assert!(tcp.len() + unix.len() > 9000, "the flood did not happen");
    assert!(peak <= baseline + 2 * 64, "peak {peak}");
    // Flooding the compat port (any local user can) does not lock the owner out of the socket.
    drop(unix);
    let mut late = Agent::open(&b.socket, "/flood", None).await;
    late.attached().await;
    late.close().await;
    drop(tcp);
    // Counted off the runtime's thread: with 10,000 sockets open a count reads /proc for half
    // a second, and the broker under test shares this test's one thread.
    let dropped = std::time::Instant::now();
    pi_ide_broker::testkit::within("fds back to the baseline", async {
        loop {
            let (port, socket) = (cand.port, b.socket.clone());
            let now = tokio::task::spawn_blocking(move || door_fds("self", port, &socket))
                .await
                .expect("the count of fds");
            if now <= baseline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await;
    eprintln!(
        "back to the baseline {:?} after the clients went",
        dropped.elapsed()
    );
    let r = worker.call("echo", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    b.stop().await;
}

/// Writes `request` with an `initialize` frame right behind it, in one write, and reads until
/// the answer to that `initialize` comes: a client may pipeline its first frame, and the door
/// has read those bytes by the time the session takes the socket over.
async fn pipelined_initialize<S>(s: &mut S, request: &str) -> Vec<u8>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    let mut bytes = request.as_bytes().to_vec();
    bytes.extend(masked_frame(
        0x81,
        br#"{"jsonrpc":"2.0","id":"piped","method":"initialize","params":{}}"#,
    ));
    s.write_all(&bytes).await.unwrap();
    let mut seen = Vec::new();
    within("the answer to the piped initialize", async {
        while !(String::from_utf8_lossy(&seen).contains(r#""piped""#)
            && String::from_utf8_lossy(&seen).contains("protocolVersion"))
        {
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    seen
}

#[tokio::test]
async fn a_first_frame_sent_with_the_upgrade_request_is_not_lost() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/pipe"]).await;
    const UPGRADE: &str = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n";
    let mut s = tokio::net::UnixStream::connect(&b.socket).await.unwrap();
    let native = format!("GET /v1/session?cwd=/pipe HTTP/1.1\r\nHost: localhost\r\n{UPGRADE}\r\n");
    let seen = pipelined_initialize(&mut s, &native).await;
    assert!(seen.starts_with(b"HTTP/1.1 101"));
    // The compat door, over TCP with the virtual lockfile's token.
    let compat = compat_entry(&b.dir.path().join("compat"), "/pipe").await;
    let mut t = tokio::net::TcpStream::connect(("127.0.0.1", compat.port))
        .await
        .unwrap();
    let request = format!(
        "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n{UPGRADE}x-pi-ide-authorization: {}\r\n\r\n",
        compat.token
    );
    let seen = pipelined_initialize(&mut t, &request).await;
    assert!(seen.starts_with(b"HTTP/1.1 101"));
    // Not a GET: refused before any upgrade.
    let mut t = tokio::net::TcpStream::connect(("127.0.0.1", compat.port))
        .await
        .unwrap();
    let post = request.replacen("GET", "POST", 1);
    t.write_all(post.as_bytes()).await.unwrap();
    let mut answer = [0u8; 12];
    within(
        "the refusal",
        tokio::io::AsyncReadExt::read_exact(&mut t, &mut answer),
    )
    .await
    .unwrap();
    assert_eq!(&answer, b"HTTP/1.1 400");
    b.stop().await;
}

/// Another process (a local user) holds 5,000 idle connections to a compat port and 1,000 to
/// the socket, reopening each one the broker closes: handshake places go to the newest
/// connection, so a real client's millisecond handshake gets through every time within 1 s,
/// and the broker's fds stay within the caps (64 places per door) + 64. The broker is a
/// daemon process of its own, as a user runs it: the flood, the clients and the broker do not
/// share a runtime. (CI once saw a try take over 1 s: the accept queue, 1,024 deep then, was
/// full, and a new client's SYN waited for TCP's 1 s retransmission; the kernel now holds the
/// flood's silent connections for 30 s and the queue is as deep as it allows.)
#[tokio::test]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc")]
async fn a_flood_that_reopens_its_connections_never_holds_out_a_new_client() {
    // Its 1 s bound measures the broker, not a release build or a browser beside it.
    let _heavy = crate::common::machine_heavy().await;
    use crate::common::process::{start_daemon_logging, start_editor, write_config};
    use tokio::io::{AsyncBufReadExt, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cfg = write_config(root, "max_handshakes = 64\nmax_sessions = 256\n");
    let mut daemon = start_daemon_logging(&cfg, Some("info")).await;
    let pid = daemon.child.id().expect("daemon pid").to_string();
    let socket = root.join("run/sock");
    let (_editor, port) = start_editor(&root.join("pi-ide"), &["--folder", "/flooded"]).await;
    daemon
        .wait_line(&["editor ready", &format!("port={port}")])
        .await;
    let cand = compat_entry(&root.join("compat"), "/flooded").await;
    let baseline = door_fds(&pid, cand.port, &socket);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/suite/common/flood.py");
    let mut flood = tokio::process::Command::new("python3")
        .arg(script)
        .arg(cand.port.to_string())
        .arg("5000")
        .arg(&socket)
        .arg("1000")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs (CI installs it)");
    let mut out = BufReader::new(flood.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(std::time::Duration::from_secs(60), out.next_line())
        .await
        .expect("the flood opened its connections within 60 s")
        .unwrap()
        .unwrap_or_default();
    assert!(ready.starts_with("ready"), "{ready}");
    let mut slowest = [std::time::Duration::ZERO; 2];
    let mut peak = 0;
    for i in 0..10 {
        let started = std::time::Instant::now();
        let bound = std::time::Duration::from_secs(1);
        let compat = tokio::time::timeout(bound, async {
            let mut c = PiClient::connect(&cand).await?;
            c.call("initialize", json!({})).await
        })
        .await;
        assert!(
            matches!(compat, Ok(Ok(_))),
            "try {i}: a new compat client did not get through: {compat:?}"
        );
        slowest[0] = slowest[0].max(started.elapsed());
        let started = std::time::Instant::now();
        let native = tokio::time::timeout(bound, async {
            let mut a = Agent::connect(&socket, "cwd=/flooded").await?;
            Ok::<_, String>(a.request(json!(i), "initialize", json!({})).await)
        })
        .await;
        assert!(
            matches!(&native, Ok(Ok(r)) if r.get("result").is_some()),
            "try {i}: a new native session did not get through: {native:?}"
        );
        slowest[1] = slowest[1].max(started.elapsed());
        peak = peak.max(door_fds(&pid, cand.port, &socket));
    }
    drop(flood.stdin.take());
    let reopened = within("the flood to stop", out.next_line())
        .await
        .unwrap()
        .unwrap_or_default();
    eprintln!(
        "slowest try: compat {:?}, native {:?}; broker door fds {baseline} -> peak {peak}; flood {reopened}",
        slowest[0], slowest[1]
    );
    // The broker side holds the pending places (64 per door, one fd each) and the sessions,
    // never one fd per flooding connection.
    assert!(peak <= baseline + 2 * 64 + 64, "peak {peak} over the caps");
    let _ = within("the flood to exit", flood.wait()).await;
    daemon.signal(rustix::process::Signal::TERM);
    assert!(daemon.wait_exit().await.success());
}

/// The compat door's listeners are on loopback only: its port is open to this machine's users,
/// never to the network (the kernel's own table of listening sockets says where it is bound).
#[tokio::test]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc/net")]
async fn compat_listeners_listen_on_loopback_only() {
    let b = TestBroker::start().await;
    let (_fe, _) = b.editor(&["/loop"]).await;
    let cand = compat_entry(&b.dir.path().join("compat"), "/loop").await;
    let port = format!("{:04X}", cand.port);
    // Column 1: local address:port; column 3: state (0A = LISTEN).
    let bound: Vec<String> = tcp_sockets()
        .into_iter()
        .filter(|cols| {
            cols.get(3).is_some_and(|s| s == "0A")
                && cols
                    .get(1)
                    .is_some_and(|a| a.ends_with(&format!(":{port}")))
        })
        .map(|cols| cols[1].clone())
        .collect();
    assert_eq!(
        bound,
        vec![format!("0100007F:{port}")],
        "the compat port listens on 127.0.0.1 alone"
    );
    b.stop().await;
}

/// The broker dials editors on loopback alone, whatever a lockfile says of a host: an editor
/// listening on every interface, whose lockfile names this machine's outward address (as a
/// hostile or confused writer might), sees the broker's connection come from 127.0.0.1.
#[tokio::test]
async fn editor_links_dial_loopback_only() {
    let b = TestBroker::start().await;
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    // An address of this machine's that is not loopback, if it has one (the route out).
    let outward = std::net::UdpSocket::bind("0.0.0.0:0")
        .and_then(|u| u.connect("192.0.2.1:9").map(|_| u))
        .and_then(|u| u.local_addr())
        .map(|a| a.ip().to_string())
        .unwrap_or_else(|_| "0.0.0.0".into());
    std::fs::write(
        b.pi_dir.join(format!("{port}.lock")),
        json!({
            "pid": std::process::id(), "authToken": "0123456789abcdef", "ideName": "Hostile",
            "workspaceFolders": ["/dial"], "transport": "ws",
            "host": outward, "url": format!("ws://{outward}:{port}"),
        })
        .to_string(),
    )
    .unwrap();
    let (_conn, peer) = within("the broker's dial", listener.accept())
        .await
        .unwrap();
    assert!(
        peer.ip().is_loopback(),
        "the broker dialled from {peer} (the lockfile named {outward})"
    );
    b.stop().await;
}
