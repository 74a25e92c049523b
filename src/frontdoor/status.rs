//! `GET /v1/status`: the typed status document the daemon answers (a JSON contract).
//!
//! `status`: the JSON the daemon answers on `GET /v1/status` (built from the registry) and
//! the table the CLI prints from it. The JSON field names are a contract: add, never rename.

use crate::editor::{Editor, LinkState};
use crate::protocol::family::Family;
use crate::registry::Registry;
use crate::session::Session;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The status document (`GET /v1/status`): what the daemon serialises and the CLI reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The daemon itself.
    pub broker: BrokerStatus,
    /// Every editor with a validated lockfile, by id.
    pub editors: Vec<EditorStatus>,
    /// Every connected session, by id.
    pub sessions: Vec<SessionStatus>,
    /// Sticky targets, by session key.
    #[serde(default)]
    pub sticky: Vec<StickyStatus>,
    /// Files in the lock dirs that are not usable lockfiles, and why.
    #[serde(default)]
    pub lockfiles_rejected: Vec<RejectedLockfile>,
    /// What each plugged door shows of itself (`frontdoor::plugin`), as members of the
    /// document: the gemini door's `gemini_files`, the codex door's `codex_hub`.
    #[serde(flatten)]
    pub doors: serde_json::Map<String, serde_json::Value>,
    /// The asking connection's rights, and why (absent from daemons before rights existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionStatus>,
    /// Connections on the main socket that got an agent's rights only (a container, an ssh
    /// forward): shown to the owner, who should hand such agents a remote's socket.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents_on_main_socket: Vec<crate::frontdoor::rights::AgentSeen>,
}

/// One line of `GET /v1/events`: the status after a change, numbered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusEvent {
    /// The registry's change counter when it was taken.
    pub seq: u64,
    /// The status then.
    pub status: Status,
}

/// What the connection asking for the status may do, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// `owner` or `agent`.
    pub rights: crate::frontdoor::rights::Rights,
    /// An agent's realm (`remote:box`, `container:mnt:[…]`, …): it sees only its realm's sessions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub realm: Option<String>,
    /// Why it has these rights.
    pub why: String,
    /// What to do about an agent's limits (empty for the owner).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hint: String,
}

/// A `[[remote]]`'s own socket.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteSocket {
    /// The remote's name.
    pub name: String,
    /// Its socket (in a dir of its own, to mount into a container).
    pub path: PathBuf,
    /// The socket exists (remotes are bound when the daemon starts).
    pub listening: bool,
}

/// A file the broker refused as a lockfile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RejectedLockfile {
    /// The file.
    pub path: PathBuf,
    /// Why, in words (e.g. "names pid 123, which is not running (stale lockfile)").
    pub reason: String,
    /// Unix seconds since it was refused for that reason.
    pub since: u64,
}

/// The daemon's own line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BrokerStatus {
    /// Its pid.
    pub pid: u32,
    /// Its version.
    pub version: String,
    /// Its socket.
    pub socket: PathBuf,
    /// Seconds since it started.
    pub uptime_s: u64,
    /// Other uids allowed on the socket (`allow_uids`).
    #[serde(default)]
    pub allow_uids: Vec<u32>,
    /// Other uids with the owner's rights (`owner_uids`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_uids: Vec<u32>,
    /// Each `[[remote]]`'s socket (the owner's status only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_sockets: Vec<RemoteSocket>,
}

