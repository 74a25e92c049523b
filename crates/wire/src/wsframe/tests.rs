use super::*;
use futures_util::{Sink, SinkExt, StreamExt};
use proptest::prelude::*;
use std::collections::VecDeque;
use tokio::io::{AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::{self as tproto, frame::coding::CloseCode};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// Runs a test body, failing it when it hangs.
async fn bounded<F: std::future::Future<Output = ()>>(body: F) {
    tokio::time::timeout(std::time::Duration::from_secs(20), body)
        .await
        .expect("the test hung");
}

/// A socket that hands out the given pieces, one per read, then the end of the stream.
struct Pieces(VecDeque<Vec<u8>>);

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(mut p) = self.0.pop_front() {
            let n = p.len().min(buf.remaining());
            buf.put_slice(&p[..n]);
            if n < p.len() {
                self.0.push_front(p.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// What a frame owns, to compare frames read at different times.
#[derive(Debug, PartialEq, Eq)]
enum Owned {
    Text(String),
    Binary(Vec<u8>),
    Ping(Vec<u8>),
    Pong(Vec<u8>),
    Close(Option<u16>),
}

fn owned(f: Frame<'_>) -> Owned {
    match f {
        Frame::Text(t) => Owned::Text(t.to_owned()),
        Frame::Binary(b) => Owned::Binary(b.to_vec()),
        Frame::Ping(p) => Owned::Ping(p.to_vec()),
        Frame::Pong(p) => Owned::Pong(p.to_vec()),
        Frame::Close(c) => Owned::Close(c),
    }
}

/// Every frame until the end of the stream, or the error that ended it.
async fn read_all<R: AsyncRead + Unpin>(r: &mut FrameReader<R>) -> Result<Vec<Owned>, Error> {
    let mut out = Vec::new();
    while let Some(f) = r.next().await? {
        out.push(owned(f));
    }
    Ok(out)
}

/// `frames` encoded by a writer in `role`.
async fn encoded(role: Role, frames: Vec<Out>) -> Vec<u8> {
    let mut w = FrameWriter::new(Vec::new(), role);
    for f in frames {
        w.feed(f).await.unwrap();
    }
    w.flush().await.unwrap();
    w.io
}

/// A raw frame as a client sends it: FIN and opcode in `b0`, masked with a fixed key.
fn client_frame(b0: u8, payload: &[u8]) -> Vec<u8> {
    let key = [9, 8, 7, 6];
    let mut f = vec![b0];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&key);
    let start = f.len();
    f.extend_from_slice(payload);
    for (i, b) in f[start..].iter_mut().enumerate() {
        *b ^= key[i % 4];
    }
    f
}

fn server_reader(bytes: Vec<u8>) -> FrameReader<Pieces> {
    FrameReader::new(Pieces(VecDeque::from([bytes])), Role::Server, 1 << 20, &[])
}

#[tokio::test]
async fn frames_of_every_length_class_survive_a_round_trip() {
    bounded(async {
        let lens = [0usize, 1, 7, 8, 125, 126, 127, 65_535, 65_536, 200_000];
        let mut frames: Vec<Out> = lens
            .iter()
            .map(|&n| Out::Text("é".repeat(n / 2) + &"x".repeat(n % 2)))
            .collect();
        frames.push(Out::Ping(b"p".to_vec()));
        frames.push(Out::Pong(vec![1; 125]));
        frames.push(Out::Close(4000));
        let bytes = encoded(Role::Client, frames.clone()).await;
        // Read back in pieces of 1000 bytes: frames straddle reads.
        let pieces = bytes.chunks(1000).map(<[u8]>::to_vec).collect();
        let mut r = FrameReader::new(Pieces(pieces), Role::Server, 1 << 20, &[]);
        let got = read_all(&mut r).await.unwrap();
        let want: Vec<Owned> = frames
            .into_iter()
            .map(|f| match f {
                Out::Text(t) => Owned::Text(t),
                Out::Ping(p) => Owned::Ping(p),
                Out::Pong(p) => Owned::Pong(p),
                Out::Close(c) => Owned::Close(Some(c)),
            })
            .collect();
        assert_eq!(got, want);
        // The long frames grew the buffer; once they are read it is back to its first size.
        assert_eq!(r.buf.capacity(), READ_CHUNK);
    })
    .await;
}

/// A socket that takes at most 5 bytes per write, wherever they fall across the slices, and
/// is not ready every other time.
#[derive(Default)]
struct Trickle {
    got: Vec<u8>,
    turn: bool,
}

impl AsyncWrite for Trickle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.turn = !self.turn;
        if self.turn {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let mut room = 5;
        for b in bufs {
            let n = b.len().min(room);
            self.got.extend_from_slice(&b[..n]);
            room -= n;
        }
        Poll::Ready(Ok(5 - room))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[tokio::test]
async fn frames_written_a_few_bytes_at_a_time_arrive_whole() {
    bounded(async {
        let mut w = FrameWriter::new(Trickle::default(), Role::Client);
        let texts = ["", "a", "hello there", &"x".repeat(300)];
        for t in texts {
            w.feed(Out::Text(t.to_string())).await.unwrap();
        }
        w.feed(Out::Ping(vec![1, 2, 3])).await.unwrap();
        w.flush().await.unwrap();
        assert_eq!(w.queued, 0);
        assert!(w.queue.is_empty());
        let bytes = w.into_inner().got;
        let mut want: Vec<Owned> = texts.iter().map(|t| Owned::Text(t.to_string())).collect();
        want.push(Owned::Ping(vec![1, 2, 3]));
        assert_eq!(read_all(&mut server_reader(bytes)).await.unwrap(), want);
    })
    .await;
}

#[tokio::test]
async fn a_frame_from_parts_is_written_whole_and_nothing_may_follow_a_close() {
    use crate::shared_writer::{PartsWritten, WriteParts};
    let waker = futures_util::task::noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut w = FrameWriter::new(Vec::new(), Role::Server);
    assert_eq!(
        w.write_parts(&mut cx, &["{\"id\":", "7", ",\"result\":{}}"]),
        Ok(PartsWritten::Done)
    );
    assert!(w.queue.is_empty() && w.queued == 0, "nothing kept");
    w.send(Out::Close(1000)).await.unwrap();
    assert!(
        w.write_parts(&mut cx, &["late"]).is_err(),
        "nothing after the close"
    );
    let bytes = w.into_inner();
    let mut r = FrameReader::new(Pieces(VecDeque::from([bytes])), Role::Client, 1 << 20, &[]);
    assert_eq!(
        read_all(&mut r).await.unwrap(),
        vec![
            Owned::Text("{\"id\":7,\"result\":{}}".into()),
            Owned::Close(Some(1000))
        ]
    );
}

#[tokio::test]
async fn frames_from_parts_arrive_whole_and_in_order_however_the_socket_takes_them() {
    use crate::shared_writer::{PartsWritten, WriteParts};
    bounded(async {
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut w = FrameWriter::new(Trickle::default(), Role::Server);
        let big = "y".repeat(300);
        let digits: Vec<String> = (0..20).map(|i| i.to_string()).collect();
        let many: Vec<&str> = digits.iter().map(String::as_str).collect();
        // Each frame: its parts, whether it starts on an empty writer, and what the writer
        // does with it. Trickle takes 5 bytes a write, or none: a frame written directly is
        // kept in part. A frame behind those bytes, or in more than MAX_PARTS parts, is
        // declined, and goes through the Sink as `SharedWriter` then sends it.
        let frames: [(Vec<&str>, bool, PartsWritten); 4] = [
            (vec!["{", "\"a\"", ":1}"], true, PartsWritten::Kept),
            (vec![], false, PartsWritten::Declined),
            (many, true, PartsWritten::Declined),
            (vec!["a", big.as_str(), "b"], true, PartsWritten::Kept),
        ];
        let mut want = Vec::new();
        for (i, (parts, fresh, expected)) in frames.into_iter().enumerate() {
            if fresh {
                w.flush().await.unwrap();
                w.io.turn = true;
            }
            let r = w.write_parts(&mut cx, &parts).unwrap();
            assert_eq!(r, expected, "frame {i}");
            if r == PartsWritten::Declined {
                w.feed(Out::Text(parts.concat())).await.unwrap();
            }
            want.push(Owned::Text(parts.concat()));
            if i == 1 {
                w.feed(Out::Ping(vec![7])).await.unwrap();
                want.push(Owned::Ping(vec![7]));
            }
        }
        w.flush().await.unwrap();
        assert_eq!((w.queued, w.queue.len()), (0, 0));
        let bytes = w.into_inner().got;
        let mut r = FrameReader::new(Pieces(VecDeque::from([bytes])), Role::Client, 1 << 20, &[]);
        assert_eq!(read_all(&mut r).await.unwrap(), want);
    })
    .await;
}

#[tokio::test]
async fn a_frame_partly_taken_wakes_its_task_when_the_socket_has_room() {
    use crate::shared_writer::{PartsWritten, WriteParts};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::io::AsyncReadExt;
    struct Flag(AtomicUsize);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    bounded(async {
        let (a, mut b) = tokio::io::duplex(64);
        let flag = Arc::new(Flag(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let mut w = FrameWriter::new(a, Role::Server);
        let big = "z".repeat(1000);
        // The pipe takes 64 bytes at once: the rest is kept, and only the socket can say
        // when to write it.
        assert_eq!(
            w.write_parts(&mut cx, &["[", &big, "]"]),
            Ok(PartsWritten::Kept)
        );
        let mut got = Vec::new();
        while got.len() < 1004 {
            let owed = w.queued > 0;
            let mut chunk = [0u8; 256];
            let n = b.read(&mut chunk).await.unwrap();
            got.extend_from_slice(&chunk[..n]);
            if owed {
                // Draining woke the writer's task, which writes on as the socket asks.
                assert!(
                    flag.0.load(Ordering::SeqCst) > 0,
                    "the writer's task was never woken"
                );
                flag.0.store(0, Ordering::SeqCst);
                let _ = Pin::new(&mut w).poll_flush(&mut cx);
            }
        }
        assert_eq!(w.queued, 0);
        let mut r = FrameReader::new(Pieces(VecDeque::from([got])), Role::Client, 1 << 20, &[]);
        assert_eq!(
            read_all(&mut r).await.unwrap(),
            vec![Owned::Text(format!("[{big}]"))]
        );
    })
    .await;
}

#[tokio::test]
async fn a_server_writes_unmasked_and_a_client_reads_it() {
    bounded(async {
        let bytes = encoded(Role::Server, vec![Out::Text("hi".into())]).await;
        assert_eq!(bytes, b"\x81\x02hi");
        let mut r = FrameReader::new(Pieces(VecDeque::from([bytes])), Role::Client, 64, &[]);
        assert_eq!(
            read_all(&mut r).await.unwrap(),
            vec![Owned::Text("hi".into())]
        );
    })
    .await;
}

#[tokio::test]
async fn a_client_draws_a_fresh_mask_for_every_frame() {
    bounded(async {
        let bytes = encoded(
            Role::Client,
            vec![Out::Text("a".into()), Out::Text("a".into())],
        )
        .await;
        assert_eq!(bytes.len(), 2 * 7);
        assert_eq!(bytes[1], 0x81, "masked, 1 byte");
        assert_ne!(bytes[2..6], bytes[9..13], "two frames with one key");
    })
    .await;
}

#[tokio::test]
async fn bytes_read_past_the_handshake_come_first() {
    bounded(async {
        let first = client_frame(0x81, b"early");
        let rest = client_frame(0x81, b"later");
        let mut r = FrameReader::new(Pieces(VecDeque::from([rest])), Role::Server, 64, &first);
        assert_eq!(
            read_all(&mut r).await.unwrap(),
            vec![Owned::Text("early".into()), Owned::Text("later".into())]
        );
    })
    .await;
}

#[tokio::test]
async fn the_reader_says_whether_more_is_already_read() {
    bounded(async {
        let mut two = client_frame(0x81, b"a");
        two.extend(client_frame(0x81, b"b"));
        let third = client_frame(0x81, b"c");
        let (cut, rest) = third.split_at(3);
        let pieces = VecDeque::from([two, cut.to_vec(), rest.to_vec()]);
        let mut r = FrameReader::new(Pieces(pieces), Role::Server, 64, &[]);
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text("a")));
        assert!(r.more_buffered(), "the second frame came in the same read");
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text("b")));
        assert!(!r.more_buffered(), "drained");
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text("c")));
        assert!(
            !r.more_buffered(),
            "drained after a frame read in two pieces"
        );
    })
    .await;
}

