//! Connection caps every door shares: handshake places (a flood cannot hold them) and sessions.
//!
//! Connection caps for every accept loop: a bounded number of connections may sit in the
//! handshake (per door: a flood of the loopback compat ports, open to every local user, cannot
//! starve the owner's native socket), and a bounded number of sessions may live at once.
//!
//! A handshake place cannot be held by a flood: a connection gets [`FIRST_BYTE`] to send
//! anything and [`HANDSHAKE_DEADLINE`] in all to finish its upgrade, and when every place is
//! taken a pending connection is closed to make room, never the newcomer: the oldest whose
//! task heard nothing from it, then one whose task has not looked yet, else the oldest
//! ([`Heard`]). A real client sends its request at once and finishes in
//! a millisecond, so idle connections held open (and reopened) by someone else are the ones
//! pushed out, however fast they come: each eviction yields the accept loop for one turn of
//! the I/O driver, so the tasks of the connections accepted before it see (and note) their
//! first bytes before they are next in line. A session over its cap is refused. A pending
//! connection costs one fd: the place holds no duplicate of its socket.
//! Evictions and refusals are logged at most once per 10 s, with their count, so a flood
//! cannot flood the log either.
//!
//! Agents (connections with a realm: `frontdoor::rights`) hold their connections within a
//! budget: [`AgentBudget`], per realm and for all realms together, sized from the daemon's
//! open-files limit, so that no realm, nor many of them, can take the descriptors the owner's
//! connections and the editor links need. The owner is never counted.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How often a refusal is logged at most.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// How long a new connection may stay silent before it is closed.
pub(crate) const FIRST_BYTE: Duration = Duration::from_secs(1);
/// How long a connection may take from accept to a completed upgrade (or answered request).
pub(crate) const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);
/// The caps shared by every door.
pub struct Limits {
    /// Native-socket connections between accept and a completed upgrade.
    native: Arc<Pending>,
    /// Compat connections between accept and a completed upgrade.
    compat: Arc<Pending>,
    /// Live sessions (any door).
    sessions: Arc<Semaphore>,
    /// Agents' live connections, per realm and in all.
    agents: Arc<AgentBudget>,
    /// Refusals and evictions not yet logged.
    refused: AtomicU64,
    /// When a refusal was last logged.
    last_log: Mutex<Option<Instant>>,
}

/// The connections of one door in the handshake, oldest first.
struct Pending {
    /// At most this many.
    cap: usize,
    /// Each one's number, the token that closes it, and what its task has heard from it.
    queue: Mutex<VecDeque<(u64, CancellationToken, Arc<Heard>)>>,
    /// The next number.
    next: AtomicU64,
}

/// What a pending connection's task has heard from it, noted by [`first_byte`]: not looked
/// yet (its task has not run since the accept), silent when it looked, or spoke.
pub struct Heard(AtomicU8);

impl Heard {
    const NOT_LOOKED: u8 = 0;
    const SILENT: u8 = 1;
    const SPOKE: u8 = 2;

    fn new() -> Heard {
        Heard(AtomicU8::new(Self::NOT_LOOKED))
    }

    fn get(&self) -> u8 {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, v: u8) {
        self.0.store(v, Ordering::Relaxed);
    }
}

/// A connection's place in the handshake: given back when dropped. `evicted` fires when the
/// place is taken from it (it was the oldest when a newcomer found every place taken).
pub struct HandshakeSlot {
    /// This place's number in its door's queue.
    id: u64,
    /// Fires when a newer connection took the place: close this one.
    pub evicted: CancellationToken,
    /// Fires when the place is given back (the upgrade done, or the connection gone).
    released: CancellationToken,
    /// What its task has heard from it (the silent are evicted first).
    heard: Arc<Heard>,
    /// The door's queue, to leave it on drop.
    pending: Arc<Pending>,
    /// Whether taking this place closed another pending connection.
    evicted_another: bool,
}