/// One editor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EditorStatus {
    /// Its id (stable for its process and its successors).
    pub id: String,
    /// `ideName` from its lockfile.
    pub ide_name: String,
    /// Its family.
    pub family: Family,
    /// Its lockfile.
    pub lockfile: PathBuf,
    /// The port it listens on.
    pub port: u16,
    /// Its pid.
    pub pid: u32,
    /// Workspace folders as written.
    pub workspace_folders: Vec<String>,
    /// Link state.
    pub state: LinkState,
    /// Round trip of the last ping, in ms.
    pub rtt_ms: Option<f64>,
    /// Unix seconds since the link is up.
    pub connected_since: Option<u64>,
    /// How many successions its id has seen.
    pub restarts: u32,
    /// The port of the editor it succeeded.
    #[serde(default)]
    pub previous_port: Option<u16>,
    /// The pid of the editor it succeeded.
    #[serde(default)]
    pub previous_pid: Option<u32>,
    /// The names in its `tools/list`.
    #[serde(default)]
    pub tools: Vec<String>,
    /// Sessions attached to it.
    pub sessions: usize,
    /// True when its lockfile has no token (Emacs's claude-code-ide.el): dialled without the
    /// auth header.
    #[serde(default)]
    pub no_token: bool,
    /// Why it is in its state when the state alone does not say (`taken`: who holds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_reason: Option<String>,
}

/// One session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionStatus {
    /// Broker-assigned id.
    pub id: u64,
    /// The door it came through (`native`, `compat`, `stdio`, or a plugged door's name).
    pub door: String,
    /// Its cwd as given.
    pub cwd: String,
    /// Its sticky key.
    pub key: Option<String>,
    /// The attached editor.
    pub editor: Option<String>,
    /// Unix seconds since it connected.
    pub since: u64,
    /// The family whose tools it speaks (the JSON says `dialect`, its name on the wire).
    #[serde(rename = "dialect")]
    pub family: Family,
    /// True when its family differs from its editor's (its calls are bridged).
    #[serde(default)]
    pub bridged: bool,
    /// The `[[remote]]` it runs on, if elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// Its cwd on this machine (a remote session's cwd mapped), as routing uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_cwd: Option<String>,
    /// Calls waiting for the editor: diffs first, then oldest first.
    #[serde(default)]
    pub in_flight: Vec<InFlight>,
    /// What the client says it is (name, version, protocol revision), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<crate::protocol::version::ClientInfo>,
    /// ACP editors following it (`pi-ide-broker acp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub followers: Vec<FollowerStatus>,
    /// An agent's session: the realm it came from (`remote:box`, `container:mnt:[…]`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// An ACP editor following a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FollowerStatus {
    /// Broker-assigned id.
    pub id: u64,
    /// The ACP client's name.
    pub client: String,
    /// It reviews the session's diffs now (its turn is open).
    pub reviewing: bool,
}

/// One call waiting for an editor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    /// The JSON-RPC method.
    pub method: String,
    /// The tool, for `tools/call`.
    pub tool: Option<String>,
    /// Seconds it has waited.
    pub age_s: u64,
}

/// One sticky target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StickyStatus {
    /// The session key.
    pub key: String,
    /// The editor id.
    pub editor: String,
    /// Unix seconds when it was set.
    pub since: u64,
}

/// The full status document.
pub fn status(reg: &Registry) -> Status {
    let all_sessions = reg.sessions();
    let all_editors = reg.editors();
    let mut editors: Vec<EditorStatus> = all_editors
        .iter()
        .map(|e| editor_status(e, &all_sessions))
        .collect();
    editors.sort_by(|a, b| a.id.cmp(&b.id));
    let mut sessions: Vec<SessionStatus> = all_sessions
        .iter()
        .map(|s| session_status(reg, s, &all_editors))
        .collect();
    sessions.sort_by_key(|s| s.id);
    let sticky = reg
        .state
        .all_sticky()
        .into_iter()
        .map(|(key, t)| StickyStatus {
            key,
            editor: t.editor,
            since: t.since,
        })
        .collect();
    Status {
        broker: BrokerStatus {
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            socket: reg.socket.clone(),
            uptime_s: reg.started_at.elapsed().map(|d| d.as_secs()).unwrap_or(0),
            allow_uids: reg.config().allow_uids.clone(),
            owner_uids: reg.config().owner_uids.clone(),
            remote_sockets: Vec::new(),
        },
        editors,
        sessions,
        sticky,
        lockfiles_rejected: reg
            .rejected_lockfiles()
            .into_iter()
            .map(|(path, reason, since)| RejectedLockfile {
                path,
                reason,
                since,
            })
            .collect(),
        doors: door_status(reg),
        connection: None,
        agents_on_main_socket: Vec::new(),
    }
}