#[tokio::test]
async fn a_fragmented_message_is_put_together_around_a_ping() {
    bounded(async {
        let mut b = client_frame(0x01, b"he"); // text, not FIN
        b.extend(client_frame(0x89, b"!")); // ping in between
        b.extend(client_frame(0x00, b"ll")); // continuation
        b.extend(client_frame(0x80, b"o")); // final continuation
        b.extend(client_frame(0x82, b"\xff")); // a whole binary frame after it
        let got = read_all(&mut server_reader(b)).await.unwrap();
        assert_eq!(
            got,
            vec![
                Owned::Ping(b"!".to_vec()),
                Owned::Text("hello".into()),
                Owned::Binary(vec![0xff]),
            ]
        );
    })
    .await;
}

#[tokio::test]
async fn broken_framing_is_refused_with_its_close_code() {
    bounded(async {
        let unmasked = b"\x81\x02hi".to_vec();
        let reserved = client_frame(0xc1, b"x");
        let long_ping = client_frame(0x89, &[0; 126]);
        let fragmented_ping = client_frame(0x09, b"x");
        let orphan = client_frame(0x80, b"x");
        let mut nested = client_frame(0x01, b"a");
        nested.extend(client_frame(0x81, b"b"));
        let opcode = client_frame(0x83, b"x");
        let not_utf8 = client_frame(0x81, &[0xc3, 0x28]);
        let mut split_utf8 = client_frame(0x01, &[0xc3]);
        split_utf8.extend(client_frame(0x80, &[0xa9]));
        let cases = [
            (unmasked, Some(1002)),
            (reserved, Some(1002)),
            (long_ping, Some(1002)),
            (fragmented_ping, Some(1002)),
            (orphan, Some(1002)),
            (nested, Some(1002)),
            (opcode, Some(1002)),
            (not_utf8, Some(1007)),
            (client_frame(0x88, &[3]), Some(1002)),
        ];
        for (i, (bytes, code)) in cases.into_iter().enumerate() {
            let e = read_all(&mut server_reader(bytes)).await.unwrap_err();
            assert_eq!(e.close_code(), code, "case {i}: {e}");
        }
        // A character split across two fragments is whole once they are put together.
        assert_eq!(
            read_all(&mut server_reader(split_utf8)).await.unwrap(),
            vec![Owned::Text("é".into())]
        );
        // A client reading a masked frame.
        let mut r = FrameReader::new(
            Pieces(VecDeque::from([client_frame(0x81, b"x")])),
            Role::Client,
            64,
            &[],
        );
        assert_eq!(read_all(&mut r).await.unwrap_err().close_code(), Some(1002));
    })
    .await;
}

