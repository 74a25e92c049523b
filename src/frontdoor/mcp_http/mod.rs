//! Answers and bounded request bodies of MCP over Streamable HTTP, for the doors that serve it.
//!
//! The gemini and copilot doors each serve MCP over HTTP (hyper) to their agents; what their
//! answers look like (JSON-RPC bodies, plain refusals) and how a request body is read within
//! `max_frame_bytes` and the budget for messages in flight (`wire::budget`) is shared here,
//! with a session's event stream (`events`).

use crate::wire::budget::{Claim, FREE};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::{json, Value};
use std::convert::Infallible;

pub(crate) mod events;

/// A response body of a door's answers.
pub(crate) type Body = BoxBody<Bytes, Infallible>;
/// A JSON body with `status`.
pub(crate) fn json_text(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text)).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
/// A JSON-RPC answer to `id`: its result, or an error (code, message).
pub(crate) fn rpc_response(id: &Value, outcome: Result<Value, (i64, String)>) -> Response<Body> {
    let body = match outcome {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => {
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
        }
    };
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}
/// Why a request body was not read.
pub(crate) enum Unread {
    /// Over `max_frame_bytes`, or cut short.
    TooLarge,
    /// Over the budget for messages in flight.
    Busy,
}

/// A request body of at most `max` bytes, its memory claimed from `claim` as it is read (a
/// body that fits [`FREE`] costs nothing): one `announced` in `Content-Length` is claimed
/// whole before any of it is read, so a body the budget cannot take is never read; the buffer
/// itself grows with the bytes that come, not with the announced size.
pub(crate) async fn read_body(
    body: Incoming,
    max: usize,
    announced: Option<u64>,
    claim: &mut Claim,
) -> Result<Vec<u8>, Unread> {
    let limit = announced
        .and_then(|n| usize::try_from(n).ok())
        .map_or(max, |n| n.min(max));
    let refused = |claim: &Claim, size: usize| {
        claim.budget().note_refusal(size as u64);
        Unread::Busy
    };
    if announced.is_some() && limit > FREE && !claim.hold(limit) {
        return Err(refused(claim, limit));
    }
    let mut body = Limited::new(body, max);
    let mut buf: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(|_| Unread::TooLarge)?.into_data() else {
            continue; // trailers
        };
        let len = buf.len() + data.len();
        if len > buf.capacity() {
            // Doubled as it grows, within the announced length (hyper holds the body to it)
            // or `max` (`Limited` does).
            let room = len.max(buf.capacity() * 2).min(limit).max(len);
            if room > FREE && !claim.hold(room) {
                return Err(refused(claim, len));
            }
            buf.reserve_exact(room - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf)
}

/// The answer to a body the budget for messages in flight could not take: a JSON-RPC "busy"
/// error (its id unknown: the body was not read), and the connection closed rather than the
/// body read past.
pub(crate) fn busy() -> Response<Body> {
    let mut r = rpc_response(
        &Value::Null,
        Err((
            crate::protocol::jsonrpc::BUSY,
            "the broker is reading too many long messages at once (max_frames_in_flight_bytes): this one was dropped unread; send it again".to_string(),
        )),
    );
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// The answer to a body over `max` bytes; the connection is closed.
pub(crate) fn too_large(max: usize) -> Response<Body> {
    let mut r = plain(
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("a message may be at most {max} bytes (max_frame_bytes)"),
    );
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

/// A plain-text answer with `status`.
pub(crate) fn plain(status: StatusCode, text: &str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(format!("{text}\n"))).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// An answer with `status` and no body.
pub(crate) fn empty(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    *r.status_mut() = status;
    r
}
