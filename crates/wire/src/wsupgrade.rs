//! The client side of an editor link's WebSocket upgrade.
//!
//! The request written byte for byte as tungstenite wrote it (Lua editors parse it by hand),
//! the response read with `httparse` up to its end and no further, so the frames behind it are
//! kept.
//!
//! Why not tungstenite's client handshake: it reads the socket into a buffer of its own, past
//! the response, and the broker's framing (`wsframe`) needs the bytes behind it; only its key
//! and accept helpers are used. One upgrade per link, off the per-call path (the framing's
//! figures are in `benches/README.md`).

use super::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_tungstenite::tungstenite::handshake::{client::generate_key, derive_accept_key};

/// The longest upgrade response read from an editor.
const MAX_RESPONSE: usize = 16 * 1024;

/// How to dial one editor: its port, its family's auth header and token, and the subprotocol
/// its family's own agents ask for.
pub struct Dial<'a> {
    /// The editor's loopback port.
    pub port: u16,
    /// The auth header's name.
    pub auth_header: &'a str,
    /// The token (no header when `None`).
    pub token: Option<&'a str>,
    /// `Sec-WebSocket-Protocol` to offer (Claude Code offers `mcp`); an editor may answer
    /// without one, but not with another.
    pub subprotocol: Option<&'a str>,
}

/// The upgrade request for `dial` with `key`.
fn request(dial: &Dial<'_>, key: &str) -> Result<String, Error> {
    // The rule the link used before it wrote the request itself: no CR, LF or other
    // control byte can end the header line.
    if dial
        .token
        .is_some_and(|t| hyper::header::HeaderValue::from_str(t).is_err())
    {
        return Err(Error::Bad("the token is not a valid header value".into()));
    }
    let auth = match dial.token {
        Some(t) => format!("{}: {t}\r\n", dial.auth_header),
        None => String::new(),
    };
    let protocol = dial
        .subprotocol
        .map(|p| format!("Sec-WebSocket-Protocol: {p}\r\n"))
        .unwrap_or_default();
    let port = dial.port;
    Ok(format!(
        "GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n{protocol}{auth}\r\n"
    ))
}