/// The status document as `peer` may see it. The owner sees everything, the remote sockets
/// and the agents `seen` on the main socket; an agent sees its realm's sessions, their
/// editors and its realm's sticky keys, and nothing else of the host (other sessions, other
/// editors' folders, rejected lockfiles, discovery files).
pub fn seen_by(
    reg: &Registry,
    peer: &crate::frontdoor::rights::Peer,
    seen: &[crate::frontdoor::rights::AgentSeen],
) -> Status {
    let mut st = status(reg);
    let realm = peer.realm();
    st.connection = Some(ConnectionStatus {
        rights: peer.rights,
        realm: realm.clone(),
        why: peer.why(),
        hint: peer.hint().into(),
    });
    let Some(realm) = realm else {
        st.agents_on_main_socket = seen.to_vec();
        st.broker.remote_sockets = reg
            .config()
            .remote_names()
            .into_iter()
            .map(|name| {
                let path = crate::sys::config::Config::remote_socket(&reg.socket, &name);
                let listening = path.exists();
                RemoteSocket {
                    name,
                    path,
                    listening,
                }
            })
            .collect();
        return st;
    };
    let mine: std::collections::HashSet<u64> = reg
        .sessions()
        .iter()
        .filter(|s| s.realm.as_deref() == Some(realm.as_str()))
        .map(|s| s.id)
        .collect();
    st.sessions.retain(|s| mine.contains(&s.id));
    let editors: std::collections::HashSet<&str> = st
        .sessions
        .iter()
        .filter_map(|s| s.editor.as_deref())
        .collect();
    st.editors.retain(|e| editors.contains(e.id.as_str()));
    let prefix = format!("{realm}/");
    st.sticky.retain(|k| k.key.starts_with(&prefix));
    st.lockfiles_rejected.clear();
    st.doors.clear();
    st
}

/// One editor's entry: its lockfile, its link, and how many of `sessions` are on it.
fn editor_status(e: &Editor, sessions: &[Arc<Session>]) -> EditorStatus {
    let l = e.lockfile();
    let link = e.link_info();
    EditorStatus {
        id: e.id.clone(),
        ide_name: l.ide_name.clone(),
        family: e.family,
        lockfile: l.path.clone(),
        port: l.port,
        pid: l.pid,
        workspace_folders: l.workspace_folders.clone(),
        state: link.state,
        rtt_ms: link
            .rtt
            .map(|d| (d.as_secs_f64() * 1000.0 * 1000.0).round() / 1000.0),
        connected_since: link.connected_since.map(unix),
        restarts: e.restarts,
        previous_port: e.previous_port,
        previous_pid: e.previous_pid,
        tools: e.tool_names().unwrap_or_default(),
        sessions: sessions.iter().filter(|s| s.is_on(&e.id)).count(),
        no_token: l.auth_token.is_none(),
        state_reason: matches!(link.state, LinkState::Taken | LinkState::Ready)
            .then_some(link.reason)
            .flatten(),
    }
}

/// One session's entry, with its calls in flight on any of `editors` (diffs first, then the
/// oldest first).
fn session_status(reg: &Registry, s: &Session, editors: &[Arc<Editor>]) -> SessionStatus {
    let mut in_flight: Vec<(bool, InFlight)> = Vec::new();
    for e in editors {
        for c in e.calls_of(s.id) {
            in_flight.push((
                c.diff,
                InFlight {
                    method: c.method,
                    tool: c.tool,
                    age_s: c.age.as_secs(),
                },
            ));
        }
    }
    in_flight.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.age_s.cmp(&a.1.age_s)));
    let editor = s.editor_id();
    let bridged = editor
        .as_deref()
        .and_then(|id| reg.editor(id).map(|e| e.family != s.family))
        .unwrap_or(false);
    SessionStatus {
        id: s.id,
        door: s.door.name().to_string(),
        cwd: s.cwd_raw.clone(),
        key: s.key.clone(),
        editor: editor.map(|e| e.to_string()),
        since: unix(s.since),
        family: s.family,
        bridged,
        remote: s.remote.as_ref().map(|(n, _)| n.clone()),
        host_cwd: s.remote.as_ref().map(|_| s.cwd.display().to_string()),
        in_flight: in_flight.into_iter().map(|(_, v)| v).collect(),
        client: s.client.clone(),
        followers: crate::platform::sync::lock(&s.followers)
            .iter()
            .map(|f| FollowerStatus {
                id: f.id,
                client: f.name.clone(),
                reviewing: f.reviewing.load(std::sync::atomic::Ordering::Acquire),
            })
            .collect(),
        origin: s.realm.clone(),
    }
}

