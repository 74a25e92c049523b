//! The native door: HTTP/1.1 (hyper) on the broker's Unix sockets (the main one, each remote's).
//! `GET /v1/status` answers the status JSON; `GET /v1/session?cwd=…` upgrades to a
//! WebSocket that speaks MCP JSON-RPC as an editor would, with the broker in between. Each
//! endpoint says who may call it; the peer's rights come from `rights`, decided at accept.

use super::rights::{Origin, OwnerAct, Peer, Seen, Socket};
use super::status;
use crate::platform::local::{Listener, Stream};
use crate::protocol::family::Family;
use crate::registry::Registry;
use crate::session::{Door, Intro};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Accepts connections on one of the broker's sockets until the broker stops accepting.
/// Each peer's rights are decided here, once, from where it came (`rights::decide`); peers
/// of another uid that the config does not list are refused.
pub(crate) async fn serve(listener: Listener, reg: Arc<Registry>, socket: Socket, seen: Arc<Seen>) {
    loop {
        let accepted = tokio::select! {
            _ = reg.accepting.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok(stream) => {
                let peer = match admit(&stream, &reg, &socket) {
                    Ok(p) => p,
                    Err(why) => {
                        tracing::warn!(reason = %why, "refused a connection on the broker socket");
                        continue;
                    }
                };
                seen.note(&peer);
                let budget = match peer.realm() {
                    None => None,
                    Some(realm) => match reg.limits.agent_connection(&realm) {
                        Ok(slot) => Some(slot),
                        Err(why) => {
                            reg.tracker.spawn(refuse_busy(stream, why));
                            continue;
                        }
                    },
                };
                let permit = reg.limits.handshake("native").await;
                let reg2 = reg.clone();
                let seen2 = seen.clone();
                reg.tracker.spawn(async move {
                    connection(stream, reg2, permit, Arc::new(peer), seen2).await;
                    drop(budget);
                });
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed on the broker socket; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// An agent over its connection budget: one HTTP 503 that says why, then the connection is
/// closed (its descriptor back at once; the answer is bounded by [`REFUSAL_WRITE`]).
async fn refuse_busy(mut stream: Stream, why: String) {
    use tokio::io::AsyncWriteExt;
    let body = serde_json::json!({ "error": why }).to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE, async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await
    })
    .await;
}

/// How long a refusal may take to write before the connection is dropped unanswered.
const REFUSAL_WRITE: Duration = Duration::from_millis(200);

/// The peer's rights on `socket`, or why it may not connect.
fn admit(stream: &Stream, reg: &Registry, socket: &Socket) -> Result<Peer, super::Error> {
    let facts = crate::platform::peer::of_stream(stream)
        .map_err(|e| super::Error::Refused(format!("cannot read peer credentials: {e}")))?;
    let config = reg.config();
    let grants = super::rights::Grants {
        allow_uids: &config.allow_uids,
        owner_uids: &config.owner_uids,
    };
    let me = crate::platform::user::uid();
    super::rights::decide(
        socket,
        &facts,
        me,
        crate::platform::peer::own_place(),
        grants,
    )
}

async fn connection(
    stream: Stream,
    reg: Arc<Registry>,
    permit: crate::registry::limits::HandshakeSlot,
    peer: Arc<Peer>,
    seen: Arc<Seen>,
) {
    // Closed if it still holds its place at the deadline, or a newer connection took it.
    let closer = permit.closer();
    let heard = permit.heard();
    let cancel = reg.cancel.clone();
    // The handshake place is held until the connection ends, or until it turns into a
    // long-lived stream (`/v1/events`), which is no handshake any more.
    let place = Arc::new(std::sync::Mutex::new(Some(permit)));
    let svc = hyper::service::service_fn(move |req| {
        let reg = reg.clone();
        if req.uri().path() == "/v1/events" {
            crate::platform::sync::lock(&place).take();
        }
        let (peer, seen) = (peer.clone(), seen.clone());
        async move { Ok::<_, Infallible>(route(req, reg, &peer, &seen)) }
    });
    // A peer that opens the socket and sends nothing gets a second, not a task forever.
    let conn = super::serve_http(stream, &heard, svc);
    tokio::select! {
        r = conn => if let Err(e) = r { tracing::debug!(error = %e, "native connection ended with an error") },
        why = closer => tracing::debug!(reason = why, "native connection closed in its handshake"),
        _ = cancel.cancelled() => {}
    }
}

/// Every answer's body: whole (status, errors) or streamed (`/v1/events`).
type Body = BoxBody<Bytes, Infallible>;

fn text(status: StatusCode, body: String, content_type: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    text(
        status,
        serde_json::json!({"error": message}).to_string(),
        "application/json",
    )
}

fn route(
    req: Request<Incoming>,
    reg: Arc<Registry>,
    peer: &Peer,
    seen: &Arc<Seen>,
) -> Response<Body> {
    if req.headers().contains_key(header::ORIGIN) {
        tracing::warn!("refused a request carrying an Origin header on the broker socket");
        return error(
            StatusCode::FORBIDDEN,
            "requests with an Origin header are refused",
        );
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/v1/status") => {
            let body = serde_json::to_string_pretty(&status::seen_by(&reg, peer, &seen.all()))
                .unwrap_or_default();
            text(StatusCode::OK, body, "application/json")
        }
        (&Method::GET, "/v1/events") => events(reg, peer.clone(), seen.clone()),
        (&Method::GET, "/v1/session") => session(req, reg, peer),
        (&Method::GET, "/v1/route") => owner_only(peer, OwnerAct::ExplainRoute)
            .unwrap_or_else(|| explain(&req, &reg)),
        (&Method::GET, "/v1/pi-sessions") => owner_only(peer, OwnerAct::ListPiSessions)
            .unwrap_or_else(|| pi_sessions(&req, &reg)),
        (&Method::GET, "/v1/follow") => {
            owner_only(peer, OwnerAct::Follow).unwrap_or_else(|| follow(req, reg))
        }
        _ => error(
            StatusCode::NOT_FOUND,
            "unknown endpoint; try GET /v1/status, GET /v1/events, GET /v1/route?cwd=<dir>, GET /v1/session?cwd=<dir>, GET /v1/pi-sessions?cwd=<dir> or GET /v1/follow?session=<key>",
        ),
    }
}

/// `None` when `peer` is the owner; else the 403 that says why not and what to do.
fn owner_only(peer: &Peer, act: OwnerAct) -> Option<Response<Body>> {
    let why = peer.owner_only(act).err()?;
    tracing::info!(
        origin = peer.realm().as_deref().unwrap_or("-"),
        "refused: {why}"
    );
    Some(error(StatusCode::FORBIDDEN, &why.to_string()))
}

/// `GET /v1/route?cwd=&session=`: which editor a session there would get, and why.
fn explain(req: &Request<Incoming>, reg: &Registry) -> Response<Body> {
    let mut cwd = None;
    let mut key = None;
    for pair in req.uri().query().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = crate::protocol::percent::decode_query(v);
        match k {
            "cwd" => cwd = v,
            "session" => key = v.filter(|v| !v.is_empty()),
            _ => {}
        }
    }
    let Some(cwd) = cwd.filter(|c| crate::protocol::winpath::is_absolute(c)) else {
        return error(
            StatusCode::BAD_REQUEST,
            "GET /v1/route needs cwd=<absolute dir> (and optionally session=<key>)",
        );
    };
    let body =
        serde_json::to_string_pretty(&reg.explain_route(&cwd, key.as_deref())).unwrap_or_default();
    text(StatusCode::OK, body, "application/json")
}

