//! The memory that long messages in flight share, across every connection.
//!
//! Each message is capped (`max_frame_bytes`); this caps them together
//! (`max_frames_in_flight_bytes`), so that many peers each sending one long message cannot
//! take the daemon's memory. A reader claims what it is about to hold (its read buffer grown
//! for the frame, the message it is putting together) from its connection's [`Share`] before
//! it reads the payload, and gives it back once the message is dropped. A message the budget
//! cannot take is read past in small pieces, never held, and the reader says so
//! (`wire::Error::OverBudget`, a JSON-RPC "busy" error to the peer) and reads on.
//!
//! A frame that fits [`FREE`] (the read buffer every connection keeps anyway) is never
//! counted: an ordinary session's calls cost nothing here. A longer one costs one atomic
//! read-modify-write to claim and one to give back (three each for an agent's).
//!
//! Shares, as `registry::limits` shares connections: the owner's connections may use the whole
//! budget; agents' (a realm: a container, a remote, another uid) together at most half of it,
//! one realm at most a quarter, so that no agent, nor many, can keep the owner's long messages
//! out, and no realm another's. The default budget is four of the largest messages: an agent
//! realm can then have one of the largest size in flight whenever the other agents leave room.
//! Editor links are outside the budget (the user's own editors; a refused answer would leave
//! its call waiting).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Bytes of a frame (its header with it) that are never counted: the read buffer every
/// connection keeps anyway (`wsframe`'s), and an HTTP body no longer than it.
pub const FREE: usize = 2 * 1024;

/// Agents together may hold at most this fraction of the budget (one half).
const AGENTS_DIVISOR: usize = 2;
/// One agent realm may hold at most this fraction of the budget (one quarter).
const REALM_DIVISOR: usize = 4;

/// How often refusals are logged at most (with their count), so a flood cannot flood the log.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// The budget: bytes held by readers now, in all, by agents, and by each agent realm.
pub struct FrameBudget {
    /// At most this many bytes in all.
    total: usize,
    /// Held now, in all.
    all: AtomicUsize,
    /// Held now by agents' connections (any realm).
    agents: AtomicUsize,
    /// Each agent realm's count, shared by its connections' [`Share`]s (and gone with them).
    realms: Mutex<HashMap<String, Weak<AtomicUsize>>>,
    /// Refusals not yet logged.
    refused: AtomicU64,
    /// Refusals since the start, for whoever waits on them (a test; status).
    refusals: tokio::sync::watch::Sender<u64>,
    /// When a refusal was last logged.
    last_log: Mutex<Option<Instant>>,
}

impl FrameBudget {
    /// A budget of `total` bytes, none held.
    pub fn new(total: usize) -> Arc<FrameBudget> {
        Arc::new(FrameBudget {
            total,
            all: AtomicUsize::new(0),
            agents: AtomicUsize::new(0),
            realms: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
            refusals: tokio::sync::watch::Sender::new(0),
            last_log: Mutex::new(None),
        })
    }

    /// The share of a connection from `realm` (`None`: the owner's). Taken once per
    /// connection: an agent realm's count is looked up here, not per frame.
    pub fn share(self: &Arc<Self>, realm: Option<&str>) -> Share {
        let realm = realm.map(|r| {
            let mut realms = platform::sync::lock(&self.realms);
            if let Some(count) = realms.get(r).and_then(Weak::upgrade) {
                return count;
            }
            // A new realm (or one whose connections all left): forget those with none left.
            realms.retain(|_, w| w.strong_count() > 0);
            let count = Arc::new(AtomicUsize::new(0));
            realms.insert(r.to_string(), Arc::downgrade(&count));
            count
        });
        Share {
            budget: self.clone(),
            realm,
        }
    }

    /// The bytes it allows in all.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The bytes held now, in all.
    pub fn held(&self) -> usize {
        self.all.load(Ordering::Relaxed)
    }

    /// The count of messages refused since the start, changing with each refusal.
    pub fn refusals(&self) -> tokio::sync::watch::Receiver<u64> {
        self.refusals.subscribe()
    }

    /// Notes a message of `size` bytes refused; logged at most every [`LOG_EVERY`].
    pub fn note_refusal(&self, size: u64) {
        self.refusals.send_modify(|n| *n += 1);
        let n = self.refused.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = platform::sync::lock(&self.last_log);
        if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *last = Some(Instant::now());
            self.refused.store(0, Ordering::Relaxed);
            tracing::warn!(
                refused = n,
                last_size = size,
                held = self.held(),
                budget = self.total,
                "long messages refused: too many in flight at once (max_frames_in_flight_bytes)"
            );
        }
    }
}

/// Adds `n` to `count` unless that would pass `cap`.
fn add_within(count: &AtomicUsize, n: usize, cap: usize) -> bool {
    count
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
            held.checked_add(n).filter(|&h| h <= cap)
        })
        .is_ok()
}

/// One connection's access to the budget: the owner's, or an agent realm's.
#[derive(Clone)]
pub struct Share {
    /// The budget.
    budget: Arc<FrameBudget>,
    /// An agent realm's count; `None` for the owner.
    realm: Option<Arc<AtomicUsize>>,
}