/// Upgrades `stream` (connected to `127.0.0.1:port`) to a WebSocket, presenting the token in
/// the family's auth header (none for an editor without a token) and offering the family's
/// subprotocol. Returns the bytes the editor sent past its response (its first frames, if it
/// was quick).
pub async fn upgrade<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    dial: Dial<'_>,
) -> Result<Vec<u8>, Error> {
    let subprotocol = dial.subprotocol;
    let key = generate_key();
    let request = request(&dial, &key)?;
    stream.write_all(request.as_bytes()).await?;
    let mut buf = Vec::with_capacity(1024);
    loop {
        if stream.read_buf(&mut buf).await? == 0 {
            return Err(Error::Bad(
                "the editor closed the connection before answering".into(),
            ));
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut response = httparse::Response::new(&mut headers);
        let end = match response.parse(&buf) {
            Ok(httparse::Status::Complete(end)) => end,
            Ok(httparse::Status::Partial) if buf.len() < MAX_RESPONSE => continue,
            Ok(httparse::Status::Partial) => {
                return Err(Error::Bad(format!(
                    "the editor's response is over {MAX_RESPONSE} bytes"
                )))
            }
            Err(e) => {
                return Err(Error::Bad(format!(
                    "the editor's response is not HTTP: {e}"
                )))
            }
        };
        match response.code {
            Some(101) => {}
            Some(400) => return Err(Error::Refused),
            code => {
                return Err(Error::Bad(format!(
                    "the editor answered HTTP {} instead of 101",
                    code.unwrap_or(0)
                )))
            }
        }
        let header = |name: &str| {
            response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .and_then(|h| std::str::from_utf8(h.value).ok())
                .map(str::trim)
        };
        if !header("upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket")) {
            return Err(Error::Bad(
                "the editor's 101 has no Upgrade: websocket".into(),
            ));
        }
        if header("sec-websocket-accept") != Some(&derive_accept_key(key.as_bytes())) {
            return Err(Error::Bad(
                "the editor's Sec-WebSocket-Accept does not match our key".into(),
            ));
        }
        if let Some(chosen) = header("sec-websocket-protocol") {
            if subprotocol != Some(chosen) {
                return Err(Error::Bad(format!(
                    "the editor chose the subprotocol {chosen:?}, which was not offered"
                )));
            }
        }
        return Ok(buf.split_off(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncBufReadExt;

    /// Runs `upgrade` against a peer that reads the request and answers with what `answer`
    /// makes of the request's key (nothing: it closes), written in `pieces` of that many
    /// bytes. Returns the
    /// request's lines and the upgrade's result.
    async fn against(
        answer: impl FnOnce(&str) -> Vec<u8> + Send + 'static,
        pieces: usize,
    ) -> (Vec<String>, Result<Vec<u8>, Error>) {
        against_with(Some("tok"), answer, pieces).await
    }

    /// [`against`], presenting `token` (or none).
    async fn against_with(
        token: Option<&'static str>,
        answer: impl FnOnce(&str) -> Vec<u8> + Send + 'static,
        pieces: usize,
    ) -> (Vec<String>, Result<Vec<u8>, Error>) {
        let (mut ours, theirs) = tokio::io::duplex(64 * 1024);
        let peer = tokio::spawn(async move {
            let mut r = tokio::io::BufReader::new(theirs);
            let mut lines = Vec::new();
            loop {
                let mut line = String::new();
                r.read_line(&mut line).await.unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                lines.push(line.trim_end().to_string());
            }
            let key = lines
                .iter()
                .find_map(|l| l.strip_prefix("Sec-WebSocket-Key: "))
                .unwrap_or_default()
                .to_string();
            let answer = answer(&key);
            for p in answer.chunks(pieces) {
                r.get_mut().write_all(p).await.unwrap();
                tokio::task::yield_now().await;
            }
            // Kept open after an answer (a closed socket would end a partial read), closed
            // after none.
            (lines, (!answer.is_empty()).then_some(r))
        });
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            upgrade(
                &mut ours,
                Dial {
                    port: 4242,
                    auth_header: "x-pi-ide-authorization",
                    token,
                    subprotocol: None,
                },
            ),
        )
        .await
        .expect("the upgrade hung");
        let (lines, _keep_open) = peer.await.unwrap();
        (lines, result)
    }

    fn switching(key: &str) -> String {
        format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {}\r\n\r\n",
            derive_accept_key(key.as_bytes())
        )
    }

    #[tokio::test]
    async fn the_request_is_tungstenites_and_the_frames_behind_the_101_are_kept() {
        let (lines, result) = against(
            |key| {
                let mut a = switching(key).into_bytes();
                a.extend_from_slice(b"\x81\x02hi");
                a
            },
            7, // the response arrives in pieces
        )
        .await;
        assert_eq!(result.unwrap(), b"\x81\x02hi");
        assert_eq!(lines[0], "GET / HTTP/1.1");
        assert_eq!(lines[1], "Host: 127.0.0.1:4242");
        assert!(lines.contains(&"Connection: Upgrade".to_string()));
        assert!(lines.contains(&"Upgrade: websocket".to_string()));
        assert!(lines.contains(&"Sec-WebSocket-Version: 13".to_string()));
        assert!(lines.contains(&"x-pi-ide-authorization: tok".to_string()));
    }

    #[tokio::test]
    async fn an_editor_without_a_token_gets_no_auth_header_and_the_request_stays_whole() {
        let (lines, result) = against_with(None, |key| switching(key).into_bytes(), 1000).await;
        assert_eq!(result.unwrap(), b"");
        assert!(
            !lines
                .iter()
                .any(|l| l.to_ascii_lowercase().contains("authorization")),
            "{lines:?}"
        );
        // Every header line made it (the blank line that ends the request came last).
        assert!(lines.contains(&"Sec-WebSocket-Version: 13".to_string()));
        assert!(lines.iter().any(|l| l.starts_with("Sec-WebSocket-Key: ")));
    }

    #[tokio::test]
    async fn refusals_and_bad_answers_are_told_apart() {
        let (_, r) = against(|_| b"HTTP/1.1 400 Bad Request\r\n\r\n".to_vec(), 1000).await;
        assert!(matches!(r, Err(Error::Refused)), "{r:?}");
        let (_, r) = against(|_| b"HTTP/1.1 404 Not Found\r\n\r\n".to_vec(), 1000).await;
        assert!(matches!(r, Err(Error::Bad(m)) if m.contains("404")));
        let (_, r) = against(|_| switching("another key").into_bytes(), 1000).await;
        assert!(matches!(r, Err(Error::Bad(m)) if m.contains("Accept")));
        let (_, r) = against(|_| b"SSH-2.0-OpenSSH\r\n\r\n".to_vec(), 1000).await;
        assert!(matches!(r, Err(Error::Bad(m)) if m.contains("not HTTP")));
        let (_, r) = against(|_| Vec::new(), 1000).await;
        assert!(matches!(r, Err(Error::Bad(m)) if m.contains("closed")));
    }

    #[tokio::test]
    async fn a_token_that_would_split_the_request_is_not_sent() {
        let (mut ours, _theirs) = tokio::io::duplex(1024);
        let r = upgrade(
            &mut ours,
            Dial {
                port: 1,
                auth_header: "x-pi-ide-authorization",
                token: Some("a\r\nHost: evil"),
                subprotocol: None,
            },
        )
        .await;
        assert!(matches!(r, Err(Error::Bad(_))));
    }
}