/// The query's pairs, percent-decoded (a pair that does not decode is left out).
fn query_pairs(req: &Request<Incoming>) -> Vec<(String, String)> {
    req.uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Some((k.to_string(), crate::protocol::percent::decode_query(v)?))
        })
        .collect()
}

/// `GET /v1/pi-sessions?cwd=`: the pi sessions an ACP editor in `cwd` can follow, the most
/// recently active first.
fn pi_sessions(req: &Request<Incoming>, reg: &Registry) -> Response<Body> {
    let pairs = query_pairs(req);
    let Some((_, cwd)) = pairs
        .iter()
        .find(|(k, v)| k == "cwd" && crate::protocol::winpath::is_absolute(v))
    else {
        return error(
            StatusCode::BAD_REQUEST,
            "GET /v1/pi-sessions needs cwd=<absolute dir>",
        );
    };
    let list = crate::protocol::follow::PiSessions {
        sessions: crate::session::follow::candidates(reg, std::path::Path::new(cwd))
            .iter()
            .map(|s| crate::session::follow::describe(s))
            .collect(),
    };
    let body = serde_json::to_string(&list).unwrap_or_default();
    text(StatusCode::OK, body, "application/json")
}

/// `GET /v1/follow?session=<key>[&client=<name>][&buffers=1]`: a follower's upgrade (`session::follow`).
fn follow(mut req: Request<Incoming>, reg: Arc<Registry>) -> Response<Body> {
    let pairs = query_pairs(&req);
    let get = |name: &str| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let Some(key) = get("session").filter(|k| !k.is_empty()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "GET /v1/follow needs session=<key> (GET /v1/pi-sessions?cwd=<dir> lists them)",
        );
    };
    let Some(target) = crate::session::follow::by_key(&reg, &key) else {
        return error(
            StatusCode::NOT_FOUND,
            &format!("no pi session {key:?} runs with the pi-ide-broker extension (protocol {} or later)", crate::session::follow::FOLLOW_PROTOCOL),
        );
    };
    let Some(place) = reg.limits.session("native") else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many sessions (max_sessions); close some or raise max_sessions",
        );
    };
    let ws_key = match super::websocket_key(req.headers()) {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("/v1/follow: {e}")),
    };
    let name = get("client").unwrap_or_else(|| "an ACP editor".into());
    let buffers = get("buffers").is_some_and(|v| v == "1");
    let on_upgrade = hyper::upgrade::on(&mut req);
    let reg2 = reg.clone();
    reg.tracker.spawn(async move {
        match on_upgrade.await {
            Ok(up) => {
                let target = super::Upgraded::Follow(target, name, buffers);
                super::run_upgraded::<Stream>(reg2, up, target).await
            }
            Err(e) => tracing::info!(error = %e, "follower upgrade failed"),
        }
        drop(place);
    });
    super::switching_protocols(&ws_key, false)
}