/// Autobahn 7.7.x and 7.9.x: a close code that may appear on the wire is taken; one that
/// may not (reserved, for reporting only, or out of range) is a protocol error (1002).
#[tokio::test]
async fn close_codes_are_checked_against_those_allowed_on_the_wire() {
    bounded(async {
        for code in [
            1000u16, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 3000, 3999, 4000, 4999,
        ] {
            let bytes = client_frame(0x88, &code.to_be_bytes());
            let frames = read_all(&mut server_reader(bytes)).await;
            assert_eq!(
                frames.unwrap(),
                vec![Owned::Close(Some(code))],
                "code {code}"
            );
        }
        for code in [
            0u16, 999, 1004, 1005, 1006, 1014, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
        ] {
            let bytes = client_frame(0x88, &code.to_be_bytes());
            let e = read_all(&mut server_reader(bytes)).await.unwrap_err();
            assert_eq!(e.close_code(), Some(1002), "code {code}: {e}");
        }
    })
    .await;
}

/// Autobahn 6.4.x: invalid UTF-8 in the first fragment of a message that is not finished is
/// refused (1007) with that fragment, before any more of the message is read; a sequence cut
/// by a fragment boundary is not an error (6.2.x).
#[tokio::test]
async fn invalid_utf8_is_refused_at_the_fragment_that_holds_it() {
    bounded(async {
        // A first fragment with a bad byte, then a socket that never sends the rest.
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(ours, Role::Server, 64 << 20, &[]);
        tokio::io::AsyncWriteExt::write_all(&mut peer, &client_frame(0x01, b"ok \xff so far"))
            .await
            .unwrap();
        let e = r.next().await.map(|f| f.is_some()).unwrap_err();
        assert_eq!(e.close_code(), Some(1007), "{e}");
        // Bad bytes in a later fragment: refused at that fragment as well.
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(ours, Role::Server, 64 << 20, &[]);
        let mut bytes = client_frame(0x01, "é".as_bytes());
        bytes.extend(client_frame(0x00, &[0xc3]));
        bytes.extend(client_frame(0x00, &[0x28]));
        tokio::io::AsyncWriteExt::write_all(&mut peer, &bytes)
            .await
            .unwrap();
        let e = r.next().await.map(|f| f.is_some()).unwrap_err();
        assert_eq!(e.close_code(), Some(1007), "{e}");
        // Every code point cut at every byte boundary across fragments reads whole.
        let text = "aé€😀z";
        let raw = text.as_bytes();
        for cut in 1..raw.len() {
            let mut bytes = client_frame(0x01, &raw[..cut]);
            bytes.extend(client_frame(0x80, &raw[cut..]));
            let frames = read_all(&mut server_reader(bytes)).await;
            assert_eq!(
                frames.unwrap(),
                vec![Owned::Text(text.into())],
                "cut at {cut}"
            );
        }
        // A message that ends in the middle of a sequence is refused when it ends.
        let mut bytes = client_frame(0x01, b"a");
        bytes.extend(client_frame(0x80, &[0xe2, 0x82]));
        let e = read_all(&mut server_reader(bytes)).await.unwrap_err();
        assert_eq!(e.close_code(), Some(1007));
    })
    .await;
}

