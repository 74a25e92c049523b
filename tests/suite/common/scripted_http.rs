//! One scripted HTTP fake of a model API on 127.0.0.1, for driving real agents offline: every
//! request is read whole (headers, `content-length` body), kept for the test to inspect, and
//! answered by the API's dialect from a script of replies (after the script: "ok"). The two
//! dialects are `fake_model` (OpenAI chat completions, for pi and OpenCode) and `fake_gemini`
//! (the Gemini API, for Gemini CLI).

use serde_json::Value;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Plain model text.
    Text(String),
    /// One tool (function) call with these arguments.
    Tool { name: String, args: Value },
}

/// One request the agent made.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The request path.
    pub path: String,
    /// Its JSON body (`null` when it had none or it was not JSON).
    pub body: Value,
}

/// How an API answers one request: its content type and body, taking replies from `script`.
pub type Dialect = fn(&Seen, &mut VecDeque<Reply>) -> (&'static str, String);

/// The running server.
pub struct Scripted {
    /// The port on 127.0.0.1.
    pub port: u16,
    script: Arc<Mutex<VecDeque<Reply>>>,
    requests: mpsc::UnboundedReceiver<Seen>,
}

impl Scripted {
    /// Listens on a free port and answers every request in `dialect`.
    pub async fn start(dialect: Dialect) -> Scripted {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let script = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, requests) = mpsc::unbounded_channel();
        let s = script.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (s, tx) = (s.clone(), tx.clone());
                tokio::spawn(async move {
                    let _ = serve(stream, s, tx, dialect).await;
                });
            }
        });
        Scripted {
            port,
            script,
            requests,
        }
    }

    /// Queues an answer for the next request the dialect takes a reply for.
    pub fn push(&self, reply: Reply) {
        self.script.lock().expect("script").push_back(reply);
    }

    /// Drops the replies not yet taken (a turn that ended early leaves its script behind).
    pub fn clear(&self) {
        self.script.lock().expect("script").clear();
    }

    /// The next request, however long it takes (`None` when the server is gone).
    pub async fn next_seen(&mut self) -> Option<Seen> {
        self.requests.recv().await
    }

    /// Every request received and not yet taken, without waiting.
    pub fn received(&mut self) -> Vec<Seen> {
        std::iter::from_fn(|| self.requests.try_recv().ok()).collect()
    }
}

async fn serve(
    mut stream: TcpStream,
    script: Arc<Mutex<VecDeque<Reply>>>,
    tx: mpsc::UnboundedSender<Seen>,
    dialect: Dialect,
) -> std::io::Result<()> {
    let Some(seen) = read_request(&mut stream).await? else {
        return Ok(());
    };
    let (ctype, text) = dialect(&seen, &mut script.lock().expect("script"));
    let _ = tx.send(seen);
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {ctype}\r\ncache-control: no-cache\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        text.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(text.as_bytes()).await?;
    stream.shutdown().await
}

/// One request: the path from its request line and the JSON of its `content-length` body.
async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Seen>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let header_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let len: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < header_end + len {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[header_end..]).unwrap_or(Value::Null);
    Ok(Some(Seen { path, body }))
}
