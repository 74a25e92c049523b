//! Rights per connection: owner or agent, by where a peer comes from, never by what it says.
//!
//! Decided once when it connects, from which socket, uid, namespaces and program it has.
//! docs/security.md is the threat model these rules serve.
//!
//! Two rights. The **owner** (the user's own local processes on the main socket) sees
//! everything and may follow, prompt and review any pi session. An **agent** (a `[[remote]]`'s
//! socket; on the main socket a peer the broker can tell is not a local process of the user)
//! runs sessions on the editor of its own folder and sees its own sessions' status, nothing
//! more. Every check that needs the owner goes through [`Peer::owner_only`].

use crate::platform::peer::{PeerFacts, Place};
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

/// Which of the broker's sockets a connection came in on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Socket {
    /// The main socket (`sock`): the user's own processes.
    Main,
    /// The socket of the `[[remote]]` with this name (`remote/<name>/sock`).
    Remote(String),
}

/// Where a connection came from, as far as the broker can tell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A process of the user, in the broker's own mount and pid namespaces, on the main socket.
    Local,
    /// Another uid on the main socket that `owner_uids` grants the owner's rights.
    OwnerUid(u32),
    /// The socket of this `[[remote]]`.
    Remote(String),
    /// The main socket, from a process in another namespace (`mnt:[…]` or `pid:[…]`): a container.
    Container(String),
    /// The main socket, from this forwarding program (`ssh -R`, or sshd forwarding for another host).
    Forwarded(String),
    /// The main socket, from another uid let in by `allow_uids`.
    OtherUid(u32),
    /// The main socket, from a process the broker cannot tell is local, and why.
    Unknown(String),
}

/// What a connection may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rights {
    /// Everything: status of all, follow, prompt and review any session.
    Owner,
    /// Its own sessions on the editors of their folders, and their status.
    Agent,
}

/// What only the owner may do, each a door of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerAct {
    /// `GET /v1/pi-sessions`: list the pi sessions that can be followed.
    ListPiSessions,
    /// `GET /v1/follow`: read a session's transcript, prompt it, review its diffs.
    Follow,
    /// `GET /v1/route`: how any folder would be routed, and every editor's folders.
    ExplainRoute,
}

impl OwnerAct {
    fn what(self) -> &'static str {
        match self {
            OwnerAct::ListPiSessions => "listing pi sessions (GET /v1/pi-sessions)",
            OwnerAct::Follow => "following a pi session (GET /v1/follow)",
            OwnerAct::ExplainRoute => "explaining routes (GET /v1/route)",
        }
    }
}

/// A connected peer: where it came from and what that grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Where it came from.
    pub origin: Origin,
    /// What it may do.
    pub rights: Rights,
}

/// The config's say in it: who may connect at all, and which other uids are owners.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grants<'a> {
    /// `allow_uids`: other uids let in (as agents).
    pub allow_uids: &'a [u32],
    /// `owner_uids`: other uids let in with the owner's rights.
    pub owner_uids: &'a [u32],
}

/// Decides what the peer with `facts` gets on `socket`, given our uid and namespaces; `Err`
/// (the reason) when it may not connect at all.
pub(crate) fn decide(
    socket: &Socket,
    facts: &PeerFacts,
    me: u32,
    own: &Place,
    grants: Grants<'_>,
) -> Result<Peer, super::Error> {
    let uid = facts.uid;
    let listed = grants.allow_uids.contains(&uid) || grants.owner_uids.contains(&uid);
    if uid != me && !listed {
        return Err(super::Error::Refused(format!(
            "peer uid {uid} is neither ours ({me}) nor in allow_uids or owner_uids"
        )));
    }
    let origin = match socket {
        Socket::Remote(name) => Origin::Remote(name.clone()),
        Socket::Main if uid != me && grants.owner_uids.contains(&uid) => Origin::OwnerUid(uid),
        Socket::Main if uid != me => Origin::OtherUid(uid),
        Socket::Main => local_or_not(facts, own),
    };
    let rights = match origin {
        Origin::Local | Origin::OwnerUid(_) => Rights::Owner,
        _ => Rights::Agent,
    };
    Ok(Peer { origin, rights })
}

/// A peer of our uid on the main socket: local unless it is a forwarder or lives elsewhere.
fn local_or_not(facts: &PeerFacts, own: &Place) -> Origin {
    if let Some(p) = forwarder(facts) {
        return Origin::Forwarded(p);
    }
    match (own, &facts.place) {
        (Place::Read(ours), Place::Read(theirs)) if ours.mnt != theirs.mnt => {
            Origin::Container(theirs.mnt.clone())
        }
        (Place::Read(ours), Place::Read(theirs)) if ours.pid != theirs.pid => {
            Origin::Container(theirs.pid.clone())
        }
        (Place::Read(_), Place::Unreadable(why)) => Origin::Unknown(why.clone()),
        // Same namespaces; or a platform without them; or our own cannot be read (no /proc:
        // said once at start), where nothing can be compared.
        _ => Origin::Local,
    }
}