#[tokio::test]
async fn an_oversized_message_is_refused_from_its_header() {
    bounded(async {
        // A header announcing 100 MiB and nothing else: refused without waiting for the payload.
        let mut f = vec![0x81u8, 0x80 | 127];
        f.extend_from_slice(&(100u64 << 20).to_be_bytes());
        f.extend_from_slice(&[1, 2, 3, 4]);
        let e = read_all(&mut server_reader(f)).await.unwrap_err();
        assert!(
            matches!(e, Error::TooBig { size, max } if size == 100 << 20 && max == 1 << 20),
            "{e}"
        );
        assert_eq!(e.close_code(), Some(1009));
        // Fragments that are each small but too long together.
        let mut b = client_frame(0x01, &[b'a'; 40]);
        b.extend(client_frame(0x80, &[b'a'; 40]));
        let mut r = FrameReader::new(Pieces(VecDeque::from([b])), Role::Server, 64, &[]);
        assert!(matches!(
            read_all(&mut r).await.unwrap_err(),
            Error::TooBig { size: 80, .. }
        ));
    })
    .await;
}

#[tokio::test]
async fn the_buffer_grows_with_the_bytes_that_came_not_with_the_announced_size() {
    bounded(async {
        // A header announcing 1 000 000 bytes, then 100 of them, then the end.
        let mut f = vec![0x82u8, 0x80 | 127];
        f.extend_from_slice(&1_000_000u64.to_be_bytes());
        f.extend_from_slice(&[1, 2, 3, 4]);
        f.extend_from_slice(&[0; 100]);
        let mut r = FrameReader::new(Pieces(VecDeque::from([f])), Role::Server, 1 << 21, &[]);
        assert!(matches!(read_all(&mut r).await, Err(Error::Io(_))));
        assert_eq!(
            r.buf.capacity(),
            READ_CHUNK,
            "nothing past what came was allocated"
        );
    })
    .await;
}

