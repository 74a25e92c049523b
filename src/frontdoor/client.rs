//! The one client of the daemon's native socket: the CLI's commands and the stdio doors.
//!
//! The client side of the native socket, for every command that dials it: a JSON `GET`
//! (`/v1/status`, `/v1/pi-sessions`), the `/v1/events` stream, and a WebSocket upgrade
//! (`/v1/session`, `/v1/follow`), each refusal given with the daemon's own reason.

use crate::frontdoor::status::StatusEvent;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::path::Path;

/// Why the daemon could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nothing listens on the socket.
    #[error("pi-ide-broker is not running (nothing answers on {0})")]
    NotRunning(String),
    /// What is at the socket path is not the user's broker (its dir or its listener is
    /// another user's): nothing was sent to it.
    #[error("will not use the broker socket: {0}")]
    Untrusted(String),
    /// It answered, but not as expected.
    #[error("the daemon gave a bad answer: {0}")]
    Protocol(String),
    /// It refused the request, and said why (e.g. the connection's rights do not reach it).
    #[error("the daemon refused: {0}")]
    Refused(String),
    /// It answered a document this build does not read (another version of the daemon).
    #[error("the daemon's answer to {path} is not in the shape this pi-ide-broker {} reads ({why}); is the daemon another version? `pi-ide-broker stop`, then start it again", env!("CARGO_PKG_VERSION"))]
    Shape {
        /// The endpoint asked.
        path: String,
        /// What did not fit.
        why: String,
    },
}

/// The broker's reason in an error body (`{"error": "…"}`), if it gave one.
fn said(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    v.get("error")?.as_str().map(String::from)
}

/// Why a WebSocket upgrade on the daemon's socket failed: the broker's own reason where it
/// refused with one (`HTTP 403: …`), else the error.
pub fn upgrade_refusal(e: &tokio_tungstenite::tungstenite::Error) -> String {
    if let tokio_tungstenite::tungstenite::Error::Http(resp) = e {
        let status = resp.status();
        return match resp.body().as_deref().and_then(said) {
            Some(why) => format!("HTTP {status}: {why}"),
            None => format!("HTTP {status}"),
        };
    }
    e.to_string()
}

/// A WebSocket on the daemon's socket at `path_and_query` (`/v1/session?…`, `/v1/follow?…`):
/// `NotRunning` when nothing listens, `Refused` with the daemon's reason when it refused the
/// upgrade (`HTTP 403: …`).
pub async fn upgrade(
    socket: &Path,
    path_and_query: &str,
) -> Result<tokio_tungstenite::WebSocketStream<crate::platform::local::Stream>, ClientError> {
    let stream = crate::platform::local::connect(socket)
        .await
        .map_err(|e| dial_error(socket, e))?;
    let url = format!("ws://localhost{path_and_query}");
    tokio_tungstenite::client_async(url.as_str(), stream)
        .await
        .map(|(ws, _)| ws)
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(_) => {
                ClientError::Refused(upgrade_refusal(&e))
            }
            other => ClientError::Protocol(other.to_string()),
        })
}

/// Fetches `path` (e.g. `/v1/status`) from the daemon at `socket` as the document it is
/// (`frontdoor::status::Status`, `registry::explain::RouteExplanation`,
/// `protocol::follow::PiSessions`): `Shape` when the daemon's answer does not fit it.
pub async fn get<T: serde::de::DeserializeOwned>(
    socket: &Path,
    path: &str,
) -> Result<T, ClientError> {
    let v = get_json(socket, path).await?;
    serde_json::from_value(v).map_err(|e| ClientError::Shape {
        path: path.split('?').next().unwrap_or(path).to_string(),
        why: e.to_string(),
    })
}

/// Fetches `path` from the daemon at `socket` as JSON, untyped: what `status --json` prints
/// as the daemon said it (fields of a newer daemon included).
pub async fn get_json(socket: &Path, path: &str) -> Result<serde_json::Value, ClientError> {
    let resp = send_get(socket, path).await?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| ClientError::Protocol(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(match said(&body) {
            Some(why) if status.is_client_error() => ClientError::Refused(why),
            _ => {
                ClientError::Protocol(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)))
            }
        });
    }
    serde_json::from_slice(&body).map_err(|e| ClientError::Protocol(e.to_string()))
}

/// Follows `GET /v1/events`: calls `on_event` with every line until the daemon ends the stream
/// or stops (a stream cut by the daemon's exit is an end, not an error). A line this build
/// does not read is skipped, with one warning.
pub async fn follow_events(
    socket: &Path,
    mut on_event: impl FnMut(StatusEvent),
) -> Result<(), ClientError> {
    let resp = send_get(socket, "/v1/events").await?;
    if !resp.status().is_success() {
        return Err(ClientError::Protocol(format!("HTTP {}", resp.status())));
    }
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut warned = false;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Ok(());
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buf.extend_from_slice(&data);
        while let Some(i) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=i).collect();
            match serde_json::from_slice(&line) {
                Ok(event) => on_event(event),
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(error = %e, "a status event this build does not read (is the daemon another version?); skipped");
                }
                Err(_) => {}
            }
        }
    }
    Ok(())
}

/// Why dialling `socket` failed: refused as not the user's (`PermissionDenied`, the
/// platform's checks), else nothing answers there.
fn dial_error(socket: &Path, e: std::io::Error) -> ClientError {
    if e.kind() == std::io::ErrorKind::PermissionDenied {
        ClientError::Untrusted(e.to_string())
    } else {
        ClientError::NotRunning(format!("{}: {e}", socket.display()))
    }
}

/// Sends `GET path` over the socket; the response with its body still to read.
async fn send_get(
    socket: &Path,
    path: &str,
) -> Result<hyper::Response<hyper::body::Incoming>, ClientError> {
    let stream = crate::platform::local::connect(socket)
        .await
        .map_err(|e| dial_error(socket, e))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(hyper::header::HOST, "pi-ide-broker")
        .body(Empty::<Bytes>::new())
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    sender
        .send_request(req)
        .await
        .map_err(|e| ClientError::Protocol(e.to_string()))
}