/// The forwarder `facts` shows, named as it runs: OpenSSH's client (`ssh -R` hands a remote
/// host's connections to a local socket) or its server's processes (`sshd`, `sshd-session`:
/// a forward from another host). Told by what it is, not what it is called: the executable
/// is one of OpenSSH's files (`slogin`, a link to `ssh`, or any other name for it), or its
/// executable's or process's name is OpenSSH's.
fn forwarder(facts: &PeerFacts) -> Option<String> {
    let exe_name = facts
        .exe
        .as_deref()
        .and_then(|e| e.rsplit('/').next())
        .map(|n| n.trim_end_matches(" (deleted)"));
    let named = |n: &str| n == "ssh" || n.starts_with("sshd");
    if facts.runs_ssh || exe_name.is_some_and(named) || facts.program.as_deref().is_some_and(named)
    {
        let shown = facts.program.as_deref().or(exe_name).unwrap_or("ssh");
        return Some(shown.to_string());
    }
    None
}

impl Peer {
    /// The owner's rights, for a test or an in-process caller.
    pub fn owner() -> Peer {
        Peer {
            origin: Origin::Local,
            rights: Rights::Owner,
        }
    }

    /// `Ok` when the owner may do `act`; for an agent, one line that says why it may not and
    /// what to do.
    pub fn owner_only(&self, act: OwnerAct) -> Result<(), super::Error> {
        match self.rights {
            Rights::Owner => Ok(()),
            Rights::Agent => Err(super::Error::Refused(format!(
                "{} needs the owner's rights, and this connection has an agent's only: {}; {}",
                act.what(),
                self.why(),
                self.hint()
            ))),
        }
    }

    /// The group an agent's sessions belong to (they see each other's status, and their
    /// sticky keys are theirs alone); `None` for the owner.
    pub fn realm(&self) -> Option<String> {
        match &self.origin {
            Origin::Local | Origin::OwnerUid(_) => None,
            Origin::Remote(name) => Some(format!("remote:{name}")),
            Origin::Container(ns) => Some(format!("container:{ns}")),
            Origin::Forwarded(_) => Some("forwarded".into()),
            Origin::OtherUid(uid) => Some(format!("uid:{uid}")),
            Origin::Unknown(_) => Some("unknown".into()),
        }
    }

    /// Why it has the rights it has, in words.
    pub fn why(&self) -> String {
        match &self.origin {
            Origin::Local => "a process of yours on this machine".into(),
            Origin::OwnerUid(uid) => format!("uid {uid} is listed in owner_uids"),
            Origin::Remote(name) => format!(
                "it came in on the socket of [[remote]] {name:?}, which carries agent rights only"
            ),
            Origin::Container(ns) => {
                format!("it runs in another namespace ({ns}) than the broker, as in a container")
            }
            Origin::Forwarded(p) => format!("it is forwarded by {p} (an ssh forward)"),
            Origin::OtherUid(uid) => format!("it runs as uid {uid}, let in by allow_uids"),
            Origin::Unknown(why) => {
                format!("the broker cannot tell it is a local process ({why})")
            }
        }
    }

    /// What the user can do about an agent's limits.
    pub fn hint(&self) -> &'static str {
        match &self.origin {
            Origin::Local | Origin::OwnerUid(_) => "",
            Origin::Remote(_) => {
                "following sessions and the status of all of them are for the host's own user"
            }
            Origin::OtherUid(_) => "list the uid in owner_uids to give it the owner's rights",
            Origin::Container(_) | Origin::Forwarded(_) | Origin::Unknown(_) => {
                "give containers and remote hosts a [[remote]]'s own socket instead of the main one: `pi-ide-broker remote` on the host prints it"
            }
        }
    }
}

/// Agents seen on the main socket: logged once each, and shown to the owner (`status`,
/// `doctor`) so a user who mounts the main socket into a container learns of the remote one.
#[derive(Default)]
pub(crate) struct Seen {
    /// By realm, oldest first; at most [`Seen::CAP`].
    seen: Mutex<Vec<AgentSeen>>,
}