#[tokio::test]
async fn the_end_of_the_stream_is_clean_only_between_frames() {
    bounded(async {
        let whole = client_frame(0x81, b"abc");
        assert_eq!(
            read_all(&mut server_reader(whole.clone()))
                .await
                .unwrap()
                .len(),
            1
        );
        let cut = whole[..whole.len() - 1].to_vec();
        let e = read_all(&mut server_reader(cut)).await.unwrap_err();
        assert!(
            matches!(&e, Error::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{e}"
        );
        // In the middle of a fragmented message, too.
        let e = read_all(&mut server_reader(client_frame(0x01, b"a")))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Io(_)), "{e}");
    })
    .await;
}

#[tokio::test]
async fn closing_the_writer_sends_a_close_frame_and_ends_the_stream() {
    bounded(async {
        let (a, b) = tokio::io::duplex(1024);
        let mut w = FrameWriter::new(a, Role::Client);
        w.send(Out::Text("last".into())).await.unwrap();
        w.close().await.unwrap();
        assert!(
            w.send(Out::Text("after".into())).await.is_err(),
            "nothing follows a close"
        );
        let mut r = FrameReader::new(b, Role::Server, 64, &[]);
        assert_eq!(
            read_all(&mut r).await.unwrap(),
            vec![Owned::Text("last".into()), Owned::Close(Some(1000))]
        );
    })
    .await;
}

type Pipe = tokio::io::DuplexStream;

/// A tungstenite peer, and this module's reader and writer in role `ours`, over one pipe.
async fn with_tungstenite(
    ours: Role,
) -> (
    WebSocketStream<Pipe>,
    FrameReader<tokio::io::ReadHalf<Pipe>>,
    FrameWriter<tokio::io::WriteHalf<Pipe>>,
) {
    let (a, b) = tokio::io::duplex(4096);
    let theirs = match ours {
        Role::Server => tproto::Role::Client,
        Role::Client => tproto::Role::Server,
    };
    let peer = WebSocketStream::from_raw_socket(a, theirs, None).await;
    let (rd, wr) = tokio::io::split(b);
    (
        peer,
        FrameReader::new(rd, ours, 1 << 20, &[]),
        FrameWriter::new(wr, ours),
    )
}

#[tokio::test]
async fn a_tungstenite_client_and_this_server_understand_each_other() {
    bounded(async {
        let (mut peer, mut r, mut w) = with_tungstenite(Role::Server).await;
        let long = "x".repeat(70_000);
        let send = async {
            peer.send(Message::text("one")).await.unwrap();
            peer.send(Message::binary(vec![1, 2])).await.unwrap();
            peer.send(Message::Ping(b"hb".to_vec().into()))
                .await
                .unwrap();
            peer.send(Message::text(long.clone())).await.unwrap();
            peer
        };
        let read = async {
            let mut got = Vec::new();
            for _ in 0..4 {
                got.push(owned(r.next().await.unwrap().unwrap()));
            }
            got
        };
        let (mut peer, got) = tokio::join!(send, read);
        assert_eq!(
            got,
            vec![
                Owned::Text("one".into()),
                Owned::Binary(vec![1, 2]),
                Owned::Ping(b"hb".to_vec()),
                Owned::Text(long.clone()),
            ]
        );
        // The long frame is more than the pipe holds: written while the peer reads.
        let write = async {
            w.send(Out::Text(long.clone())).await.unwrap();
            w.send(Out::Pong(b"hb".to_vec())).await.unwrap();
            w.send(Out::Close(1001)).await.unwrap();
        };
        let (_, first) = tokio::join!(write, peer.next());
        assert_eq!(first.unwrap().unwrap(), Message::text(long));
        assert_eq!(
            peer.next().await.unwrap().unwrap(),
            Message::Pong(b"hb".to_vec().into())
        );
        match peer.next().await.unwrap().unwrap() {
            Message::Close(Some(c)) => assert_eq!(c.code, CloseCode::Away),
            other => panic!("not a close: {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn this_client_and_a_tungstenite_server_understand_each_other() {
    bounded(async {
        let (mut peer, mut r, mut w) = with_tungstenite(Role::Client).await;
        w.send(Out::Text("to the editor".into())).await.unwrap();
        w.send(Out::Ping(vec![7])).await.unwrap();
        assert_eq!(
            peer.next().await.unwrap().unwrap(),
            Message::text("to the editor")
        );
        assert_eq!(
            peer.next().await.unwrap().unwrap(),
            Message::Ping(vec![7].into())
        );
        // tungstenite answers the ping on its own, around the answer.
        peer.send(Message::text("answer")).await.unwrap();
        let mut got = vec![
            owned(r.next().await.unwrap().unwrap()),
            owned(r.next().await.unwrap().unwrap()),
        ];
        got.sort_by_key(|f| format!("{f:?}"));
        assert_eq!(
            got,
            vec![Owned::Pong(vec![7]), Owned::Text("answer".into())]
        );
    })
    .await;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any frames, cut into any pieces, read back as they were written.
    #[test]
    fn any_frames_cut_anywhere_read_back(
        texts in proptest::collection::vec("\\PC{0,300}", 1..12),
        cuts in proptest::collection::vec(1usize..200, 1..40),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let frames: Vec<Out> = texts.iter().cloned().map(Out::Text).collect();
        let bytes = rt.block_on(encoded(Role::Client, frames));
        let mut pieces = VecDeque::new();
        let mut at = 0;
        for c in cuts.iter().cycle() {
            if at >= bytes.len() {
                break;
            }
            let end = (at + c).min(bytes.len());
            pieces.push_back(bytes[at..end].to_vec());
            at = end;
        }
        let mut r = FrameReader::new(Pieces(pieces), Role::Server, 1 << 20, &[]);
        let got = rt.block_on(read_all(&mut r)).unwrap();
        let want: Vec<Owned> = texts.into_iter().map(Owned::Text).collect();
        prop_assert_eq!(got, want);
    }

    /// Any bytes from a peer, in any pieces, in either role: read to an end or an error,
    /// never a panic or a hang (the frames a hostile peer can send).
    #[test]
    fn any_bytes_end_in_frames_or_an_error(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        cut in 1usize..64,
        server in any::<bool>(),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let pieces = bytes.chunks(cut).map(<[u8]>::to_vec).collect();
        let role = if server { Role::Server } else { Role::Client };
        let mut r = FrameReader::new(Pieces(pieces), role, 256, &[]);
        let end = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), read_all(&mut r)).await
        });
        prop_assert!(end.is_ok(), "the reader hung");
        if let Ok(Err(e)) = end {
            // A violation owes its close code; only a stream cut mid-frame has none.
            prop_assert!(
                e.close_code().is_some() || matches!(&e, Error::Io(io) if io.kind() == io::ErrorKind::UnexpectedEof),
                "{e}"
            );
        }
    }

    /// Masking eight bytes at a time is masking byte by byte.
    #[test]
    fn the_wide_mask_is_the_bytewise_mask(data in proptest::collection::vec(any::<u8>(), 0..100), key in any::<[u8; 4]>()) {
        let mut wide = data.clone();
        apply_mask(&mut wide, key);
        let narrow: Vec<u8> = data.iter().enumerate().map(|(i, b)| b ^ key[i % 4]).collect();
        prop_assert_eq!(wide, narrow);
    }
}

