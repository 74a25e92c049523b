//! Editor identity (`Book`): which id an editor server gets, and whose successor it is.
//!
//! Editor identity: which id a lockfile's editor gets, and when a new editor is the successor
//! of one that is gone. Bookkeeping without tasks or sockets (it asks the OS only for a
//! process's facts, through `platform::process`), persisted in `state.json`, so
//! ids hold across broker restarts and never depend on the order lockfiles are read in.
//!
//! The rules (ARCHITECTURE.md "Identity"):
//! - **Same editor** = same server process: pid, port, and the process start time
//!   (boot-relative clock ticks from `/proc`, where known). It keeps its id for its life.
//! - **Successor**: a newcomer (no known process) inherits the id of a *gone* editor with the
//!   same lineage (family, ideName, folders); of several, the one most recently lost. A gone
//!   editor's own process on a new port (its server moved) takes its id back first.
//! - **Ambiguity is never guessed**: two newcomers of one lineage in the same batch while a
//!   predecessor waits, or two predecessors lost at the same instant, give fresh ids; the
//!   predecessors are dropped (and with them the sticky targets naming them).

use crate::protocol::family::Family;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a restart of the same editor keeps: family, ideName and workspace folders.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Lineage {
    /// Dialect and lock dir family.
    pub family: Family,
    /// `ideName` from the lockfile.
    pub ide_name: String,
    /// Workspace folders as written in the lockfile.
    pub folders: Vec<String>,
}

impl Lineage {
    /// A readable id for the first editor of this lineage: `<ide name>-<6 hex of a hash>`.
    pub fn base_id(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut feed = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            h ^= 0xff;
            h = h.wrapping_mul(0x0100_0000_01b3);
        };
        feed(self.family.as_str().as_bytes());
        feed(self.ide_name.as_bytes());
        for f in &self.folders {
            feed(f.as_bytes());
        }
        let slug: String = self
            .ide_name
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(16)
            .collect::<String>()
            .to_ascii_lowercase();
        let slug = if slug.is_empty() {
            "editor".into()
        } else {
            slug
        };
        format!("{slug}-{:06x}", h & 0xff_ffff)
    }
}

/// One editor process: what "the same editor" means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// When it started, in clock ticks since boot (`None` where the OS does not tell).
    #[serde(default)]
    pub start: Option<u64>,
    /// The port its server listened on.
    pub port: u16,
}

impl Process {
    /// True when `other` is this same editor server: same pid, same port (one process may
    /// serve several windows, e.g. JetBrains), and the same start time where both are known
    /// (a recycled pid is another process).
    pub fn same_as(&self, other: &Process) -> bool {
        self.pid == other.pid
            && self.port == other.port
            && match (self.start, other.start) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

/// What the broker remembers of one editor id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Family, ideName and folders.
    pub lineage: Lineage,
    /// The process currently (or last) holding the id.
    pub process: Process,
    /// The pid of the process it succeeded, if it is a successor.
    #[serde(default)]
    pub previous_pid: Option<u32>,
    /// The port of the process it succeeded.
    #[serde(default)]
    pub previous_port: Option<u16>,
    /// How many successions this id has seen.
    #[serde(default)]
    pub restarts: u32,
    /// When it was lost (unix ms); `None` while it is live.
    #[serde(default)]
    pub lost_at: Option<u64>,
}

/// An editor whose lockfile was just read, asking for its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Family, ideName and folders.
    pub lineage: Lineage,
    /// Its process.
    pub process: Process,
}

/// How an arrival got its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A process the broker already knew (a rewritten lockfile, or a broker restart).
    Same,
    /// The successor of a gone editor: its id, sessions and sticky targets.
    Successor {
        /// The predecessor's pid.
        previous_pid: u32,
        /// The predecessor's port.
        previous_port: u16,
    },
    /// A new editor (possibly because its succession was ambiguous).
    New,
}

/// The id given to one arrival.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assigned {
    /// The arrival's process.
    pub process: Process,
    /// Its id.
    pub id: String,
    /// Why.
    pub verdict: Verdict,
    /// How many successions its id has seen (from its record).
    pub restarts: u32,
    /// The pid of the editor its id last passed from, if any (from its record).
    pub previous_pid: Option<u32>,
    /// The port of that editor.
    pub previous_port: Option<u16>,
}