/// One kind of agent seen on the main socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSeen {
    /// Its realm (`container:mnt:[…]`, `forwarded`, `uid:0`, …).
    pub realm: String,
    /// Why it is an agent, in words.
    pub why: String,
    /// What to do.
    pub hint: String,
    /// Connections seen.
    pub connections: u64,
    /// Unix seconds of the last one.
    pub last: u64,
}

impl Seen {
    /// How many realms are remembered (the oldest goes first).
    pub(crate) const CAP: usize = 16;

    /// Notes an agent on the main socket; the first of its realm is logged.
    pub(crate) fn note(&self, peer: &Peer) {
        let Some(realm) = peer.realm() else { return };
        if matches!(peer.origin, Origin::Remote(_)) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut seen = crate::platform::sync::lock(&self.seen);
        if let Some(s) = seen.iter_mut().find(|s| s.realm == realm) {
            s.connections += 1;
            s.last = now;
            return;
        }
        tracing::warn!(
            origin = %realm,
            "a connection on the main socket gets agent rights only: {}; {}",
            peer.why(),
            peer.hint()
        );
        if seen.len() >= Self::CAP {
            seen.remove(0);
        }
        seen.push(AgentSeen {
            realm,
            why: peer.why(),
            hint: peer.hint().into(),
            connections: 1,
            last: now,
        });
    }

    /// What was seen, oldest first.
    pub(crate) fn all(&self) -> Vec<AgentSeen> {
        crate::platform::sync::lock(&self.seen).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::peer::Namespaces;

    fn ns(mnt: &str, pid: &str) -> Place {
        Place::Read(Namespaces {
            mnt: mnt.into(),
            pid: pid.into(),
        })
    }

    fn facts(uid: u32, program: &str, place: Place) -> PeerFacts {
        PeerFacts {
            uid,
            pid: Some(42),
            program: Some(program.into()),
            exe: Some(format!("/usr/bin/{program}")),
            runs_ssh: false,
            place,
        }
    }

    const NONE: Grants<'static> = Grants {
        allow_uids: &[],
        owner_uids: &[],
    };

    fn origin(
        socket: &Socket,
        f: &PeerFacts,
        grants: Grants<'_>,
    ) -> Result<Origin, crate::frontdoor::Error> {
        decide(socket, f, 1000, &ns("mnt:[1]", "pid:[1]"), grants).map(|p| p.origin)
    }

    /// Each way in, and what it grants: only a local process of ours on the main socket (or
    /// a uid listed as an owner) is the owner.
    #[test]
    fn rights_follow_where_a_peer_comes_from() {
        let home = ns("mnt:[1]", "pid:[1]");
        let main = Socket::Main;
        let box_ = Socket::Remote("box".into());
        let node = facts(1000, "node", home.clone());
        assert_eq!(origin(&main, &node, NONE), Ok(Origin::Local));
        // The same local process on a remote's socket is that remote.
        assert_eq!(origin(&box_, &node, NONE), Ok(Origin::Remote("box".into())));
        // Another mount namespace, or another pid namespace: a container.
        let f = facts(1000, "node", ns("mnt:[2]", "pid:[1]"));
        assert_eq!(
            origin(&main, &f, NONE),
            Ok(Origin::Container("mnt:[2]".into()))
        );
        let f = facts(1000, "node", ns("mnt:[1]", "pid:[9]"));
        assert_eq!(
            origin(&main, &f, NONE),
            Ok(Origin::Container("pid:[9]".into()))
        );
        // ssh forwarding, whatever its namespaces say.
        for p in ["ssh", "sshd", "sshd-session"] {
            let f = facts(1000, p, home.clone());
            assert_eq!(origin(&main, &f, NONE), Ok(Origin::Forwarded(p.into())));
        }
        assert_eq!(
            origin(&main, &facts(1000, "sshfs", home.clone()), NONE),
            Ok(Origin::Local)
        );
        // By what it is, whatever it is called: `slogin` runs OpenSSH's client file, and a
        // renamed process still runs `ssh`'s executable.
        let slogin = PeerFacts {
            runs_ssh: true,
            ..facts(1000, "slogin", home.clone())
        };
        assert_eq!(
            origin(&main, &slogin, NONE),
            Ok(Origin::Forwarded("slogin".into()))
        );
        let renamed = PeerFacts {
            exe: Some("/usr/bin/ssh".into()),
            ..facts(1000, "node", home.clone())
        };
        assert_eq!(
            origin(&main, &renamed, NONE),
            Ok(Origin::Forwarded("node".into()))
        );
        // Namespaces we cannot read: not known to be local.
        let f = facts(1000, "node", Place::Unreadable("denied".into()));
        assert_eq!(
            origin(&main, &f, NONE),
            Ok(Origin::Unknown("denied".into()))
        );
        // Other uids: refused, let in as agents, or owners only when listed so.
        assert!(origin(&main, &facts(0, "node", home.clone()), NONE).is_err());
        let allow = Grants {
            allow_uids: &[0],
            owner_uids: &[7],
        };
        assert_eq!(
            origin(&main, &facts(0, "node", home.clone()), allow),
            Ok(Origin::OtherUid(0))
        );
        assert_eq!(
            origin(&main, &facts(7, "node", home.clone()), allow),
            Ok(Origin::OwnerUid(7))
        );
        assert!(origin(&box_, &facts(5, "node", home.clone()), allow).is_err());
        // Where we cannot read our own namespaces, or the platform has none: uid alone.
        let f = facts(1000, "node", Place::NoneHere);
        let d = decide(&main, &f, 1000, &Place::NoneHere, NONE).unwrap();
        assert_eq!(d.rights, Rights::Owner);
    }