/// `GET /v1/session?cwd=…`: a session's upgrade, its place among the sessions taken first.
fn session(mut req: Request<Incoming>, reg: Arc<Registry>, peer: &Peer) -> Response<Body> {
    let Some(place) = reg.limits.session("native") else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many sessions (max_sessions); close some or raise max_sessions",
        );
    };
    let mut intro = match parse_intro(req.uri().query().unwrap_or("")) {
        Ok(i) => i,
        Err(e) => return error(StatusCode::BAD_REQUEST, &e.to_string()),
    };
    if let Err((status, why)) = scope_intro(&mut intro, peer, &reg.config().remote) {
        tracing::info!(origin = peer.realm().as_deref().unwrap_or("-"), cwd = %intro.cwd, "session refused: {why}");
        return error(status, &why);
    }
    let key = match super::websocket_key(req.headers()) {
        Ok(k) => k,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("/v1/session: {e}")),
    };
    let wants_mcp = super::offers_mcp(
        req.headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .and_then(|v| v.to_str().ok()),
    );
    let on_upgrade = hyper::upgrade::on(&mut req);
    let reg2 = reg.clone();
    reg.tracker.spawn(async move {
        match on_upgrade.await {
            Ok(up) => {
                super::run_upgraded::<Stream>(reg2, up, super::Upgraded::Session(intro)).await
            }
            Err(e) => tracing::info!(error = %e, "session upgrade failed"),
        }
        drop(place);
    });
    super::switching_protocols(&key, wants_mcp)
}