/// The outcome of resolving a batch of arrivals.
#[derive(Debug, Default)]
pub struct Resolution {
    /// One entry per arrival, in the order given.
    pub assigned: Vec<Assigned>,
    /// Live ids whose process turned out to be dead: the registry retires them (their
    /// successor may be in `assigned`).
    pub died: Vec<String>,
    /// Gone ids whose succession was ambiguous: forgotten, sticky targets naming them too.
    pub dropped: Vec<String>,
}

/// Every editor id the broker knows, live or recently lost. Serialised in `state.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Book {
    records: BTreeMap<String, Record>,
}

impl Book {
    /// The record of `id`.
    pub fn get(&self, id: &str) -> Option<&Record> {
        self.records.get(id)
    }

    /// Every record, by id.
    pub fn records(&self) -> &BTreeMap<String, Record> {
        &self.records
    }

    /// After loading from disk: every record that was live when the broker stopped is lost as
    /// of `saved_at` (the arrivals of the first scan revive the ones still running).
    pub fn loaded(&mut self, saved_at: u64) {
        for r in self.records.values_mut() {
            r.lost_at.get_or_insert(saved_at);
        }
    }

    /// Marks `id` lost now (its lockfile vanished, its pid died, or its link gave up), if the
    /// record still names `holder` (pid and port): a retired handle whose id already passed to
    /// a successor must not mark the successor lost while it runs.
    pub fn lost(&mut self, id: &str, holder: &Process, now: u64) {
        if let Some(r) = self.records.get_mut(id) {
            if r.process.same_as(holder) {
                r.lost_at.get_or_insert(now);
            }
        }
    }

    /// Forgets `id` entirely.
    pub fn forget(&mut self, id: &str) {
        self.records.remove(id);
    }

    /// Forgets lost records older than `window_ms`, and the oldest beyond `cap`; returns their ids.
    pub fn prune(&mut self, now: u64, window_ms: u64, cap: usize) -> Vec<String> {
        let mut gone: Vec<String> = self
            .records
            .iter()
            .filter(|(_, r)| r.lost_at.is_some_and(|t| now.saturating_sub(t) > window_ms))
            .map(|(id, _)| id.clone())
            .collect();
        let mut lost: Vec<(u64, String)> = self
            .records
            .iter()
            .filter(|(id, _)| !gone.contains(id))
            .filter_map(|(id, r)| r.lost_at.map(|t| (t, id.clone())))
            .collect();
        if self.records.len() - gone.len() > cap {
            lost.sort();
            let excess = self.records.len() - gone.len() - cap;
            gone.extend(lost.into_iter().take(excess).map(|(_, id)| id));
        }
        for id in &gone {
            self.records.remove(id);
        }
        gone
    }