impl HandshakeSlot {
    /// Where [`first_byte`] notes what it heard from the connection.
    pub fn heard(&self) -> Arc<Heard> {
        self.heard.clone()
    }

    /// Resolves, with the reason, when the connection holding this place must be closed: its
    /// place went to a newer connection, or it still holds it [`HANDSHAKE_DEADLINE`] after
    /// accept. Never, once the place is given back.
    pub fn closer(&self) -> impl std::future::Future<Output = &'static str> + Send + 'static {
        let (evicted, released) = (self.evicted.clone(), self.released.clone());
        async move {
            tokio::select! {
                _ = evicted.cancelled() => "its handshake place went to a newer connection",
                _ = tokio::time::sleep(HANDSHAKE_DEADLINE) => {
                    if released.is_cancelled() {
                        std::future::pending::<()>().await;
                    }
                    "no upgrade within the handshake deadline"
                }
            }
        }
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.released.cancel();
        let mut q = crate::platform::sync::lock(&self.pending.queue);
        if let Some(i) = q.iter().position(|(id, ..)| *id == self.id) {
            q.remove(i);
        }
    }
}

impl Limits {
    /// Caps of `max_handshakes` connections in the handshake and `max_sessions` sessions.
    pub fn new(max_handshakes: usize, max_sessions: usize) -> Self {
        let pending = || {
            Arc::new(Pending {
                cap: max_handshakes.max(1),
                queue: Mutex::new(VecDeque::new()),
                next: AtomicU64::new(0),
            })
        };
        Limits {
            native: pending(),
            compat: pending(),
            sessions: Arc::new(Semaphore::new(max_sessions.max(1))),
            agents: Arc::new(AgentBudget::for_open_files(
                crate::platform::rlimit::open_files(),
            )),
            refused: AtomicU64::new(0),
            last_log: Mutex::new(None),
        }
    }

    /// A place in the handshake for a new connection on `door` (`"native"` or `"compat"`);
    /// with every place taken, the oldest pending connection of that door is evicted for it,
    /// and the accept loop yields (one eviction per turn of the I/O driver), so a burst of
    /// flooding connections waiting to be accepted cannot push out, within one turn, a client
    /// whose request has not been seen yet.
    pub async fn handshake(&self, door: &str) -> HandshakeSlot {
        let slot = self.place(door);
        if slot.evicted_another {
            tokio::task::yield_now().await;
        }
        slot
    }

    fn place(&self, door: &str) -> HandshakeSlot {
        let pending = if door == "native" {
            &self.native
        } else {
            &self.compat
        };
        let id = pending.next.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        let heard = Arc::new(Heard::new());
        let oldest = {
            let mut q = crate::platform::sync::lock(&pending.queue);
            let oldest = if q.len() >= pending.cap {
                // Silent when its task looked; else one whose task has not looked yet (its
                // request may be waiting unread); else the oldest.
                let first = |state| q.iter().position(|(.., h)| h.get() == state);
                let victim = first(Heard::SILENT)
                    .or_else(|| first(Heard::NOT_LOOKED))
                    .unwrap_or(0);
                q.remove(victim)
            } else {
                None
            };
            q.push_back((id, evicted.clone(), heard.clone()));
            oldest
        };
        let evicted_another = oldest.is_some();
        if let Some((_, token, _)) = oldest {
            token.cancel();
            self.note_refusal(
                door,
                "connections in the handshake; closing the oldest pending one for each new one",
            );
        }
        HandshakeSlot {
            id,
            evicted,
            released: CancellationToken::new(),
            heard,
            pending: pending.clone(),
            evicted_another,
        }
    }

    /// A place for a new session on `door`, or `None` (refuse it).
    pub fn session(&self, door: &str) -> Option<OwnedSemaphorePermit> {
        if let Ok(p) = self.sessions.clone().try_acquire_owned() {
            return Some(p);
        }
        self.note_refusal(door, "sessions; refusing new ones (see max_sessions)");
        None
    }