/// A session's introduction held to its peer's rights: on a remote's socket the remote is
/// the socket's (whatever `remote=` says) and the cwd must map into one of its folders; an
/// agent's session keys are its realm's alone (`<realm>/<key>`), so it can neither take nor
/// inherit the owner's sticky targets, nor pass for the owner's session to a follower.
fn scope_intro(
    intro: &mut Intro,
    peer: &Peer,
    remotes: &[crate::protocol::pathmap::RemoteConfig],
) -> Result<(), (StatusCode, String)> {
    if let Origin::Remote(name) = &peer.origin {
        if let Some(said) = intro.remote.as_ref().filter(|r| *r != name) {
            return Err((
                StatusCode::FORBIDDEN,
                format!("this is the socket of [[remote]] {name:?}, not {said:?}: its sessions are {name:?}'s (drop remote=, or use {said:?}'s own socket)"),
            ));
        }
        intro.remote = Some(name.clone());
        let map = crate::protocol::pathmap::PathMap::for_remote(remotes, name);
        let host = map.and_then(|m| m.to_host(&intro.cwd).ok().flatten());
        if let Some(real) = host.as_deref().and_then(|h| escapes(h, name, remotes)) {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "cwd {} is {} on the host once its symlinks are resolved, outside every folder of [[remote]] {name:?}; a remote's sessions stay in its folders",
                    intro.cwd,
                    real.display()
                ),
            ));
        }
        if host.is_none() {
            let folders: Vec<String> = remotes
                .iter()
                .filter(|r| &r.name == name)
                .map(|r| format!("{} (here {})", r.agent.display(), r.host.display()))
                .collect();
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "cwd {} is outside every folder of [[remote]] {name:?} ({}); add a [[remote]] with name = {name:?} that maps it, in the host's broker config",
                    intro.cwd,
                    if folders.is_empty() { "none configured now".into() } else { folders.join(", ") }
                ),
            ));
        }
    } else if let Some(r) = &intro.remote {
        if !remotes.iter().any(|x| &x.name == r) {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("no [[remote]] named {r:?} in the broker's config; add one (name, agent, host) or drop remote="),
            ));
        }
    }
    if let Some(realm) = peer.realm() {
        let own = |k: &mut Option<String>| {
            if let Some(v) = k.as_mut() {
                *v = format!("{realm}/{v}");
            }
        };
        own(&mut intro.key);
        own(&mut intro.inherit);
        intro.realm = Some(realm);
    }
    Ok(())
}

/// Where the host path `host` (a remote's cwd, mapped) really is when that lies outside every
/// host folder of the remote `name`, both with their symlinks resolved (a link the agent made
/// inside its folder to elsewhere on the host); `None` when it stays inside. Judged on the
/// resolved path, as the session is routed by it (`registry::session`).
fn escapes(
    host: &str,
    name: &str,
    remotes: &[crate::protocol::pathmap::RemoteConfig],
) -> Option<std::path::PathBuf> {
    use crate::registry::router::normalize;
    let real = normalize(std::path::Path::new(host));
    let inside = remotes
        .iter()
        .filter(|r| r.name == name)
        .any(|r| real.starts_with(normalize(&r.host)));
    (!inside).then_some(real)
}

/// `GET /v1/events`: newline-delimited JSON, one line per change of what `status` shows
/// (`{"seq": n, "status": {…}}`), the first at once. Changes coalesce: a client that reads
/// slowly (or not at all) gets the latest state when it reads again, and costs nothing
/// meanwhile.
fn events(reg: Arc<Registry>, peer: Peer, seen: Arc<Seen>) -> Response<Body> {
    let changes = reg.subscribe_changes();
    let cancel = reg.cancel.clone();
    let stream = futures_util::stream::unfold(
        (reg, changes, cancel, true),
        move |(reg, mut changes, cancel, first)| {
            let (peer, seen) = (peer.clone(), seen.clone());
            async move {
                if !first {
                    tokio::select! {
                        _ = cancel.cancelled() => return None,
                        r = changes.changed() => r.ok()?,
                    }
                }
                let seq = *changes.borrow_and_update();
                let event = status::StatusEvent {
                    seq,
                    status: status::seen_by(&reg, &peer, &seen.all()),
                };
                let mut line = serde_json::to_vec(&event).unwrap_or_default();
                line.push(b'\n');
                let frame = hyper::body::Frame::data(Bytes::from(line));
                Some((Ok::<_, Infallible>(frame), (reg, changes, cancel, false)))
            }
        },
    );
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    r
}