// The budget for messages in flight (`wire::budget`).

/// A client's frame of any length: FIN and opcode in `b0`, masked with a fixed key.
fn long_client_frame(b0: u8, payload: &[u8]) -> Vec<u8> {
    let key = [0x5a, 0x17, 0xc3, 0x81];
    let mut f = vec![b0, 0x80 | 127];
    f.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    f.extend_from_slice(&key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

/// A JSON-RPC request of about `len` bytes whose id comes last (as the MCP SDKs write it).
fn long_request(id: u64, len: usize) -> String {
    format!(
        r#"{{"method":"tools/call","params":{{"text":"{}"}},"jsonrpc":"2.0","id":{id}}}"#,
        "x".repeat(len)
    )
}

/// `bytes` handed out in reads of `n` bytes, noting the most room any read was offered: the
/// reader's buffer, less what it held unread.
struct Counted {
    pieces: Pieces,
    most_room: Arc<std::sync::atomic::AtomicUsize>,
}

impl AsyncRead for Counted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.most_room
            .fetch_max(buf.remaining(), std::sync::atomic::Ordering::Relaxed);
        Pin::new(&mut self.pieces).poll_read(cx, buf)
    }
}

use std::sync::Arc;

fn counted(bytes: &[u8], n: usize) -> (Counted, Arc<std::sync::atomic::AtomicUsize>) {
    let most_room = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let pieces = Pieces(bytes.chunks(n).map(<[u8]>::to_vec).collect());
    (
        Counted {
            pieces,
            most_room: most_room.clone(),
        },
        most_room,
    )
}

#[tokio::test]
async fn a_frame_over_the_budget_is_read_past_unheld_answered_and_the_next_is_read() {
    bounded(async {
        let budget = crate::budget::FrameBudget::new(1 << 20);
        // Another connection holds most of it.
        let mut other = budget.share(None).claim();
        assert!(other.hold((1 << 20) - 100_000));
        let big = long_request(42, 300_000);
        let mut bytes = long_client_frame(0x81, big.as_bytes());
        bytes.extend(client_frame(
            0x81,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        ));
        // Reads of an odd size: the masking key's phase moves from read to read.
        let (io, most_room) = counted(&bytes, 1001);
        let mut r =
            FrameReader::new(io, Role::Server, 1 << 20, &[]).with_budget(budget.share(None));
        let e = r.next().await.unwrap_err();
        let Error::OverBudget { size, id } = &e else {
            panic!("{e}")
        };
        assert_eq!(*size, big.len() as u64);
        assert!(
            matches!(id, Some(id) if *id == 42),
            "its id, which came last: {e}"
        );
        assert!(
            r.buf.capacity() <= READ_CHUNK,
            "the refused frame was never buffered: {}",
            r.buf.capacity()
        );
        assert!(
            most_room.load(std::sync::atomic::Ordering::Relaxed) <= READ_CHUNK,
            "no read was offered more room than the small buffer"
        );
        assert_eq!(budget.held(), (1 << 20) - 100_000, "nothing claimed for it");
        assert_eq!(
            r.next().await.unwrap(),
            Some(Frame::Text(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#)),
            "the connection reads on"
        );
        assert_eq!(r.next().await.unwrap(), None);
        // With room again, the same frame is read whole.
        drop(other);
        let mut r = FrameReader::new(Pieces(VecDeque::from([bytes])), Role::Server, 1 << 20, &[])
            .with_budget(budget.share(None));
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text(big.as_str())));
    })
    .await;
}