    /// A place for a connection of the agent realm `realm` (held for the connection's life),
    /// or the refusal that says which budget is spent.
    pub fn agent_connection(&self, realm: &str) -> Result<AgentSlot, String> {
        self.agents.take(realm).inspect_err(|_| {
            self.note_refusal(
                "native",
                "agent connections; refusing the realm's new ones (its budget is spent)",
            )
        })
    }

    /// The agents' budget (for status and tests).
    pub fn agent_budget(&self) -> &AgentBudget {
        &self.agents
    }

    fn note_refusal(&self, door: &str, what: &str) {
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = crate::platform::sync::lock(&self.last_log);
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *last = Some(Instant::now());
            self.refused.store(0, Ordering::Relaxed);
            tracing::warn!(
                door,
                refused = n,
                "too many {what} (max_handshakes / max_sessions)"
            );
        }
    }
}

/// The connections agents may hold: at most `per_realm` of one realm, `total` of all realms.
pub struct AgentBudget {
    /// At most this many connections of one realm.
    pub per_realm: usize,
    /// At most this many of all agent realms together (many containers, each a realm of its
    /// own, are still one flood).
    pub total: usize,
    /// Live connections by realm, and their sum.
    held: Mutex<(std::collections::HashMap<String, usize>, usize)>,
}

/// One agent connection's place in the [`AgentBudget`], given back when dropped.
pub struct AgentSlot {
    /// The budget it came from.
    budget: Arc<AgentBudget>,
    /// Its realm.
    realm: String,
}

impl AgentBudget {
    /// The most connections of one realm, however many descriptors there are: far more than
    /// any container's sessions need.
    pub const PER_REALM_MAX: usize = 256;

    /// A budget for a daemon that may hold `open_files` descriptors: agents together at most
    /// half of them (the owner, the editor links, the state and the lock dirs keep the rest),
    /// one realm at most a quarter, and [`Self::PER_REALM_MAX`].
    pub fn for_open_files(open_files: Option<u64>) -> AgentBudget {
        let fds = usize::try_from(open_files.unwrap_or(1024)).unwrap_or(usize::MAX);
        let total = (fds / 2).max(16);
        AgentBudget::new((fds / 4).clamp(8, Self::PER_REALM_MAX), total)
    }

    /// A budget of `per_realm` connections per realm and `total` in all.
    pub fn new(per_realm: usize, total: usize) -> AgentBudget {
        AgentBudget {
            per_realm,
            total,
            held: Mutex::new((Default::default(), 0)),
        }
    }

    fn take(self: &Arc<Self>, realm: &str) -> Result<AgentSlot, String> {
        let mut held = crate::platform::sync::lock(&self.held);
        let (by_realm, all) = &mut *held;
        let mine = by_realm.get(realm).copied().unwrap_or(0);
        if mine >= self.per_realm {
            return Err(format!(
                "too many connections from {realm} ({mine}, at most {} per agent realm); close some of its sessions or event streams",
                self.per_realm
            ));
        }
        if *all >= self.total {
            return Err(format!(
                "too many agent connections ({all}, at most {} from containers, remotes and other uids together); close some",
                self.total
            ));
        }
        *by_realm.entry(realm.to_string()).or_insert(0) += 1;
        *all += 1;
        Ok(AgentSlot {
            budget: self.clone(),
            realm: realm.to_string(),
        })
    }

    /// Connections `realm` holds now.
    pub fn held_by(&self, realm: &str) -> usize {
        crate::platform::sync::lock(&self.held)
            .0
            .get(realm)
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        let mut held = crate::platform::sync::lock(&self.budget.held);
        let (by_realm, all) = &mut *held;
        if let Some(n) = by_realm.get_mut(&self.realm) {
            *n -= 1;
            if *n == 0 {
                by_realm.remove(&self.realm);
            }
        }
        *all = all.saturating_sub(1);
    }
}