    /// Gives every arrival its id. `alive` says whether a process is still running (pid alive
    /// and the same start time); live records whose process is dead are lost first, so a
    /// restart faster than any link timeout is recognised all the same.
    pub fn resolve(
        &mut self,
        arrivals: &[Arrival],
        alive: &dyn Fn(&Process) -> bool,
        now: u64,
    ) -> Resolution {
        let mut out = Resolution::default();
        // 1. Live records of a lineage that has newcomers: is their process still there?
        self.mark_dead(arrivals, alive, now, &mut out);
        // 2. Known processes keep their id, whatever else happened.
        let mut assigned: Vec<Option<Assigned>> =
            arrivals.iter().map(|a| self.keep_known(a)).collect();
        // 3. A known process whose server moved to a new port takes its own lost id back.
        let mut order: Vec<usize> = (0..arrivals.len()).collect();
        order.sort_by_key(|&i| (arrivals[i].process.pid, arrivals[i].process.port));
        for &i in &order {
            if assigned[i].is_none() {
                if let Some(id) = self.moved(&arrivals[i]) {
                    assigned[i] = Some(self.assign(&arrivals[i], Some(id), &out.dropped));
                }
            }
        }
        // 4. Newcomers, one lineage at a time (order-independent: grouped, then by process).
        let mut groups: BTreeMap<&Lineage, Vec<usize>> = BTreeMap::new();
        for (i, a) in arrivals.iter().enumerate() {
            if assigned[i].is_none() {
                groups.entry(&a.lineage).or_default().push(i);
            }
        }
        for (lineage, mut newcomers) in groups {
            newcomers.sort_by_key(|&i| {
                let p = arrivals[i].process;
                (p.pid, p.port, p.start)
            });
            // One server announced twice in a batch gets one id (filled in below).
            newcomers.dedup_by_key(|&mut i| (arrivals[i].process.pid, arrivals[i].process.port));
            let heir = self.heir(lineage, newcomers.len(), &mut out);
            for &i in &newcomers {
                assigned[i] = Some(self.assign(&arrivals[i], heir.clone(), &out.dropped));
            }
        }
        // 5. A duplicate arrival of one process (same pid twice in a batch) shares its id.
        for i in 0..arrivals.len() {
            if assigned[i].is_none() {
                let p = arrivals[i].process;
                let twin = (0..arrivals.len())
                    .filter(|&j| arrivals[j].lineage == arrivals[i].lineage)
                    .find_map(|j| assigned[j].clone().filter(|x| x.process.same_as(&p)));
                assigned[i] = twin;
            }
        }
        out.assigned = assigned.into_iter().flatten().collect();
        out
    }

    /// Step 1: a live record whose lineage has newcomers and whose process is gone (and not
    /// among the arrivals) is lost from `now`.
    fn mark_dead(
        &mut self,
        arrivals: &[Arrival],
        alive: &dyn Fn(&Process) -> bool,
        now: u64,
        out: &mut Resolution,
    ) {
        let lineages: Vec<&Lineage> = arrivals.iter().map(|a| &a.lineage).collect();
        for (id, r) in self.records.iter_mut() {
            if r.lost_at.is_none() && lineages.contains(&&r.lineage) && !alive(&r.process) {
                let revived = arrivals
                    .iter()
                    .any(|a| a.lineage.family == r.lineage.family && a.process.same_as(&r.process));
                if !revived {
                    r.lost_at = Some(now);
                    out.died.push(id.clone());
                }
            }
        }
    }

    /// Step 2: an arrival of a process a record knows keeps that record's id (found again).
    fn keep_known(&mut self, a: &Arrival) -> Option<Assigned> {
        let (id, r) = self
            .records
            .iter_mut()
            .find(|(_, r)| r.lineage.family == a.lineage.family && r.process.same_as(&a.process))?;
        r.lost_at = None;
        r.process = a.process;
        r.lineage = a.lineage.clone();
        Some(Assigned {
            process: a.process,
            id: id.clone(),
            verdict: Verdict::Same,
            restarts: r.restarts,
            previous_pid: r.previous_pid,
            previous_port: r.previous_port,
        })
    }

    /// Step 3: the lost id of this very process (same pid and start time, both known) on
    /// another port: its server moved (old lockfile gone, new one written). Not a guess,
    /// whatever else of the lineage was lost at the same instant.
    /// Of several such ids (windows of one process), the one lost last; a tie is left to
    /// the lineage's rule.
    fn moved(&self, a: &Arrival) -> Option<String> {
        let start = a.process.start?;
        let own: Vec<(u64, &String)> = self
            .records
            .iter()
            .filter(|(_, r)| {
                r.lineage == a.lineage
                    && r.process.pid == a.process.pid
                    && r.process.start == Some(start)
            })
            .filter_map(|(id, r)| r.lost_at.map(|t| (t, id)))
            .collect();
        latest_untied(own).cloned()
    }

