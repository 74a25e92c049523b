//! WebSocket conformance in both of the broker's roles, modelled on Autobahn|Testsuite's
//! sections 1–7 and 9 (Autobahn itself needs Python 2.7, which these machines lack). Each case
//! names the Autobahn case it mirrors, sends raw bytes and checks what the broker owes:
//! an answer, a pong, or a close frame with the right code followed by the end of the
//! connection.
//!
//! - As a server: the native door, a session upgraded by hand on the Unix socket.
//! - As a client: the editor link, dialled by the broker into a crafted editor written here
//!   that answers the MCP handshake and then sends the case's frames.
//!
//! Policy for binary messages (Autobahn 1.2.x): the broker's peers speak JSON-RPC in text
//! frames; a binary message holding UTF-8 JSON is taken as text, one that is not UTF-8 gets a
//! JSON-RPC parse error (the session stays up). RFC 6455 leaves binary handling to the
//! application; refusing with 1003 would cut a client that sends its JSON as binary.

use crate::common::*;
use pi_ide_broker::testkit::within;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A frame as the broker sent it.
#[derive(Debug, PartialEq)]
enum Got {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>),
    /// The connection ended.
    End,
}

/// Raw frames over a stream: we write masked frames (a client) or unmasked ones (a server),
/// and read the broker's side as it comes.
struct Raw<S> {
    io: S,
    buf: Vec<u8>,
    /// We mask what we send (we play the client).
    mask: bool,
    /// The broker must mask what it sends (it is the client: §5.1), or must not.
    broker_masks: bool,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    async fn send(&mut self, bytes: &[u8]) {
        // A peer that already closed may refuse the rest: what it sent back is what counts.
        let _ = self.io.write_all(bytes).await;
    }