/// Waits until `stream` has something to read, at most [`FIRST_BYTE`], and notes on its
/// place what it heard: at once whether its request is already waiting (a peek before any
/// wait: an eviction before the next turn of the I/O driver must not take a client that has
/// spoken), then that it spoke once bytes come. A readiness without bytes (tokio's may be
/// spurious) is no first byte; the end of the stream is none either. False if nothing came
/// (close it).
pub(crate) async fn first_byte<S: Readable>(stream: &S, heard: &Heard) -> bool {
    let spoke = |n: usize| {
        if n > 0 {
            heard.set(Heard::SPOKE);
        }
        n > 0
    };
    match stream.peek_now() {
        Ok(n) => return spoke(n),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Err(_) => return false,
    }
    heard.set(Heard::SILENT);
    let bytes = tokio::time::timeout(FIRST_BYTE, async {
        loop {
            stream.wait_readable().await?;
            match stream.try_peek() {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    })
    .await;
    matches!(bytes, Ok(Ok(n)) if spoke(n))
}

/// A socket that can say when it is readable without reading.
pub trait Readable {
    /// Resolves once a read may not block (bytes, the end of the stream, or a false alarm).
    fn wait_readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send;
    /// After a wait: whether bytes are waiting (0: the end of the stream), without blocking
    /// or reading them; `WouldBlock` clears the socket's readiness (tokio's `try_io`), so the
    /// next wait is for real bytes.
    fn try_peek(&self) -> std::io::Result<usize>;
    /// A peek now, whatever tokio believes of the socket's readiness: 1 if bytes wait, 0 at
    /// the end of the stream, `WouldBlock` if nothing does.
    fn peek_now(&self) -> std::io::Result<usize>;
}

impl Readable for tokio::net::TcpStream {
    fn wait_readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
        self.readable()
    }

    fn try_peek(&self) -> std::io::Result<usize> {
        self.try_io(tokio::io::Interest::READABLE, || {
            crate::platform::local::peek_socket(self)
        })
    }

    fn peek_now(&self) -> std::io::Result<usize> {
        crate::platform::local::peek_socket(self)
    }
}

impl Readable for crate::platform::local::Stream {
    fn wait_readable(&self) -> impl std::future::Future<Output = std::io::Result<()>> + Send {
        crate::platform::local::readable(self)
    }

    fn try_peek(&self) -> std::io::Result<usize> {
        crate::platform::local::try_peek(self)
    }

    fn peek_now(&self) -> std::io::Result<usize> {
        crate::platform::local::peek_now(self)
    }
}

#[cfg(test)]
mod tests {

    /// One realm is held to its share and all realms to the total; a slot given back makes
    /// room again; realms do not share a count.
    #[test]
    fn an_agent_realm_is_held_to_its_budget_and_all_realms_to_the_total() {
        let b = Arc::new(AgentBudget::new(2, 3));
        let a1 = b.take("container:a").expect("first");
        let _a2 = b.take("container:a").expect("second");
        let e = b
            .take("container:a")
            .err()
            .expect("third of a realm refused");
        assert!(e.contains("container:a") && e.contains("at most 2"), "{e}");
        let _b1 = b
            .take("remote:box")
            .expect("another realm has its own share");
        let e = b.take("uid:7").err().expect("the total is spent");
        assert!(e.contains("at most 3"), "{e}");
        drop(a1);
        assert_eq!(b.held_by("container:a"), 1);
        let _again = b.take("uid:7").expect("a slot given back makes room");
        assert_eq!(b.held_by("uid:7"), 1);
    }

    /// Sized from the open-files limit: agents keep at least half of the descriptors free.
    #[test]
    fn the_agent_budget_leaves_the_owner_half_the_descriptors() {
        let b = AgentBudget::for_open_files(Some(1024));
        assert_eq!((b.per_realm, b.total), (256, 512));
        let b = AgentBudget::for_open_files(Some(64));
        assert_eq!((b.per_realm, b.total), (16, 32));
        let b = AgentBudget::for_open_files(Some(1 << 20));
        assert_eq!(b.per_realm, AgentBudget::PER_REALM_MAX);
    }
    use super::*;

    #[test]
    fn a_full_door_evicts_its_oldest_pending_connection_for_a_newcomer() {
        let l = Limits::new(2, 1);
        let a = l.place("compat");
        let b = l.place("compat");
        assert!(!a.evicted.is_cancelled() && !b.evicted.is_cancelled());
        assert!(!a.evicted_another && !b.evicted_another);
        let c = l.place("compat");
        assert!(a.evicted.is_cancelled(), "the oldest makes room");
        assert!(c.evicted_another, "the accept loop is told to yield");
        assert!(!b.evicted.is_cancelled() && !c.evicted.is_cancelled());
        // One that was silent when its task looked goes before one not looked at yet.
        c.heard().set(Heard::SILENT);
        let d = l.place("compat");
        assert!(c.evicted.is_cancelled() && !b.evicted.is_cancelled());
        // One that has sent its request is passed over for an older silent one.
        b.heard().set(Heard::SPOKE);
        d.heard().set(Heard::SILENT);
        let e = l.place("compat");
        assert!(d.evicted.is_cancelled() && !b.evicted.is_cancelled());
        // All have spoken: the oldest goes.
        e.heard().set(Heard::SPOKE);
        let f = l.place("compat");
        assert!(b.evicted.is_cancelled() && !e.evicted.is_cancelled());
        drop((e, f));
        // Places given back (upgrades done) leave the queue: nobody else is evicted.
        let c = l.place("compat");
        let d = l.place("compat");
        assert!(!c.evicted.is_cancelled() && !d.evicted.is_cancelled());
        assert!(!c.evicted_another && !d.evicted_another);
        // The other door's places are its own.
        let n = l.place("native");
        assert!(!n.evicted.is_cancelled() && !c.evicted.is_cancelled());
        let s = l.session("t");
        assert!(s.is_some() && l.session("t").is_none());
    }

    /// A request already waiting when the task first looks is heard at once, before any
    /// readiness comes from the I/O driver; a connection that only closes says nothing.
    #[cfg(unix)] // Unix file modes, symlinks or sockets
    #[tokio::test]
    async fn a_request_waiting_at_the_first_look_is_heard_at_once() {
        let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let heard = Heard::new();
        tokio::io::AsyncWriteExt::write_all(&mut theirs, b"GET")
            .await
            .unwrap();
        assert_eq!(crate::platform::local::peek_socket(&ours).unwrap(), 1);
        assert!(first_byte(&ours, &heard).await);
        assert_eq!(heard.get(), Heard::SPOKE);
        let (quiet, peer) = tokio::net::UnixStream::pair().unwrap();
        let heard = Heard::new();
        let closes = tokio::spawn(async move {
            tokio::task::yield_now().await;
            drop(peer);
        });
        assert!(
            !first_byte(&quiet, &heard).await,
            "an end of stream is no first byte"
        );
        assert_eq!(heard.get(), Heard::SILENT);
        closes.await.unwrap();
    }

    /// The kernel holds back a TCP connection that has sent nothing: a client that connects
    /// after it and sends its request is accepted first (without `TCP_DEFER_ACCEPT`, the
    /// accept queue is first come, first served).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_silent_connection_waits_in_the_kernel_behind_one_that_speaks() {
        use tokio::io::AsyncWriteExt;
        let listener = crate::frontdoor::per_editor::loopback_listener().unwrap();
        let addr = listener.local_addr().unwrap();
        let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut speaks = tokio::net::TcpStream::connect(addr).await.unwrap();
        speaks.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(10), listener.accept())
            .await
            .expect("the speaking client accepted within 10 s")
            .unwrap();
        assert_eq!(
            accepted.1,
            speaks.local_addr().unwrap(),
            "the silent one came first"
        );
    }
}