#[tokio::test]
async fn a_long_frame_is_claimed_while_held_and_given_back_with_its_memory() {
    bounded(async {
        let budget = crate::budget::FrameBudget::new(1 << 20);
        let big = long_request(7, 200_000);
        let mut bytes = long_client_frame(0x81, big.as_bytes());
        // A message in three fragments, with a ping between.
        let second = long_request(8, 100_000);
        let (a, rest) = second.as_bytes().split_at(30_000);
        let (b, c) = rest.split_at(40_000);
        bytes.extend(long_client_frame(0x01, a));
        bytes.extend(client_frame(0x89, b"p"));
        bytes.extend(long_client_frame(0x00, b));
        bytes.extend(long_client_frame(0x80, c));
        bytes.extend(client_frame(0x81, b"small"));
        let mut r = FrameReader::new(Pieces(VecDeque::from([bytes])), Role::Server, 1 << 20, &[])
            .with_budget(budget.share(Some("remote:box")));
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text(big.as_str())));
        let held = budget.held();
        assert!(
            held >= big.len(),
            "the frame is claimed while it is held: {held}"
        );
        assert_eq!(r.next().await.unwrap(), Some(Frame::Ping(b"p")));
        assert!(budget.held() > 0, "the fragments so far are claimed");
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text(second.as_str())));
        let held = budget.held();
        assert!(
            held >= second.len() && held <= 2 * second.len() + 100_000,
            "the message and the buffer are claimed: {held}"
        );
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text("small")));
        assert_eq!(
            budget.held(),
            0,
            "all given back once the long frames are dropped"
        );
        assert!(
            r.buf.capacity() <= READ_CHUNK,
            "the buffer shrank back: {}",
            r.buf.capacity()
        );
        assert_eq!(r.next().await.unwrap(), None);
    })
    .await;
}

#[tokio::test]
async fn a_fragmented_message_over_the_budget_is_dropped_whole_and_the_connection_reads_on() {
    bounded(async {
        let budget = crate::budget::FrameBudget::new(100_000);
        let msg = format!(
            r#"{{"jsonrpc":"2.0","id":"frag","method":"x","params":"{}"}}"#,
            "y".repeat(150_000)
        );
        let (a, rest) = msg.as_bytes().split_at(20_000);
        let (b, c) = rest.split_at(100_000);
        let mut bytes = long_client_frame(0x01, a); // fits: claimed
        bytes.extend(long_client_frame(0x00, b)); // over the budget: the message is refused
        bytes.extend(client_frame(0x89, b"between")); // still handed out
        bytes.extend(long_client_frame(0x80, c)); // read past
        bytes.extend(client_frame(0x81, b"after"));
        let mut r = FrameReader::new(Pieces(VecDeque::from([bytes])), Role::Server, 1 << 20, &[])
            .with_budget(budget.share(None));
        assert_eq!(r.next().await.unwrap(), Some(Frame::Ping(b"between")));
        assert_eq!(
            budget.held(),
            0,
            "what the first fragment held is given back"
        );
        // Said once the whole message is read past (its size: every fragment's).
        let e = r.next().await.unwrap_err();
        let Error::OverBudget { size, id } = &e else {
            panic!("{e}")
        };
        assert_eq!(*size, msg.len() as u64);
        assert!(
            matches!(id, Some(id) if *id == "frag"),
            "the id from the fragment put together before the refusal: {e}"
        );
        assert_eq!(r.next().await.unwrap(), Some(Frame::Text("after")));
        assert_eq!(r.next().await.unwrap(), None);
        assert_eq!(budget.held(), 0);
        assert!(r.buf.capacity() <= READ_CHUNK, "{}", r.buf.capacity());
        // The stream ending in the middle of a refused message is no clean end.
        let cut = long_client_frame(0x01, &vec![b'z'; 150_000]);
        let mut r = FrameReader::new(Pieces(VecDeque::from([cut])), Role::Server, 1 << 20, &[])
            .with_budget(budget.share(None));
        let e = r.next().await.unwrap_err();
        assert!(
            matches!(&e, Error::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof),
            "{e}"
        );
    })
    .await;
}