impl Share {
    /// An empty claim on this share.
    pub fn claim(self) -> Claim {
        Claim {
            share: self,
            held: 0,
        }
    }

    /// Takes `n` bytes, if every cap that applies leaves room; else takes nothing.
    fn take(&self, n: usize) -> bool {
        let b = &*self.budget;
        if let Some(realm) = &self.realm {
            if !add_within(realm, n, b.total / REALM_DIVISOR) {
                return false;
            }
            if !add_within(&b.agents, n, b.total / AGENTS_DIVISOR) {
                realm.fetch_sub(n, Ordering::Relaxed);
                return false;
            }
        }
        if !add_within(&b.all, n, b.total) {
            if let Some(realm) = &self.realm {
                realm.fetch_sub(n, Ordering::Relaxed);
                b.agents.fetch_sub(n, Ordering::Relaxed);
            }
            return false;
        }
        true
    }

    /// Gives back `n` bytes taken.
    fn give(&self, n: usize) {
        let b = &*self.budget;
        if let Some(realm) = &self.realm {
            realm.fetch_sub(n, Ordering::Relaxed);
            b.agents.fetch_sub(n, Ordering::Relaxed);
        }
        b.all.fetch_sub(n, Ordering::Relaxed);
    }
}

/// What one reader holds of the budget now; given back when dropped.
pub struct Claim {
    /// Where it is taken from.
    share: Share,
    /// Bytes held.
    held: usize,
}

impl Claim {
    /// Holds at least `n` bytes: true when it does (already, or the budget had room for the
    /// rest); false when the budget has no room, and then it holds what it held before.
    pub fn hold(&mut self, n: usize) -> bool {
        if n <= self.held {
            return true;
        }
        if !self.share.take(n - self.held) {
            return false;
        }
        self.held = n;
        true
    }

    /// Gives back everything it holds.
    pub fn release(&mut self) {
        if self.held > 0 {
            self.share.give(self.held);
            self.held = 0;
        }
    }

    /// Bytes held now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The budget it draws on.
    pub fn budget(&self) -> &FrameBudget {
        &self.share.budget
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn realm_held(b: &FrameBudget, realm: &str) -> usize {
        platform::sync::lock(&b.realms)
            .get(realm)
            .and_then(Weak::upgrade)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    #[test]
    fn claims_are_capped_in_all_and_given_back_when_dropped() {
        let b = FrameBudget::new(1000);
        let mut one = b.share(None).claim();
        let mut two = b.share(None).claim();
        assert!(one.hold(600));
        assert!(!two.hold(500), "600 + 500 is over 1000");
        assert_eq!(two.held(), 0, "a refused claim holds nothing");
        assert!(two.hold(400));
        assert_eq!(b.held(), 1000);
        assert!(one.hold(300), "already held: nothing more taken");
        assert_eq!(b.held(), 1000);
        one.release();
        assert_eq!(b.held(), 400);
        drop(two);
        assert_eq!(b.held(), 0, "a dropped claim gives back what it held");
        assert!(one.hold(1000), "the whole budget for the owner");
    }

    #[test]
    fn agents_hold_half_one_realm_a_quarter_and_the_owner_keeps_the_rest() {
        let b = FrameBudget::new(1000);
        let mut box1 = b.share(Some("remote:box")).claim();
        let mut box2 = b.share(Some("remote:box")).claim();
        assert!(box1.hold(250));
        assert!(!box2.hold(1), "one realm: a quarter at most");
        assert_eq!(realm_held(&b, "remote:box"), 250);
        let mut other = b.share(Some("container:mnt:[1]")).claim();
        assert!(!other.hold(251), "agents together: half at most");
        assert!(other.hold(250));
        let mut third = b.share(Some("container:mnt:[2]")).claim();
        assert!(
            !third.hold(1),
            "agents hold half: a third realm has to wait"
        );
        assert_eq!(realm_held(&b, "container:mnt:[2]"), 0, "undone");
        assert_eq!(b.agents.load(Ordering::Relaxed), 500);
        let mut owner = b.share(None).claim();
        assert!(owner.hold(500), "the owner's half is untouched");
        assert!(!owner.hold(501));
        drop((box1, box2, other, third, owner));
        assert_eq!(b.held(), 0);
        assert_eq!(b.agents.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_agent_refused_by_the_total_takes_nothing_anywhere() {
        let b = FrameBudget::new(1000);
        let mut owner = b.share(None).claim();
        assert!(owner.hold(900));
        let mut agent = b.share(Some("remote:box")).claim();
        assert!(!agent.hold(200), "within its shares, over the total");
        assert_eq!(realm_held(&b, "remote:box"), 0);
        assert_eq!(b.agents.load(Ordering::Relaxed), 0);
        assert_eq!(b.held(), 900);
    }

    #[test]
    fn a_realm_whose_connections_left_is_forgotten() {
        let b = FrameBudget::new(1000);
        for i in 0..100 {
            drop(b.share(Some(&format!("container:mnt:[{i}]"))));
        }
        let _kept = b.share(Some("remote:box"));
        assert_eq!(platform::sync::lock(&b.realms).len(), 1);
    }
}