    /// The id `newcomers` new processes of `lineage` inherit: the one lost record, lost last,
    /// when there is exactly one newcomer for it. Several newcomers for a predecessor, or
    /// predecessors lost at the same instant, would make any choice a guess: those records
    /// are dropped and nobody inherits.
    fn heir(
        &mut self,
        lineage: &Lineage,
        newcomers: usize,
        out: &mut Resolution,
    ) -> Option<String> {
        let preds: Vec<(u64, String)> = self
            .records
            .iter()
            .filter(|(_, r)| &r.lineage == lineage)
            .filter_map(|(id, r)| r.lost_at.map(|t| (t, id.clone())))
            .collect();
        if preds.is_empty() {
            return None;
        }
        if let Some(id) = (newcomers == 1)
            .then(|| latest_untied(preds.clone()))
            .flatten()
        {
            return Some(id);
        }
        for (_, id) in preds {
            self.records.remove(&id);
            out.dropped.push(id);
        }
        None
    }

    /// A newcomer's record: the heir's id, as its successor (restarts counted), or a fresh id.
    fn assign(&mut self, a: &Arrival, heir: Option<String>, dropped: &[String]) -> Assigned {
        let (id, verdict, previous, restarts) = match heir {
            Some(id) => {
                let (pid, port, restarts) = self
                    .records
                    .get(&id)
                    .map(|r| (r.process.pid, r.process.port, r.restarts))
                    .unwrap_or((0, 0, 0));
                let verdict = Verdict::Successor {
                    previous_pid: pid,
                    previous_port: port,
                };
                (id, verdict, Some((pid, port)), restarts + 1)
            }
            None => (self.fresh_id(&a.lineage, dropped), Verdict::New, None, 0),
        };
        self.records.insert(
            id.clone(),
            Record {
                lineage: a.lineage.clone(),
                process: a.process,
                previous_pid: previous.map(|p| p.0),
                previous_port: previous.map(|p| p.1),
                restarts,
                lost_at: None,
            },
        );
        Assigned {
            process: a.process,
            restarts,
            previous_pid: previous.map(|p| p.0),
            previous_port: previous.map(|p| p.1),
            id,
            verdict,
        }
    }

    /// The first of `base`, `base-2`, `base-3`… that no record (live or lost) holds and
    /// that was not just dropped.
    fn fresh_id(&self, lineage: &Lineage, dropped: &[String]) -> String {
        let base = lineage.base_id();
        let mut id = base.clone();
        let mut n = 2;
        while self.records.contains_key(&id) || dropped.contains(&id) {
            id = format!("{base}-{n}");
            n += 1;
        }
        id
    }
}

/// Of ids with the times they were lost, the one lost last; `None` when none, or when two were
/// lost at that same instant (a choice between them would be a guess).
fn latest_untied<T: Ord>(mut lost: Vec<(u64, T)>) -> Option<T> {
    lost.sort_by(|a, b| b.cmp(a));
    let mut it = lost.into_iter();
    let (t0, first) = it.next()?;
    match it.next() {
        Some((t1, _)) if t1 == t0 => None,
        _ => Some(first),
    }
}

/// What the registry learns from outside about editor processes, and the clock it stamps
/// losses with: the OS in the daemon ([`Os`]), a table in the registry's model test.
pub(crate) trait ProcessFacts: Send + Sync + 'static {
    /// When `pid` started, as a token equal for the same process (`None` where unknown).
    fn start_token(&self, pid: u32) -> Option<u64>;
    /// True when `p` still runs (its pid is alive and, where known, started when it did).
    fn alive(&self, p: &Process) -> bool;
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The real process facts: `/proc` (or libproc) and the wall clock.
pub(super) struct Os;

impl ProcessFacts for Os {
    fn start_token(&self, pid: u32) -> Option<u64> {
        process_start_ticks(pid)
    }

    fn alive(&self, p: &Process) -> bool {
        process_alive(p)
    }

    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// When process `pid` started, as an opaque token equal for the same process (Linux: clock
/// ticks since boot; macOS: microseconds since the epoch; `None` where unknown).
pub(super) fn process_start_ticks(pid: u32) -> Option<u64> {
    crate::platform::process::start_token(pid)
}

/// True when `p` is still running: its pid is alive and (where known) started when it did.
pub(super) fn process_alive(p: &Process) -> bool {
    let Some(now) = crate::platform::process::running(p.pid) else {
        return false;
    };
    match (p.start, now.start) {
        (Some(want), Some(now)) => want == now,
        _ => true,
    }
}

#[cfg(test)]
mod tests;