#[tokio::test]
async fn small_frames_cost_nothing_and_readers_without_a_budget_are_not_counted() {
    bounded(async {
        let budget = crate::budget::FrameBudget::new(1 << 20);
        let mut all = budget.share(None).claim();
        assert!(all.hold(1 << 20), "the whole budget taken");
        let small = "s".repeat(READ_CHUNK - 8);
        let mut bytes = client_frame(0x81, small.as_bytes());
        bytes.extend(client_frame(0x81, b"tiny"));
        let mut r = FrameReader::new(
            Pieces(VecDeque::from([bytes.clone()])),
            Role::Server,
            1 << 20,
            &[],
        )
        .with_budget(budget.share(None));
        assert_eq!(
            read_all(&mut r).await.unwrap(),
            vec![Owned::Text(small.clone()), Owned::Text("tiny".into())],
            "frames that fit the read buffer are read with the budget all taken"
        );
        // An editor link's reader has no budget: a long answer is read whatever is held.
        let big = long_client_frame(0x82, &[1; 300_000]);
        let mut r = FrameReader::new(Pieces(VecDeque::from([big])), Role::Server, 1 << 20, &[]);
        assert!(matches!(r.next().await.unwrap(), Some(Frame::Binary(b)) if b.len() == 300_000));
    })
    .await;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Messages of any length, in any fragments, cut into any pieces, against a budget partly
    /// taken by others: each comes out whole or is refused with its size and id, in order,
    /// and everything the reader claimed is given back, with its memory.
    #[test]
    fn every_message_is_read_whole_or_refused_whole(
        messages in proptest::collection::vec((0usize..9000, 1usize..4), 1..8),
        total in 4096usize..40_000,
        others in 0usize..40_000,
        cut in 1usize..3000,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let budget = crate::budget::FrameBudget::new(total);
        let mut other = budget.share(None).claim();
        let others = others.min(total);
        prop_assert!(other.hold(others));
        let texts: Vec<String> = messages
            .iter()
            .enumerate()
            .map(|(i, (len, _))| format!(r#"{{"t":"{}","id":{i}}}"#, "a".repeat(*len)))
            .collect();
        let mut bytes = Vec::new();
        for (text, (_, parts)) in texts.iter().zip(&messages) {
            let step = text.len().div_ceil(*parts);
            let chunks: Vec<&[u8]> = text.as_bytes().chunks(step).collect();
            for (k, chunk) in chunks.iter().enumerate() {
                let op = if k == 0 { 0x01 } else { 0x00 };
                let fin = if k + 1 == chunks.len() { 0x80 } else { 0 };
                bytes.extend(long_client_frame(fin | op, chunk));
            }
        }
        let pieces = bytes.chunks(cut).map(<[u8]>::to_vec).collect();
        let mut r = FrameReader::new(Pieces(pieces), Role::Server, 1 << 20, &[])
            .with_budget(budget.share(Some("container:x")));
        let got = rt.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), async {
                let mut got = Vec::new();
                loop {
                    match r.next().await {
                        Ok(Some(Frame::Text(t))) => got.push(Ok(t.to_string())),
                        Ok(None) => return got,
                        Err(Error::OverBudget { size, id }) => got.push(Err((size, id))),
                        other => panic!("{other:?}"),
                    }
                }
            })
            .await
        });
        let got = got.map_err(|_| TestCaseError::fail("the reader hung"))?;
        prop_assert_eq!(got.len(), texts.len());
        for (i, (g, want)) in got.iter().zip(&texts).enumerate() {
            match g {
                Ok(t) => prop_assert_eq!(t, want),
                Err((size, id)) => {
                    prop_assert_eq!(*size, want.len() as u64);
                    prop_assert_eq!(id.as_ref().and_then(|v| v.as_u64()), Some(i as u64));
                }
            }
        }
        prop_assert_eq!(budget.held(), others, "all given back");
        prop_assert!(r.buf.capacity() <= READ_CHUNK, "{}", r.buf.capacity());
    }
}

/// A long first fragment and one byte of the next frame's header, read, and then the peer
/// stops: what the waiting reader's buffer holds. Then the rest, with one byte of the frame
/// after: the message is read, and again what the waiting reader holds.
async fn waits_small(budget: Option<crate::budget::Share>) -> (usize, usize) {
    use tokio::io::AsyncWriteExt;
    let (mut peer, ours) = tokio::io::duplex(1 << 20);
    let mut r = FrameReader::new(ours, Role::Server, 1 << 20, &[]);
    if let Some(share) = budget {
        r = r.with_budget(share);
    }
    let mut bytes = long_client_frame(0x02, &[7; 300_000]);
    let mut tail = client_frame(0x80, b"end");
    tail.extend_from_slice(&client_frame(0x81, b"next")[..3]);
    bytes.push(tail.remove(0));
    peer.write_all(&bytes).await.unwrap();
    {
        let first = std::pin::pin!(r.next());
        assert!(futures_util::poll!(first).is_pending());
    }
    let stalled = r.buf.capacity();
    peer.write_all(&tail).await.unwrap();
    assert!(matches!(r.next().await.unwrap(), Some(Frame::Binary(b)) if b.len() == 300_003));
    {
        let next = std::pin::pin!(r.next());
        assert!(futures_util::poll!(next).is_pending());
    }
    (stalled, r.buf.capacity())
}

#[tokio::test]
async fn a_reader_waiting_for_a_short_frame_keeps_no_long_buffer() {
    bounded(async {
        // An editor link's reader (no budget), and a session's.
        let caps = waits_small(None).await;
        assert!(caps.0 <= READ_CHUNK && caps.1 <= READ_CHUNK, "{caps:?}");
        let budget = crate::budget::FrameBudget::new(1 << 20);
        let caps = waits_small(Some(budget.share(None))).await;
        assert!(caps.0 <= READ_CHUNK && caps.1 <= READ_CHUNK, "{caps:?}");
        assert_eq!(budget.held(), 0);
    })
    .await;
}