/// Every enabled door's part of the document.
fn door_status(reg: &Registry) -> serde_json::Map<String, serde_json::Value> {
    let config = reg.config();
    let mut doors = serde_json::Map::new();
    for door in super::DOORS.iter().filter(|d| d.enabled(&config)) {
        doors.extend(door.status(reg));
    }
    doors
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontdoor::rights::{Origin, Peer, Rights};
    use crate::registry::session::Intro;

    /// A session of `realm` (`None`: the owner's) with key `key` in `cwd`.
    fn session(
        reg: &Registry,
        cwd: &str,
        key: &str,
        realm: Option<&str>,
        on: Option<&str>,
    ) -> Arc<Session> {
        let tracker = tokio_util::task::TaskTracker::new();
        let (ours, _theirs) = tokio::io::duplex(1 << 16);
        let sink: crate::wire::outbox::SessionSink = crate::wire::wsframe::FrameWriter::new(
            Box::pin(ours),
            crate::wire::wsframe::Role::Server,
        );
        let id = reg.next_session_id();
        let outbox = crate::wire::outbox::Outbox::new(
            id,
            sink,
            tokio_util::sync::CancellationToken::new(),
            &tracker,
        );
        let intro = Intro {
            door: crate::session::Door::Native,
            cwd: cwd.into(),
            key: Some(key.into()),
            editor: None,
            remote: None,
            pinned: false,
            inherit: None,
            family: Family::Pi,
            client: None,
            realm: realm.map(String::from),
        };
        let (control, _) = tokio::sync::mpsc::unbounded_channel();
        let s = Arc::new(Session::new(id, &intro, outbox, control, 1, None));
        reg.add_session(s.clone());
        if let Some(id) = on {
            reg.attach_explicit(&s, id).expect("attach");
        }
        s
    }

    /// An editor of ours on `folder` (its link never comes up: nothing listens on the port).
    fn editor(reg: &Registry, dir: &std::path::Path, port: u16, folder: &str) -> String {
        let path = dir.join(format!("{port}.lock"));
        let text = serde_json::json!({
            "pid": std::process::id(),
            "workspaceFolders": [folder],
            "ideName": "Neovim",
            "transport": "ws",
            "authToken": "0123456789abcdef",
        })
        .to_string();
        let lock = crate::registry::lifecycle::lockfile::parse(&text, &path, Family::Pi, port)
            .expect("lockfile");
        reg.apply(crate::registry::lifecycle::watch::LockEvent::Upsert(lock));
        reg.editors()
            .iter()
            .find(|e| e.lockfile().port == port)
            .map(|e| e.id.clone())
            .expect("admitted")
    }

    /// What an agent's status shows: its realm's sessions and sticky keys only, no refused
    /// lockfile, no discovery file, no remote socket, no agents seen; the owner's shows all.
    #[tokio::test]
    async fn an_agent_sees_its_realms_sessions_and_keys_and_nothing_of_the_owners() {
        let dir = tempfile::tempdir().expect("tempdir");
        let gemini = dir.path().join("gemini");
        std::fs::create_dir_all(&gemini).expect("mkdir");
        std::fs::write(
            gemini.join(format!("{}1-2.json", crate::frontdoor::gemini::FILE_PREFIX)),
            serde_json::json!({ crate::frontdoor::gemini::MARKER: {"editor": "ed-owner"} })
                .to_string(),
        )
        .expect("write");
        let mut config = crate::sys::config::Config {
            state_dir: Some(dir.path().join("state")),
            ..Default::default()
        };
        config.edit_section(|s: &mut crate::frontdoor::gemini::GeminiConfig| s.enabled = true);
        config.edit_section(|s: &mut crate::frontdoor::gemini::GeminiConfig| s.dir = Some(gemini));
        let reg = Registry::new(
            Arc::new(config),
            crate::registry::state::StateStore::load(&dir.path().join("state")),
            dir.path().join("sock"),
            tokio_util::sync::CancellationToken::new(),
        );
        reg.state.set_sticky("container:mnt:[9]/k", "ed-y");
        reg.apply(crate::registry::lifecycle::watch::LockEvent::Rejected(
            dir.path().join("9.lock"),
            "not JSON".into(),
        ));
        let theirs = editor(&reg, dir.path(), 1, "/p");
        let owners_editor = editor(&reg, dir.path(), 2, "/q");
        let owners = session(&reg, "/q", "owner-key", None, Some(&owners_editor));
        let agents = session(
            &reg,
            "/p",
            "remote:box/k",
            Some("remote:box"),
            Some(&theirs),
        );
        let _other = session(
            &reg,
            "/r",
            "container:mnt:[9]/k",
            Some("container:mnt:[9]"),
            None,
        );
        let agent = Peer {
            origin: Origin::Remote("box".into()),
            rights: Rights::Agent,
        };
        let seen = [crate::frontdoor::rights::AgentSeen {
            realm: "forwarded".into(),
            why: "ssh".into(),
            hint: String::new(),
            connections: 1,
            last: 0,
        }];
        let st = seen_by(&reg, &agent, &seen);
        let ids: Vec<u64> = st.sessions.iter().map(|s| s.id).collect();
        assert_eq!(ids, [agents.id], "its own session only");
        let keys: Vec<&str> = st.sticky.iter().map(|k| k.key.as_str()).collect();
        assert_eq!(keys, ["remote:box/k"], "its own sticky keys only");
        assert!(
            st.lockfiles_rejected.is_empty(),
            "{:?}",
            st.lockfiles_rejected
        );
        assert!(st.doors.is_empty(), "{:?}", st.doors);
        assert!(st.agents_on_main_socket.is_empty());
        let editors: Vec<&str> = st.editors.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(
            editors,
            [theirs.as_str()],
            "only the editor its session is on"
        );
        let c = st.connection.expect("its connection");
        assert_eq!(
            (c.rights, c.realm.as_deref()),
            (Rights::Agent, Some("remote:box"))
        );
        // The owner: every session, key, refusal and discovery file.
        let st = seen_by(&reg, &Peer::owner(), &seen);
        assert_eq!(st.sessions.len(), 3);
        assert!(st.sessions.iter().any(|s| s.id == owners.id));
        assert_eq!(st.editors.len(), 2);
        assert!(st.editors.iter().any(|e| e.id == owners_editor));
        // Each editor counts the sessions on it; times are unix seconds of now.
        assert!(
            st.editors.iter().all(|e| e.sessions == 1),
            "{:?}",
            st.editors
        );
        let now = unix(SystemTime::now());
        for s in &st.sessions {
            assert!(s.since + 60 > now && s.since <= now, "{}", s.since);
            assert!(!s.bridged, "a pi session on a pi editor is not bridged");
        }
        assert!(
            st.sticky.iter().all(|k| k.since + 60 > now),
            "{:?}",
            st.sticky
        );
        assert_eq!(st.sticky.len(), 3);
        assert_eq!(st.lockfiles_rejected.len(), 1);
        assert_eq!(st.doors["gemini_files"].as_array().map(Vec::len), Some(1));
        assert_eq!(st.agents_on_main_socket.len(), 1);
        reg.cancel.cancel();
    }
}