/// The client's own words about itself, gathered from the query.
#[derive(Default)]
struct ClientQuery {
    name: Option<String>,
    version: Option<String>,
    protocol: Option<u32>,
}

/// Parses `cwd` (required, absolute), `session`, `inherit`, `editor`, `dialect` and the
/// client's `client`, `client_version` and `protocol` from a query string.
pub(crate) fn parse_intro(query: &str) -> Result<Intro, super::Error> {
    let bad = super::Error::BadRequest;
    let mut intro = Intro {
        door: Door::Native,
        cwd: String::new(),
        key: None,
        editor: None,
        inherit: None,
        pinned: false,
        remote: None,
        family: Family::Pi,
        client: None,
        realm: None,
    };
    let mut client = ClientQuery::default();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = crate::protocol::percent::decode_query(v).ok_or_else(|| {
            bad(format!(
                "query parameter {k} is not valid percent-encoded UTF-8"
            ))
        })?;
        match k {
            "cwd" => intro.cwd = v,
            "session" if !v.is_empty() => intro.key = Some(v),
            "editor" if !v.is_empty() => intro.editor = Some(v),
            "inherit" if !v.is_empty() => intro.inherit = Some(v),
            "remote" if !v.is_empty() => intro.remote = Some(v),
            "dialect" => {
                intro.family = match v.as_str() {
                    "pi" => Family::Pi,
                    "claude" => Family::Claude,
                    other => {
                        return Err(bad(format!("dialect must be pi or claude, not {other:?}")))
                    }
                }
            }
            "door" if v == "stdio" => intro.door = Door::Stdio,
            "client" if !v.is_empty() => client.name = Some(v),
            "client_version" if !v.is_empty() => client.version = Some(v),
            "protocol" => {
                client.protocol =
                    Some(v.parse().map_err(|_| {
                        bad(format!("protocol must be a revision number, not {v:?}"))
                    })?)
            }
            _ => {}
        }
    }
    intro.client = client
        .name
        .map(|name| crate::protocol::version::ClientInfo {
            name,
            version: client.version,
            protocol: client.protocol,
        });
    if intro.cwd.is_empty() {
        return Err(bad(
            "missing query parameter cwd (the session's absolute working directory)".into(),
        ));
    }
    if !crate::protocol::winpath::is_absolute(&intro.cwd) {
        return Err(bad(format!(
            "cwd must be an absolute path, got {:?}",
            intro.cwd
        )));
    }
    Ok(intro)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intro_from_query() {
        let i = parse_intro("cwd=%2Fhome%2Fu%2Fmy%20proj&session=42&dialect=claude&inherit=41")
            .unwrap();
        assert_eq!(i.inherit.as_deref(), Some("41"));
        assert_eq!(i.cwd, "/home/u/my proj");
        assert_eq!(i.key.as_deref(), Some("42"));
        assert_eq!(i.family, Family::Claude);
        assert!(parse_intro("session=1")
            .unwrap_err()
            .to_string()
            .contains("cwd"));
        assert!(parse_intro("cwd=rel/x")
            .unwrap_err()
            .to_string()
            .contains("absolute"));
        assert!(parse_intro("cwd=/x&dialect=vim").is_err());
        let c = parse_intro("cwd=/p&session=k2&client=test-client&client_version=9.9.9&protocol=2")
            .expect("intro")
            .client
            .expect("client");
        assert_eq!(
            (c.name.as_str(), c.version.as_deref(), c.protocol),
            ("test-client", Some("9.9.9"), Some(2))
        );
        assert!(parse_intro("cwd=/x&protocol=two").is_err());
        assert!(parse_intro("cwd=%ZZ").is_err());
    }

    /// A remote's cwd is judged where it really is: a symlink the agent made inside its
    /// folder to elsewhere on the host is refused (403, saying where it leads), while a link
    /// that stays inside, a folder not made yet and a host folder configured through a
    /// symlink are fine; the realm's keys are its own.
    #[cfg(unix)]
    #[test]
    fn a_remotes_cwd_is_judged_after_its_symlinks_are_resolved() {
        use crate::frontdoor::rights::Rights;
        let tmp = tempfile::tempdir().expect("tempdir");
        let app = tmp.path().join("src/app");
        let secret = tmp.path().join("src/secret");
        std::fs::create_dir_all(app.join("sub")).expect("mkdir");
        std::fs::create_dir_all(&secret).expect("mkdir");
        std::os::unix::fs::symlink(&secret, app.join("esc")).expect("symlink");
        std::os::unix::fs::symlink(app.join("sub"), app.join("inner")).expect("symlink");
        let via = tmp.path().join("via");
        std::os::unix::fs::symlink(&app, &via).expect("symlink");
        let remotes = vec![crate::protocol::pathmap::RemoteConfig {
            name: "box".into(),
            agent: "/workspaces/app".into(),
            host: via.clone(),
        }];
        let peer = Peer {
            origin: Origin::Remote("box".into()),
            rights: Rights::Agent,
        };
        let scoped = |cwd: &str| {
            let mut intro = parse_intro(&format!("cwd={cwd}&session=k")).expect("intro");
            scope_intro(&mut intro, &peer, &remotes).map(|()| intro)
        };
        let (status, why) = scoped("/workspaces/app/esc").expect_err("an escape");
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(
            why.contains(&secret.canonicalize().expect("real").display().to_string()),
            "{why}"
        );
        assert!(scoped("/workspaces/app/esc/deeper").is_err());
        // The remote is the socket's: naming another is refused, naming its own is fine.
        let mut other = parse_intro("cwd=/workspaces/app&remote=other").expect("intro");
        let (status, why) = scope_intro(&mut other, &peer, &remotes).expect_err("another remote");
        assert_eq!(status, StatusCode::FORBIDDEN);
        assert!(why.contains("\"other\""), "{why}");
        let mut own = parse_intro("cwd=/workspaces/app&remote=box").expect("intro");
        scope_intro(&mut own, &peer, &remotes).expect("its own remote");
        // Owner-only endpoints: the owner passes, an agent gets the 403 that says why.
        assert!(owner_only(&Peer::owner(), OwnerAct::Follow).is_none());
        let refused = owner_only(&peer, OwnerAct::Follow).expect("refused");
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        for fine in [
            "/workspaces/app",
            "/workspaces/app/inner",
            "/workspaces/app/new/dir",
        ] {
            let intro = scoped(fine).unwrap_or_else(|e| panic!("{fine}: {e:?}"));
            assert_eq!(intro.key.as_deref(), Some("remote:box/k"));
            assert_eq!(intro.realm.as_deref(), Some("remote:box"));
        }
    }

    /// An agent's `session=` and `inherit=` are its realm's: a container naming the owner's
    /// key in `inherit=` (pi's `/new`) does not get the owner's sticky editor, while the
    /// owner's own `/new` does. Through the door's scoping and the registry, as a session
    /// opens.
    #[tokio::test]
    async fn an_agent_cannot_inherit_the_owners_sticky_target() {
        use crate::frontdoor::rights::Rights;
        let dir = tempfile::tempdir().expect("tempdir");
        let reg = Registry::new(
            Arc::new(crate::sys::config::Config {
                state_dir: Some(dir.path().to_path_buf()),
                ..Default::default()
            }),
            crate::registry::state::StateStore::load(dir.path()),
            dir.path().join("sock"),
            tokio_util::sync::CancellationToken::new(),
        );
        reg.state.set_sticky("owner-key", "ed-owner");
        let opened = |peer: &Peer| {
            let mut intro = parse_intro("cwd=/p&session=new-key&inherit=owner-key").expect("intro");
            scope_intro(&mut intro, peer, &[]).expect("scoped");
            let (key, from) = (intro.key.expect("key"), intro.inherit.expect("inherit"));
            reg.inherit_sticky(&key, &from);
            reg.state.sticky(&key)
        };
        let container = Peer {
            origin: Origin::Container("mnt:[2]".into()),
            rights: Rights::Agent,
        };
        assert_eq!(
            opened(&container),
            None,
            "the owner's target is not the agent's"
        );
        assert_eq!(reg.state.sticky("container:mnt:[2]/new-key"), None);
        assert_eq!(opened(&Peer::owner()).as_deref(), Some("ed-owner"));
        reg.cancel.cancel();
    }
}