    /// The rights each origin is given, read from the decision itself (not only its origin):
    /// an `allow_uids` uid, a container, a forwarder and an unknown peer are agents; only a
    /// local process of ours and an `owner_uids` uid are the owner.
    #[test]
    fn each_origin_gets_the_rights_it_is_due() {
        let home = ns("mnt:[1]", "pid:[1]");
        let grants = Grants {
            allow_uids: &[5],
            owner_uids: &[7],
        };
        let rights = |socket: &Socket, f: &PeerFacts| {
            decide(socket, f, 1000, &home, grants)
                .expect("let in")
                .rights
        };
        let main = Socket::Main;
        assert_eq!(
            rights(&main, &facts(1000, "node", home.clone())),
            Rights::Owner
        );
        assert_eq!(
            rights(&main, &facts(7, "node", home.clone())),
            Rights::Owner
        );
        assert_eq!(
            rights(&main, &facts(5, "node", home.clone())),
            Rights::Agent
        );
        assert_eq!(
            rights(&main, &facts(1000, "node", ns("mnt:[2]", "pid:[1]"))),
            Rights::Agent
        );
        assert_eq!(
            rights(&main, &facts(1000, "ssh", home.clone())),
            Rights::Agent
        );
        assert_eq!(
            rights(
                &main,
                &facts(1000, "node", Place::Unreadable("gone".into()))
            ),
            Rights::Agent
        );
        // On a remote's socket even the owner's uid (and an owner_uids uid) is an agent.
        let remote = Socket::Remote("box".into());
        assert_eq!(
            rights(&remote, &facts(1000, "node", home.clone())),
            Rights::Agent
        );
        assert_eq!(
            rights(&remote, &facts(7, "node", home.clone())),
            Rights::Agent
        );
    }

    #[test]
    fn only_the_owner_may_follow_list_or_explain_and_agents_are_told_why() {
        let owner = Peer::owner();
        let agent = Peer {
            origin: Origin::Container("mnt:[2]".into()),
            rights: Rights::Agent,
        };
        for (act, named) in [
            (OwnerAct::ListPiSessions, "GET /v1/pi-sessions"),
            (OwnerAct::Follow, "GET /v1/follow"),
            (OwnerAct::ExplainRoute, "GET /v1/route"),
        ] {
            assert_eq!(owner.owner_only(act), Ok(()));
            let e = agent.owner_only(act).unwrap_err().to_string();
            assert!(e.contains(named), "names what was refused: {e}");
            assert!(e.contains("agent") && e.contains("mnt:[2]"), "{e}");
            assert!(e.contains("pi-ide-broker remote"), "says what to do: {e}");
        }
        assert_eq!(owner.realm(), None);
        assert_eq!(agent.realm().as_deref(), Some("container:mnt:[2]"));
    }

    #[test]
    fn each_realm_seen_on_the_main_socket_is_kept_once_and_counted() {
        let seen = Seen::default();
        let a = Peer {
            origin: Origin::Forwarded("ssh".into()),
            rights: Rights::Agent,
        };
        seen.note(&a);
        seen.note(&a);
        seen.note(&Peer::owner());
        seen.note(&Peer {
            origin: Origin::Remote("box".into()),
            rights: Rights::Agent,
        });
        let all = seen.all();
        assert_eq!(all.len(), 1, "{all:?}");
        assert_eq!(
            (all[0].realm.as_str(), all[0].connections),
            ("forwarded", 2)
        );
        for i in 0..(Seen::CAP as u32 + 3) {
            seen.note(&Peer {
                origin: Origin::OtherUid(i),
                rights: Rights::Agent,
            });
        }
        assert_eq!(seen.all().len(), Seen::CAP);
    }
}