    /// One frame with FIN/RSV/opcode byte `b0` and `payload`, masked when we are the client.
    fn frame(&self, b0: u8, payload: &[u8]) -> Vec<u8> {
        let mask_bit = if self.mask { 0x80 } else { 0 };
        let mut f = vec![b0];
        match payload.len() {
            n if n < 126 => f.push(mask_bit | n as u8),
            n if n <= 0xffff => {
                f.push(mask_bit | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(mask_bit | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        if self.mask {
            let key = [0x37, 0xfa, 0x21, 0x3d];
            f.extend_from_slice(&key);
            f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        } else {
            f.extend_from_slice(payload);
        }
        f
    }

    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            self.buf.reserve(65536);
            match self.io.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        true
    }

    /// The broker's next frame (unmasking it if it masked it), or `End`.
    async fn next(&mut self) -> Got {
        if !self.fill(2).await {
            return Got::End;
        }
        let (b0, b1) = (self.buf[0], self.buf[1]);
        let mut at = 2;
        let mut len = u64::from(b1 & 0x7f);
        if len == 126 {
            if !self.fill(4).await {
                return Got::End;
            }
            len = u64::from(u16::from_be_bytes([self.buf[2], self.buf[3]]));
            at = 4;
        } else if len == 127 {
            if !self.fill(10).await {
                return Got::End;
            }
            let mut b = [0u8; 8];
            b.copy_from_slice(&self.buf[2..10]);
            len = u64::from_be_bytes(b);
            at = 10;
        }
        assert_eq!(
            b1 & 0x80 != 0,
            self.broker_masks,
            "a client masks every frame, a server none (RFC 6455 §5.1)"
        );
        let key = if b1 & 0x80 != 0 {
            if !self.fill(at + 4).await {
                return Got::End;
            }
            let k = [
                self.buf[at],
                self.buf[at + 1],
                self.buf[at + 2],
                self.buf[at + 3],
            ];
            at += 4;
            Some(k)
        } else {
            None
        };
        let end = at + len as usize;
        if !self.fill(end).await {
            return Got::End;
        }
        let mut payload: Vec<u8> = self.buf[at..end].to_vec();
        if let Some(k) = key {
            for (i, b) in payload.iter_mut().enumerate() {
                *b ^= k[i % 4];
            }
        }
        self.buf.drain(..end);
        match b0 & 0x0f {
            1 => Got::Text(String::from_utf8_lossy(&payload).into_owned()),
            2 => Got::Binary(payload),
            9 => Got::Ping(payload),
            10 => Got::Pong(payload),
            8 => Got::Close(
                (payload.len() >= 2).then(|| u16::from_be_bytes([payload[0], payload[1]])),
            ),
            op => panic!("the broker sent opcode {op}"),
        }
    }

    /// The HTTP head before the frames (the upgrade request or its answer), taken off the
    /// buffer; what follows it stays for the frames.
    async fn http_head(&mut self, what: &str) -> String {
        within(what, async {
            let end = loop {
                if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                assert!(
                    self.fill(self.buf.len() + 1).await,
                    "closed during the upgrade"
                );
            };
            let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
            self.buf.drain(..end);
            head
        })
        .await
    }

    /// Frames until one that `want` accepts; the broker's notices and the like are skipped.
    async fn until(&mut self, what: &str, mut want: impl FnMut(&Got) -> bool) -> Got {
        within(what, async {
            loop {
                let g = self.next().await;
                if want(&g) || g == Got::End {
                    return g;
                }
            }
        })
        .await
    }
}

/// What a case expects of the broker.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// An answer to JSON-RPC id `n`.
    Answer(u64),
    /// A pong with the payload of the case's ping.
    Pong(&'static [u8]),
    /// A close frame with this code, then the end of the connection.
    Close(u16),
}

/// A JSON-RPC request with id `n` and `pad` bytes of padding.
fn request(n: u64, pad: usize) -> Vec<u8> {
    json!({"jsonrpc": "2.0", "id": n, "method": "ping", "params": {"pad": "x".repeat(pad)}})
        .to_string()
        .into_bytes()
}

/// Checks that the broker does what `expect` says after the case's bytes.
async fn check<S: AsyncRead + AsyncWrite + Unpin>(case: &str, raw: &mut Raw<S>, expect: Expect) {
    match expect {
        Expect::Answer(n) => {
            let g = raw
                .until(case, |g| {
                    matches!(g, Got::Text(t) if serde_json::from_str::<Value>(t)
                        .is_ok_and(|v| v["id"] == n))
                })
                .await;
            assert!(matches!(g, Got::Text(_)), "{case}: no answer to {n}: {g:?}");
        }
        Expect::Pong(p) => {
            let g = raw.until(case, |g| matches!(g, Got::Pong(_))).await;
            assert_eq!(g, Got::Pong(p.to_vec()), "{case}");
        }
        Expect::Close(code) => {
            let g = raw.until(case, |g| matches!(g, Got::Close(_))).await;
            assert_eq!(g, Got::Close(Some(code)), "{case}");
            let end = raw.until(case, |g| *g == Got::End).await;
            assert_eq!(
                end,
                Got::End,
                "{case}: the connection must end after the close"
            );
        }
    }
}

/// One case: the Autobahn case it mirrors, the frames sent as (first byte, payload), and what
/// the broker owes.
type Case = (&'static str, Vec<(u8, Vec<u8>)>, Expect);

/// The server-role cases.
fn server_cases() -> Vec<Case> {
    let text = |n: u64, pad: usize| (0x81u8, request(n, pad));
    let utf8 =
        "{\"jsonrpc\":\"2.0\",\"id\":61,\"method\":\"ping\",\"params\":{\"s\":\"κόσμε é€😀\"}}";
    let split = utf8.as_bytes();
    let cut = split.iter().position(|b| *b == 0xf0).unwrap_or(10) + 2; // inside the emoji
    let close = |code: u16| (0x88u8, code.to_be_bytes().to_vec());
    vec![
        // 1.1.x: text messages in each length class (7-bit, 16-bit, 64-bit lengths).
        ("1.1.1", vec![text(11, 0)], Expect::Answer(11)),
        ("1.1.4", vec![text(14, 200)], Expect::Answer(14)),
        ("1.1.6", vec![text(16, 70_000)], Expect::Answer(16)),
        // 1.2.x: a binary message holding JSON is taken as text (the policy above).
        ("1.2.1", vec![(0x82, request(12, 0))], Expect::Answer(12)),
        // 2.x: pings and pongs.
        ("2.1", vec![(0x89, vec![])], Expect::Pong(b"")),
        (
            "2.2",
            vec![(0x89, b"Hello, world!".to_vec())],
            Expect::Pong(b"Hello, world!"),
        ),
        (
            "2.3",
            vec![(0x89, vec![0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb])],
            Expect::Pong(&[0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb]),
        ),
        (
            "2.4",
            vec![(0x89, vec![b'*'; 125])],
            Expect::Pong(&[b'*'; 125]),
        ),
        ("2.5", vec![(0x89, vec![b'*'; 126])], Expect::Close(1002)),
        (
            "2.6 (unsolicited pong)",
            vec![(0x8a, b"unasked".to_vec()), text(26, 0)],
            Expect::Answer(26),
        ),
        // 3.x: reserved bits without an extension.
        ("3.1", vec![(0xc1, request(31, 0))], Expect::Close(1002)),
        (
            "3.2",
            vec![text(32, 0), (0xa1, request(33, 0))],
            Expect::Close(1002),
        ),
        ("3.5", vec![(0xf2, vec![1, 2, 3])], Expect::Close(1002)),
        ("3.6", vec![(0xd9, b"ping".to_vec())], Expect::Close(1002)),
        // 4.x: reserved opcodes.
        ("4.1.1", vec![(0x83, vec![])], Expect::Close(1002)),
        ("4.1.5", vec![(0x87, b"x".to_vec())], Expect::Close(1002)),
        ("4.2.1", vec![(0x8b, vec![])], Expect::Close(1002)),
        ("4.2.5", vec![(0x8f, b"x".to_vec())], Expect::Close(1002)),
        // 5.x: fragmentation.
        (
            "5.1",
            vec![(0x09, b"a".to_vec()), (0x80, b"b".to_vec())],
            Expect::Close(1002),
        ),
        (
            "5.3",
            vec![
                (0x01, request(53, 0)[..10].to_vec()),
                (0x80, request(53, 0)[10..].to_vec()),
            ],
            Expect::Answer(53),
        ),
        (
            "5.6",
            vec![
                (0x01, request(56, 0)[..10].to_vec()),
                (0x89, b"mid".to_vec()),
                (0x80, request(56, 0)[10..].to_vec()),
            ],
            Expect::Pong(b"mid"),
        ),
        (
            "5.6 (then the answer)",
            vec![
                (0x01, request(57, 0)[..10].to_vec()),
                (0x89, b"mid".to_vec()),
                (0x80, request(57, 0)[10..].to_vec()),
            ],
            Expect::Answer(57),
        ),
        ("5.9", vec![(0x80, b"orphan".to_vec())], Expect::Close(1002)),
        (
            "5.15",
            vec![(0x01, b"{\"a\":".to_vec()), (0x01, b"1}".to_vec())],
            Expect::Close(1002),
        ),
        // 6.x: UTF-8.
        ("6.2.1", vec![(0x81, split.to_vec())], Expect::Answer(61)),
        (
            "6.2.3 (cut inside a character)",
            vec![(0x01, split[..cut].to_vec()), (0x80, split[cut..].to_vec())],
            Expect::Answer(61),
        ),
        (
            "6.3.1",
            vec![(
                0x81,
                b"\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80\x65\x64\x69\x74\x65\x64"
                    .to_vec(),
            )],
            Expect::Close(1007),
        ),
        (
            "6.4.1 (unfinished message)",
            vec![(0x01, b"{\"ok\":\"\xff".to_vec())],
            Expect::Close(1007),
        ),
        (
            "6.4.2 (bad in a later fragment)",
            vec![(0x01, b"{\"ok\":\"".to_vec()), (0x00, b"\xc0\xaf".to_vec())],
            Expect::Close(1007),
        ),
        (
            "6.21.x (a surrogate)",
            vec![(0x81, b"\"\xed\xa0\x80\"".to_vec())],
            Expect::Close(1007),
        ),
        // 7.x: the closing handshake and close codes.
        ("7.1.1", vec![close(1000)], Expect::Close(1000)),
        (
            "7.3.1 (empty close)",
            vec![(0x88, vec![])],
            Expect::Close(1000),
        ),
        (
            "7.3.2 (1-byte close)",
            vec![(0x88, vec![3])],
            Expect::Close(1002),
        ),
        (
            "7.5.1 (reason not UTF-8)",
            vec![(0x88, vec![0x03, 0xe8, 0xce, 0xba, 0xe1, 0xbd])],
            Expect::Close(1007),
        ),
        ("7.7.1", vec![close(1000)], Expect::Close(1000)),
        ("7.7.5", vec![close(1003)], Expect::Close(1003)),
        ("7.7.11", vec![close(3000)], Expect::Close(3000)),
        ("7.7.13", vec![close(4999)], Expect::Close(4999)),
        ("7.9.1", vec![close(0)], Expect::Close(1002)),
        ("7.9.2", vec![close(999)], Expect::Close(1002)),
        ("7.9.3", vec![close(1004)], Expect::Close(1002)),
        ("7.9.4", vec![close(1005)], Expect::Close(1002)),
        ("7.9.5", vec![close(1006)], Expect::Close(1002)),
        ("7.9.9", vec![close(1015)], Expect::Close(1002)),
        ("7.9.10", vec![close(1016)], Expect::Close(1002)),
        ("7.9.12", vec![close(2999)], Expect::Close(1002)),
        ("7.9.13", vec![close(5000)], Expect::Close(1002)),
        ("7.9.x (65535)", vec![close(65535)], Expect::Close(1002)),
        (
            "7.13.1 (nothing after close)",
            vec![close(1000), text(713, 0)],
            Expect::Close(1000),
        ),
        // 9.x: limits (max_frame_bytes is 1 MiB here).
        (
            "9.1.1 (64 KiB)",
            vec![text(91, 64 << 10)],
            Expect::Answer(91),
        ),
        (
            "9.1.3 (over the cap)",
            vec![text(93, 2 << 20)],
            Expect::Close(1009),
        ),
        (
            "9.2.x (fragments over the cap)",
            vec![(0x01, vec![b' '; 600 << 10]), (0x80, vec![b' '; 600 << 10])],
            Expect::Close(1009),
        ),
    ]
}

/// A session on the native door upgraded by hand, past its `initialize`.
async fn raw_session(b: &TestBroker) -> Raw<tokio::net::UnixStream> {
    let mut io = tokio::net::UnixStream::connect(&b.socket).await.unwrap();
    io.write_all(
        b"GET /v1/session?cwd=/conformance HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
          Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Sec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut raw = Raw {
        io,
        buf: Vec::new(),
        mask: true,
        broker_masks: false,
    };
    let head = raw.http_head("the upgrade").await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let init = br#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{}}"#;
    let f = raw.frame(0x81, init);
    raw.send(&f).await;
    let g = raw
        .until(
            "the initialize answer",
            |g| matches!(g, Got::Text(t) if t.contains("\"init\"")),
        )
        .await;
    assert!(matches!(g, Got::Text(_)), "{g:?}");
    raw
}

#[tokio::test]
async fn the_native_door_follows_rfc_6455_case_by_case() {
    let b = TestBroker::start_with(|c| c.max_frame_bytes = 1 << 20).await;
    let (_fe, _) = b.editor(&["/conformance"]).await;
    let cases = server_cases();
    let mut by_section = std::collections::BTreeMap::<&str, usize>::new();
    for (case, frames, expect) in &cases {
        let mut raw = raw_session(&b).await;
        for (b0, payload) in frames {
            let f = raw.frame(*b0, payload);
            raw.send(&f).await;
        }
        check(case, &mut raw, *expect).await;
        *by_section
            .entry(case.split('.').next().unwrap_or("?"))
            .or_default() += 1;
    }
    eprintln!("server-role cases by Autobahn section: {by_section:?}");
    // Whatever the cases did, the door and the editor still serve a new session.
    let mut a = Agent::open(&b.socket, "/conformance", None).await;
    let r = a.call("echo", json!({})).await;
    assert!(r.get("result").is_some(), "{r}");
    b.stop().await;
}

/// A crafted editor: answers the broker's dial and MCP handshake, then hands the raw link to
/// the test.
async fn crafted_editor(
    b: &TestBroker,
    folder: &str,
) -> (Raw<tokio::net::TcpStream>, std::path::PathBuf) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let lock = b.pi_dir.join(format!("{port}.lock"));
    std::fs::write(
        &lock,
        json!({"pid": std::process::id(), "workspaceFolders": [folder], "ideName": "Crafted",
               "transport": "ws", "authToken": "0123456789abcdef"})
        .to_string(),
    )
    .unwrap();
    let (io, _) = within("the broker's dial", listener.accept())
        .await
        .unwrap();
    let mut raw = Raw {
        io,
        buf: Vec::new(),
        mask: false,
        broker_masks: true,
    };
    let head = raw.http_head("the upgrade request").await;
    let key = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("sec-websocket-key:")
                .then(|| l[18..].trim().to_string())
        })
        .expect("a Sec-WebSocket-Key");
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    raw.send(
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    // The MCP handshake: answer initialize and tools/list.
    for _ in 0..3 {
        let g = raw
            .until("the broker's handshake", |g| matches!(g, Got::Text(_)))
            .await;
        let Got::Text(t) = g else {
            panic!("the broker left: {g:?}")
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        let result = match v["method"].as_str() {
            Some("initialize") => {
                json!({"protocolVersion": "2024-11-05", "capabilities": {"tools": {}}, "serverInfo": {"name": "crafted"}})
            }
            Some("tools/list") => json!({"tools": []}),
            _ => continue,
        };
        let answer = json!({"jsonrpc": "2.0", "id": v["id"], "result": result}).to_string();
        let f = raw.frame(0x81, answer.as_bytes());
        raw.send(&f).await;
        if v["method"] == "tools/list" {
            break;
        }
    }
    b.wait_editor(port, "ready").await;
    (raw, lock)
}

#[tokio::test]
async fn the_editor_link_follows_rfc_6455_case_by_case() {
    let b = TestBroker::start_with(|c| {
        c.max_frame_bytes = 1 << 20;
        // A crafted editor that is cut is not redialled into the next case's listener.
        c.backoff.initial_ms = 60_000;
    })
    .await;
    let close = |code: u16| (0x88u8, code.to_be_bytes().to_vec());
    let cases: Vec<Case> = vec![
        (
            "2.2 (the editor pings)",
            vec![(0x89, b"Hello".to_vec())],
            Expect::Pong(b"Hello"),
        ),
        (
            "3.1 (reserved bit)",
            vec![(0xc1, b"{}".to_vec())],
            Expect::Close(1002),
        ),
        (
            "4.1.1 (reserved opcode)",
            vec![(0x83, vec![])],
            Expect::Close(1002),
        ),
        (
            "5.9 (orphan continuation)",
            vec![(0x80, b"x".to_vec())],
            Expect::Close(1002),
        ),
        (
            "6.3.1 (not UTF-8)",
            vec![(0x81, b"\"\xed\xa0\x80\"".to_vec())],
            Expect::Close(1007),
        ),
        (
            "6.4.1 (unfinished, bad first fragment)",
            vec![(0x01, b"{\"\xff".to_vec())],
            Expect::Close(1007),
        ),
        (
            "7.1.1 (the editor closes: echoed)",
            vec![close(1000)],
            Expect::Close(1000),
        ),
        (
            "7.7.13 (its code echoed)",
            vec![close(4001)],
            Expect::Close(4001),
        ),
        (
            "7.9.1 (a code not for the wire)",
            vec![close(1005)],
            Expect::Close(1002),
        ),
        (
            "9.1.3 (over the cap)",
            vec![(0x81, vec![b' '; 2 << 20])],
            Expect::Close(1009),
        ),
    ];
    for (i, (case, frames, expect)) in cases.iter().enumerate() {
        let (mut raw, lock) = crafted_editor(&b, &format!("/crafted/{i}")).await;
        for (b0, payload) in frames {
            let f = raw.frame(*b0, payload);
            raw.send(&f).await;
        }
        check(case, &mut raw, *expect).await;
        let _ = std::fs::remove_file(lock);
    }
    // A server that masks its frames breaks the rules too (§5.1): the link refuses it.
    let (mut raw, _lock) = crafted_editor(&b, "/crafted/masked").await;
    raw.mask = true;
    let f = raw.frame(0x81, b"{}");
    raw.send(&f).await;
    check(
        "5.1 (a masked frame from the server)",
        &mut raw,
        Expect::Close(1002),
    )
    .await;
    eprintln!("client-role cases: {}", cases.len() + 1);
    b.stop().await;
}
