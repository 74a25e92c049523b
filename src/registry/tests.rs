//! The registry held to a reference model (issue 38). Generated sequences of what happens to
//! editors (start, clean exit, kill with the lockfile left, fast restart, a second window of the
//! same process, a rewritten lockfile, a broker restart) and to sessions (open with or without a
//! key, inherit with `/new`, choose with `/ide`, switch off, close) are applied to the real
//! [`Registry`] and to [`Model`], a few rules written for this test alone; after every step
//! the observable state of both is compared (editors, link use, identity book, sessions,
//! sticky targets) and the invariants are checked by name on the real registry.
//!
//! The registry runs with process facts from a table (pid, start token, running or not) and a
//! clock of the test's own; no link task is spawned: the test says when a link is up, as the
//! link task would by `editor_ready`. Lockfile reading (`lockdir`, `lockfile`) is not modelled:
//! the events are the ones the watcher emits for the files the world holds.

use super::identity::{Lineage, Process, ProcessFacts};
use super::*;
use crate::editor::lockfile::Lockfile;
use crate::editor::{LinkHost, LinkState};
use crate::protocol::family::Family;
use crate::registry::lifecycle::watch::LockEvent;
use crate::registry::session::{Door, Intro};
use crate::wire::outbox::Outbox;
use crate::wire::wsframe::{FrameWriter, Role};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The lineages editors come in: (folder, ideName). Two share folder 0.
const LINEAGES: [(usize, &str); 3] = [(0, "Neovim"), (0, "Emacs"), (1, "Neovim")];
/// Session keys; a key always comes from the same folder (`k<i>` from folder `i % 2`).
const KEYS: usize = 4;

fn lineage(l: usize) -> Lineage {
    let (folder, name) = LINEAGES[l];
    Lineage {
        family: Family::Pi,
        ide_name: name.into(),
        folders: vec![folder_path(folder)],
    }
}

fn folder_path(f: usize) -> String {
    format!("/proj/{f}")
}

fn key(k: usize) -> String {
    format!("k{k}")
}

/// The realm of the model's agent sessions, as the native door names a remote's.
const AGENT_REALM: &str = "remote:m";

/// Process facts from a table the test writes: pid → (start token, running), and its clock.
#[derive(Default)]
struct Table {
    procs: Mutex<HashMap<u32, (u64, bool)>>,
    now: AtomicU64,
}

impl ProcessFacts for Table {
    fn start_token(&self, pid: u32) -> Option<u64> {
        lock(&self.procs).get(&pid).map(|p| p.0)
    }

    fn alive(&self, p: &Process) -> bool {
        lock(&self.procs)
            .get(&p.pid)
            .is_some_and(|&(start, running)| running && p.start.is_none_or(|s| s == start))
    }

    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
}

/// One step of the world.
#[derive(Clone, Debug)]
enum Op {
    /// A new editor process of a lineage; its link comes up at once or later.
    Start { lineage: usize, up: bool },
    /// The same process opens a second server (a JetBrains project window).
    Window(usize),
    /// A running editor exits cleanly: its lockfile goes with it.
    Exit(usize),
    /// A running editor is killed and its lockfile left; its link may notice.
    Kill { which: usize, noticed: bool },
    /// Killed (lockfile left) and started again at once.
    Restart(usize),
    /// A link not up comes up (its editor still runs).
    LinkUp(usize),
    /// The lockfile is rewritten with a new token.
    NewToken(usize),
    /// The server moves to a new port (old lockfile removed, new one written, same pid).
    NewPort(usize),
    /// The broker stops (state saved) and starts again, reading the lock dir anew.
    BrokerRestart(u64),
    /// A single-client editor is held by the user's other client (its link closed for it, or
    /// never had): `taken`, still routable.
    Taken(usize),
    /// A session connects, with a key or not, inheriting another key's target or not; the
    /// owner's or an agent's (whose keys are its realm's: `AGENT_REALM/<key>`).
    Open {
        key: Option<usize>,
        folder: usize,
        inherit: Option<usize>,
        agent: bool,
    },
    /// `/ide`: a session chooses an editor.
    Choose { session: usize, editor: usize },
    /// `/ide` off.
    Off(usize),
    /// A session goes away.
    Close(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..LINEAGES.len(), prop::bool::weighted(0.8))
            .prop_map(|(lineage, up)| Op::Start { lineage, up }),
        1 => (0usize..8).prop_map(Op::Window),
        2 => (0usize..8).prop_map(Op::Exit),
        2 => (0usize..8, any::<bool>()).prop_map(|(which, noticed)| Op::Kill { which, noticed }),
        3 => (0usize..8).prop_map(Op::Restart),
        1 => (0usize..8).prop_map(Op::LinkUp),
        1 => (0usize..8).prop_map(Op::NewToken),
        1 => (0usize..8).prop_map(Op::NewPort),
        2 => any::<u64>().prop_map(Op::BrokerRestart),
        2 => (0usize..8).prop_map(Op::Taken),
        4 => (
            prop::option::weighted(0.8, 0..KEYS),
            0usize..2,
            prop::option::weighted(0.3, 0..KEYS),
            prop::bool::weighted(0.3),
        )
            .prop_map(|(key, folder, inherit, agent)| Op::Open { key, folder, inherit, agent }),
        2 => (0usize..8, 0usize..8).prop_map(|(session, editor)| Op::Choose { session, editor }),
        1 => (0usize..8).prop_map(Op::Off),
        1 => (0usize..8).prop_map(Op::Close),
    ]
}

/// An editor server of the world (a process may hold several: windows).
#[derive(Clone, Debug)]
struct Server {
    lineage: usize,
    pid: u32,
    port: u16,
    running: bool,
    /// Its lockfile is on disk.
    lockfile: bool,
}

/// What the model remembers of an id.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Rec {
    lineage: usize,
    pid: u32,
    port: u16,
    lost_at: Option<u64>,
}

/// A session as the model sees it.
#[derive(Clone, Debug)]
struct Sess {
    key: Option<String>,
    folder: usize,
    editor: Option<String>,
    /// Switched off by its client (`/ide` off): never placed again until it chooses.
    off: bool,
    /// An agent's session (`frontdoor::rights`): its keys are its realm's, and it may choose
    /// only an editor of its own folder.
    agent: bool,
}

/// The reference model: identity, succession, routing and sticky targets, as the rules say.
#[derive(Default)]
struct Model {
    recs: BTreeMap<String, Rec>,
    /// The registry's editors: id → (pid, port, lineage).
    live: BTreeMap<String, (u32, u16, usize)>,
    /// Ids whose link is up.
    up: BTreeSet<String>,
    /// Ids held by another client (`taken`): not up, but sessions are routed to them.
    taken: BTreeSet<String>,
    sessions: BTreeMap<u64, Sess>,
    sticky: BTreeMap<String, String>,
}

impl Model {
    /// Where routing puts a session now (`None`: no editor, or a tie to ask about). A sticky
    /// target that is an editor no longer covering the session's folder is forgotten.
    fn decide(&mut self, sid: u64) -> Option<String> {
        let s = &self.sessions[&sid];
        let cands: Vec<String> = self
            .routable()
            .into_iter()
            .filter(|id| LINEAGES[self.live[id].2].0 == s.folder)
            .collect();
        let key = s.key.clone();
        let sticky = key.as_ref().and_then(|k| self.sticky.get(k).cloned());
        if let (Some(k), Some(t)) = (&key, &sticky) {
            if self
                .live
                .get(t)
                .is_some_and(|e| LINEAGES[e.2].0 != s.folder)
            {
                self.sticky.remove(k);
            }
        }
        match sticky {
            Some(t) if cands.contains(&t) => Some(t),
            _ if cands.len() == 1 => cands.first().cloned(),
            _ => None,
        }
    }

    /// The editors sessions may be routed to: up, or taken by another client.
    fn routable(&self) -> BTreeSet<String> {
        self.up.union(&self.taken).cloned().collect()
    }

    fn attach(&mut self, sid: u64, id: &str) {
        let s = self.sessions.get_mut(&sid).expect("model session");
        s.editor = Some(id.to_string());
        s.off = false;
        if let Some(k) = &s.key {
            self.sticky.insert(k.clone(), id.to_string());
        }
    }

    fn place(&mut self, sid: u64) {
        let s = &self.sessions[&sid];
        if s.editor.is_some() || s.off {
            return;
        }
        if let Some(id) = self.decide(sid) {
            self.attach(sid, &id);
        }
    }

    fn place_all(&mut self) {
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        for sid in ids {
            self.place(sid);
        }
    }

    /// An id lost for good: its sticky targets go, its sessions are routed again.
    fn forget(&mut self, id: &str) {
        self.sticky.retain(|_, t| t != id);
        let on: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.editor.as_deref() == Some(id))
            .map(|(sid, _)| *sid)
            .collect();
        for sid in on {
            if let Some(s) = self.sessions.get_mut(&sid) {
                s.editor = None;
                s.off = false;
            }
            self.place(sid);
        }
    }

    /// The registry lets go of an editor handle: the id is lost if it still names that server.
    fn retire(&mut self, id: &str, now: u64) {
        let Some((pid, port, _)) = self.live.remove(id) else {
            return;
        };
        self.up.remove(id);
        self.taken.remove(id);
        if let Some(r) = self.recs.get_mut(id) {
            if r.pid == pid && r.port == port && r.lost_at.is_none() {
                r.lost_at = Some(now);
            }
        }
    }

    /// New servers get their ids: known servers keep theirs; a newcomer inherits the id of the
    /// one lost server of its lineage lost last, when it is the only newcomer and that loss is
    /// not tied; otherwise every lost server of the lineage is forgotten and ids are fresh.
    fn admit(&mut self, arrivals: &[(usize, u32, u16)], running: &dyn Fn(u32) -> bool, now: u64) {
        let lineages: BTreeSet<usize> = arrivals.iter().map(|a| a.0).collect();
        let mut died = Vec::new();
        for (id, r) in self.recs.iter_mut() {
            let revived = arrivals.iter().any(|a| (a.1, a.2) == (r.pid, r.port));
            if r.lost_at.is_none() && lineages.contains(&r.lineage) && !running(r.pid) && !revived {
                r.lost_at = Some(now);
                died.push(id.clone());
            }
        }
        let mut ids: Vec<Option<String>> = vec![None; arrivals.len()];
        for (i, a) in arrivals.iter().enumerate() {
            if let Some((id, r)) = self
                .recs
                .iter_mut()
                .find(|(_, r)| (r.pid, r.port) == (a.1, a.2))
            {
                r.lost_at = None;
                ids[i] = Some(id.clone());
            }
        }
        // A lost server's own process on a new port takes its id back.
        let mut order: Vec<usize> = (0..arrivals.len()).collect();
        order.sort_by_key(|&i| (arrivals[i].1, arrivals[i].2));
        for i in order {
            let a = arrivals[i];
            if ids[i].is_some() {
                continue;
            }
            let mut own: Vec<(u64, String)> = self
                .recs
                .iter()
                .filter(|(_, r)| r.lineage == a.0 && r.pid == a.1)
                .filter_map(|(id, r)| r.lost_at.map(|t| (t, id.clone())))
                .collect();
            own.sort_by(|x, y| y.cmp(x));
            if let [(t0, id), rest @ ..] = own.as_slice() {
                if rest.first().is_none_or(|(t1, _)| t1 < t0) {
                    if let Some(r) = self.recs.get_mut(id) {
                        (r.port, r.lost_at) = (a.2, None);
                    }
                    ids[i] = Some(id.clone());
                }
            }
        }
        let mut dropped: Vec<String> = Vec::new();
        for l in &lineages {
            let newcomers: Vec<usize> = (0..arrivals.len())
                .filter(|&i| ids[i].is_none() && arrivals[i].0 == *l)
                .collect();
            if newcomers.is_empty() {
                continue;
            }
            let mut preds: Vec<(u64, String)> = self
                .recs
                .iter()
                .filter(|(_, r)| r.lineage == *l)
                .filter_map(|(id, r)| r.lost_at.map(|t| (t, id.clone())))
                .collect();
            preds.sort_by(|a, b| b.cmp(a));
            let heir = match preds.as_slice() {
                [] => None,
                [(t0, id), rest @ ..]
                    if newcomers.len() == 1 && rest.first().is_none_or(|(t1, _)| t1 < t0) =>
                {
                    Some(id.clone())
                }
                _ => {
                    for (_, id) in &preds {
                        self.recs.remove(id);
                        dropped.push(id.clone());
                    }
                    None
                }
            };
            let mut newcomers = newcomers;
            newcomers.sort_by_key(|&i| (arrivals[i].1, arrivals[i].2));
            for i in newcomers {
                let id = heir.clone().unwrap_or_else(|| {
                    let base = lineage(*l).base_id();
                    let mut id = base.clone();
                    let mut n = 2;
                    while self.recs.contains_key(&id) || dropped.contains(&id) {
                        id = format!("{base}-{n}");
                        n += 1;
                    }
                    id
                });
                let (_, pid, port) = arrivals[i];
                self.recs.insert(
                    id.clone(),
                    Rec {
                        lineage: *l,
                        pid,
                        port,
                        lost_at: None,
                    },
                );
                ids[i] = Some(id);
            }
        }
        for id in &died {
            self.retire(id, now);
        }
        for id in &dropped {
            self.forget(id);
        }
        for (a, id) in arrivals.iter().zip(ids) {
            let id = id.expect("every arrival has an id");
            self.up.remove(&id);
            self.taken.remove(&id);
            self.live.insert(id, (a.1, a.2, a.0));
        }
    }

    /// A link comes up: waiting sessions are placed.
    fn link_up(&mut self, id: &str) {
        self.taken.remove(id);
        self.up.insert(id.to_string());
        self.place_all();
    }

    /// Another client holds the editor: it stays routable, and waiting sessions are placed.
    fn taken(&mut self, id: &str) {
        self.up.remove(id);
        self.taken.insert(id.to_string());
        self.place_all();
    }
}

/// The real registry, the world it sees, and the model, stepped together.
struct Harness {
    dir: tempfile::TempDir,
    facts: Arc<Table>,
    reg: Arc<Registry>,
    /// Model session id → the real session.
    sessions: BTreeMap<u64, Arc<Session>>,
    servers: Vec<Server>,
    next_pid: u32,
    next_port: u16,
    next_sid: u64,
    model: Model,
    /// The id each server first got: a running server keeps it.
    first_id: HashMap<usize, String>,
    /// The server last seen holding each id.
    holder: HashMap<String, usize>,
}

fn registry(dir: &std::path::Path, facts: &Arc<Table>) -> Arc<Registry> {
    let config = Config {
        state_dir: Some(dir.to_path_buf()),
        home: Some(dir.join("home")),
        // Far longer than any test: the grace timer never moves a session here.
        editor_grace_ms: 3_600_000,
        ..Config::default()
    };
    Registry::with_facts(
        Arc::new(config),
        StateStore::load(dir),
        dir.join("sock"),
        CancellationToken::new(),
        facts.clone(),
        false,
    )
}

impl Harness {
    fn new() -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let facts = Arc::new(Table::default());
        facts.now.store(1_000_000, Ordering::Relaxed);
        let reg = registry(dir.path(), &facts);
        Harness {
            dir,
            facts,
            reg,
            sessions: BTreeMap::new(),
            servers: Vec::new(),
            next_pid: 100,
            next_port: 20_000,
            next_sid: 0,
            model: Model::default(),
            first_id: HashMap::new(),
            holder: HashMap::new(),
        }
    }

    fn now(&self) -> u64 {
        self.facts.now_ms()
    }

    fn tick(&self) {
        self.facts.now.fetch_add(1000, Ordering::Relaxed);
    }

    fn lockfile(&self, i: usize, token: &str) -> Lockfile {
        let s = &self.servers[i];
        let l = lineage(s.lineage);
        Lockfile {
            path: self.dir.path().join(format!("{}.lock", s.port)),
            family: l.family,
            port: s.port,
            pid: s.pid,
            workspace_folders: l.folders,
            ide_name: l.ide_name,
            auth_token: Some(crate::sys::secret::Token::new(token.into())),
            wsl: None,
        }
    }

    fn running(&self) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| self.servers[i].running)
            .collect()
    }

    fn set_running(&self, pid: u32, running: bool) {
        if let Some(p) = lock(&self.facts.procs).get_mut(&pid) {
            p.1 = running;
        }
    }

    /// The registry's id for server `i`, if it holds one.
    fn id_of(&self, i: usize) -> Option<String> {
        let s = &self.servers[i];
        self.model
            .live
            .iter()
            .find(|(_, e)| (e.0, e.1) == (s.pid, s.port))
            .map(|(id, _)| id.clone())
    }

    /// Plays the link of `id` coming up, as `editor::announce_ready` does.
    fn link_up(&mut self, id: &str) {
        if let Some(e) = self.reg.editor(id) {
            e.set_state(LinkState::Ready);
            self.reg.editor_ready(&e);
        }
        self.model.link_up(id);
    }

    fn admit(&mut self, events: Vec<LockEvent>, arrivals: &[usize]) {
        let now = self.now();
        self.reg.apply_batch(events);
        let a: Vec<(usize, u32, u16)> = arrivals
            .iter()
            .map(|&i| {
                (
                    self.servers[i].lineage,
                    self.servers[i].pid,
                    self.servers[i].port,
                )
            })
            .collect();
        let running: Vec<u32> = self
            .servers
            .iter()
            .filter(|s| s.running)
            .map(|s| s.pid)
            .collect();
        self.model.admit(&a, &|pid| running.contains(&pid), now);
    }

    fn start(&mut self, l: usize, up: bool, pid: Option<u32>) {
        let pid = pid.unwrap_or_else(|| {
            self.next_pid += 1;
            let start = u64::from(self.next_pid) * 3;
            lock(&self.facts.procs).insert(self.next_pid, (start, true));
            self.next_pid
        });
        self.next_port += 1;
        self.servers.push(Server {
            lineage: l,
            pid,
            port: self.next_port,
            running: true,
            lockfile: true,
        });
        let i = self.servers.len() - 1;
        let lf = self.lockfile(i, "t0");
        self.admit(vec![LockEvent::Upsert(lf)], &[i]);
        if let (true, Some(id)) = (up, self.id_of(i)) {
            self.link_up(&id);
        }
    }

    fn kill(&mut self, i: usize, noticed: bool) {
        let pid = self.servers[i].pid;
        self.set_running(pid, false);
        for j in 0..self.servers.len() {
            if self.servers[j].pid != pid {
                continue;
            }
            self.servers[j].running = false;
            if let (true, Some(id)) = (noticed, self.id_of(j)) {
                if let Some(e) = self.reg.editor(&id) {
                    e.set_state(LinkState::Backoff);
                    self.reg.changed();
                }
                self.model.up.remove(&id);
                self.model.taken.remove(&id);
            }
        }
    }

    fn open_session(&mut self, sid: u64, inherit: Option<String>) {
        let m = &self.model.sessions[&sid];
        let intro = Intro {
            door: Door::Native,
            cwd: folder_path(m.folder),
            key: m.key.clone(),
            editor: None,
            remote: None,
            pinned: false,
            inherit,
            family: Family::Pi,
            client: None,
            realm: m.agent.then(|| AGENT_REALM.to_string()),
        };
        let id = self.reg.next_session_id();
        let sink = FrameWriter::new(
            Box::pin(tokio::io::sink()) as std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
            Role::Server,
        );
        let outbox = Outbox::new(id, sink, self.reg.cancel.child_token(), &self.reg.tracker);
        let (control, _) = tokio::sync::mpsc::unbounded_channel();
        let s = crate::session::open(&self.reg, &intro, id, outbox, control);
        self.sessions.insert(sid, s);
    }

    fn broker_restart(&mut self, seed: u64) {
        let saved_at = self.now();
        let _ = self.reg.state.save_at(saved_at);
        self.reg.cancel.cancel();
        self.sessions.clear();
        self.tick();
        self.reg = registry(self.dir.path(), &self.facts);
        for r in self.model.recs.values_mut() {
            r.lost_at.get_or_insert(saved_at);
        }
        self.model.live.clear();
        self.model.up.clear();
        self.model.taken.clear();
        // Sessions are disconnected until the broker is back.
        let waiting = std::mem::take(&mut self.model.sessions);
        // The first scan: the lockfiles of running editors (a dead pid's file is refused).
        let mut scan: Vec<usize> = (0..self.servers.len())
            .filter(|&i| self.servers[i].running && self.servers[i].lockfile)
            .collect();
        let n = scan.len().max(1);
        scan.rotate_left(seed as usize % n);
        if seed % 2 == 1 {
            scan.reverse();
        }
        let events = scan
            .iter()
            .map(|&i| LockEvent::Upsert(self.lockfile(i, "t0")))
            .collect();
        self.admit(events, &scan);
        let ids: Vec<String> = self.model.live.keys().cloned().collect();
        for id in ids {
            self.link_up(&id);
        }
        // Every session reconnects with its key.
        for (sid, mut s) in waiting {
            s.editor = None;
            s.off = false;
            self.model.sessions.insert(sid, s);
            self.open_session(sid, None);
            self.model.place(sid);
        }
    }

    fn step(&mut self, op: &Op) {
        self.tick();
        let running = self.running();
        let pick = |i: usize| running.get(i % running.len().max(1)).copied();
        match *op {
            Op::Start { lineage, up } => self.start(lineage, up, None),
            Op::Window(i) => {
                if let Some(j) = pick(i) {
                    let (l, pid) = (self.servers[j].lineage, self.servers[j].pid);
                    self.start(l, true, Some(pid));
                }
            }
            Op::Exit(i) => {
                if let Some(j) = pick(i) {
                    let pid = self.servers[j].pid;
                    self.servers[j].running = false;
                    self.servers[j].lockfile = false;
                    // A window closing leaves its process running for its other windows.
                    if !self.servers.iter().any(|s| s.pid == pid && s.running) {
                        self.set_running(pid, false);
                    }
                    let path = self.lockfile(j, "t0").path;
                    self.reg.apply(LockEvent::Vanished(path));
                    if let Some(id) = self.id_of(j) {
                        self.model.retire(&id, self.now());
                    }
                }
            }
            Op::Kill { which, noticed } => {
                if let Some(j) = pick(which) {
                    self.kill(j, noticed);
                }
            }
            Op::Restart(i) => {
                if let Some(j) = pick(i) {
                    self.kill(j, false);
                    self.start(self.servers[j].lineage, true, None);
                }
            }
            Op::LinkUp(i) => {
                let down: Vec<String> = running
                    .iter()
                    .filter_map(|&j| self.id_of(j))
                    .filter(|id| !self.model.up.contains(id))
                    .collect();
                if let Some(id) = down.get(i % down.len().max(1)).cloned() {
                    self.link_up(&id);
                }
            }
            Op::NewToken(i) => {
                if let Some(j) = pick(i) {
                    self.reg.apply(LockEvent::Upsert(self.lockfile(j, "t1")));
                }
            }
            Op::NewPort(i) => {
                if let Some(j) = pick(i) {
                    let old = self.lockfile(j, "t0").path;
                    let old_id = self.id_of(j);
                    self.next_port += 1;
                    self.servers[j].port = self.next_port;
                    let new = self.lockfile(j, "t0");
                    if let Some(id) = old_id {
                        self.model.retire(&id, self.now());
                    }
                    self.admit(vec![LockEvent::Vanished(old), LockEvent::Upsert(new)], &[j]);
                    if let Some(id) = self.id_of(j) {
                        self.link_up(&id);
                    }
                }
            }
            Op::BrokerRestart(seed) => self.broker_restart(seed),
            Op::Taken(i) => {
                let live: Vec<String> = running
                    .iter()
                    .filter_map(|&j| self.id_of(j))
                    .filter(|id| !self.model.taken.contains(id))
                    .collect();
                if let Some(id) = live.get(i % live.len().max(1)).cloned() {
                    if let Some(e) = self.reg.editor(&id) {
                        crate::editor::taken::mark_taken(&e, &*self.reg, "held by another client");
                    }
                    self.model.taken(&id);
                }
            }
            Op::Open {
                key: k,
                folder,
                inherit,
                agent,
            } => {
                let sid = self.next_sid;
                self.next_sid += 1;
                // An agent's keys are its realm's, as `frontdoor::native` makes them.
                let scoped = |k: usize| {
                    if agent {
                        format!("{AGENT_REALM}/{}", key(k))
                    } else {
                        key(k)
                    }
                };
                let key_s = k.map(scoped);
                let folder = k.map_or(folder, |k| k % 2);
                let from = inherit.map(scoped).filter(|_| key_s.is_some());
                self.model.sessions.insert(
                    sid,
                    Sess {
                        key: key_s.clone(),
                        folder,
                        editor: None,
                        off: false,
                        agent,
                    },
                );
                if let (Some(k), Some(f)) = (&key_s, &from) {
                    if k != f && !self.model.sticky.contains_key(k) {
                        if let Some(t) = self.model.sticky.get(f).cloned() {
                            self.model.sticky.insert(k.clone(), t);
                        }
                    }
                }
                self.open_session(sid, from);
                self.model.place(sid);
            }
            Op::Choose { session, editor } => {
                let sids: Vec<u64> = self.model.sessions.keys().copied().collect();
                let ids: Vec<String> = self.model.live.keys().cloned().collect();
                if let (Some(&sid), Some(id)) = (
                    sids.get(session % sids.len().max(1)),
                    ids.get(editor % ids.len().max(1)),
                ) {
                    let r = self.reg.attach_explicit(&self.sessions[&sid], id);
                    let s = &self.model.sessions[&sid];
                    // An agent reaches only an editor of its own folder; the owner any.
                    let allowed = !s.agent || LINEAGES[self.model.live[id].2].0 == s.folder;
                    assert_eq!(r.is_ok(), allowed, "choosing {id} for {s:?}: {r:?}");
                    if allowed {
                        self.model.attach(sid, id);
                    }
                }
            }
            Op::Off(i) => {
                let sids: Vec<u64> = self.model.sessions.keys().copied().collect();
                if let Some(&sid) = sids.get(i % sids.len().max(1)) {
                    self.reg.detach(&self.sessions[&sid], "/ide off", true);
                    if let Some(s) = self.model.sessions.get_mut(&sid) {
                        s.editor = None;
                        s.off = true;
                        if let Some(k) = s.key.clone() {
                            self.model.sticky.remove(&k);
                        }
                    }
                }
            }
            Op::Close(i) => {
                let sids: Vec<u64> = self.model.sessions.keys().copied().collect();
                if let Some(&sid) = sids.get(i % sids.len().max(1)) {
                    if let Some(s) = self.sessions.remove(&sid) {
                        self.reg.end_session(&s);
                    }
                    self.model.sessions.remove(&sid);
                }
            }
        }
    }

    /// The registry's observable state next to the model's, after a step.
    fn compare(&self) -> Result<(), TestCaseError> {
        let editors: BTreeMap<String, (u32, u16)> = self
            .reg
            .editors()
            .iter()
            .map(|e| {
                let l = e.lockfile();
                (e.id.clone(), (l.pid, l.port))
            })
            .collect();
        let want: BTreeMap<String, (u32, u16)> = self
            .model
            .live
            .iter()
            .map(|(id, e)| (id.clone(), (e.0, e.1)))
            .collect();
        prop_assert_eq!(&editors, &want, "editors (id -> pid, port)");
        let usable: BTreeSet<String> = self
            .reg
            .editors()
            .iter()
            .filter(|e| e.usable())
            .map(|e| e.id.clone())
            .collect();
        prop_assert_eq!(&usable, &self.model.up, "editors whose link is up");
        let routable: BTreeSet<String> = self
            .reg
            .editors()
            .iter()
            .filter(|e| e.routable())
            .map(|e| e.id.clone())
            .collect();
        prop_assert_eq!(
            &routable,
            &self.model.routable(),
            "editors sessions may be routed to"
        );
        let book: BTreeMap<String, Rec> = self.reg.state.with_book(|b| {
            b.records()
                .iter()
                .map(|(id, r)| {
                    let l = (0..LINEAGES.len()).find(|&l| lineage(l) == r.lineage);
                    let rec = Rec {
                        lineage: l.unwrap_or(usize::MAX),
                        pid: r.process.pid,
                        port: r.process.port,
                        lost_at: r.lost_at,
                    };
                    (id.clone(), rec)
                })
                .collect()
        });
        prop_assert_eq!(&book, &self.model.recs, "identity book");
        for (sid, s) in &self.sessions {
            let m = &self.model.sessions[sid];
            let real = s.editor_id().map(|e| e.to_string());
            prop_assert_eq!(&real, &m.editor, "session {}'s editor", sid);
            let off = s.detached_by_client.load(Ordering::Relaxed);
            prop_assert_eq!(off, m.off, "session {} switched off", sid);
        }
        let sticky: BTreeMap<String, String> = self
            .reg
            .state
            .all_sticky()
            .into_iter()
            .map(|(k, t)| (k, t.editor))
            .collect();
        prop_assert_eq!(&sticky, &self.model.sticky, "sticky targets");
        Ok(())
    }

    /// The invariants, on the real registry and the world.
    fn invariants(&mut self) -> Result<(), TestCaseError> {
        no_two_live_editors_share_an_id(&self.reg)?;
        a_running_editor_is_never_retired_or_replaced(self)?;
        an_id_passes_only_from_a_dead_holder_of_its_lineage(self)?;
        a_sessions_editor_is_live_or_awaited(&self.reg)?;
        Ok(())
    }
}

/// Each live server holds one id, and no id names two servers.
fn no_two_live_editors_share_an_id(reg: &Registry) -> Result<(), TestCaseError> {
    let mut servers = BTreeSet::new();
    for e in reg.editors() {
        let l = e.lockfile();
        prop_assert!(
            servers.insert((l.pid, l.port)),
            "server {}:{} has two ids",
            l.pid,
            l.port
        );
    }
    Ok(())
}

/// A running editor whose lockfile is there stays in the registry with the id it first got,
/// across restarts of others, second windows and broker restarts.
fn a_running_editor_is_never_retired_or_replaced(h: &mut Harness) -> Result<(), TestCaseError> {
    for i in 0..h.servers.len() {
        let s = h.servers[i].clone();
        let held = h.reg.editors().into_iter().find(|e| {
            let l = e.lockfile();
            (l.pid, l.port) == (s.pid, s.port)
        });
        match (&held, h.first_id.get(&i)) {
            (Some(e), Some(first)) if s.running => {
                prop_assert_eq!(&e.id, first, "running server {} changed id", i)
            }
            (None, Some(first)) if s.running && s.lockfile => {
                return Err(TestCaseError::fail(format!(
                    "running server {i} ({first}) was retired"
                )))
            }
            (Some(e), None) => {
                h.first_id.insert(i, e.id.clone());
            }
            _ => {}
        }
    }
    Ok(())
}

/// An id moves from one server to another only as a succession: the one it leaves is dead and
/// of the same lineage.
fn an_id_passes_only_from_a_dead_holder_of_its_lineage(
    h: &mut Harness,
) -> Result<(), TestCaseError> {
    for e in h.reg.editors() {
        let l = e.lockfile();
        let Some(now) = h
            .servers
            .iter()
            .rposition(|s| (s.pid, s.port) == (l.pid, l.port))
        else {
            return Err(TestCaseError::fail(format!("{} names no server", e.id)));
        };
        if let Some(&before) = h.holder.get(&e.id) {
            if before != now {
                let (b, n) = (&h.servers[before], &h.servers[now]);
                prop_assert!(!b.running, "{} taken from running server {}", e.id, before);
                prop_assert_eq!(b.lineage, n.lineage, "{} passed across lineages", e.id);
            }
        }
        h.holder.insert(e.id.clone(), now);
    }
    Ok(())
}

/// A session's editor is a live editor or a lost one a successor may still bring back.
fn a_sessions_editor_is_live_or_awaited(reg: &Registry) -> Result<(), TestCaseError> {
    for s in reg.sessions() {
        if let Some(id) = s.editor_id() {
            let live = reg.editor(&id).is_some();
            let awaited = reg
                .state
                .with_book(|b| b.get(&id).is_some_and(|r| r.lost_at.is_some()));
            prop_assert!(
                live || awaited,
                "session {} is on {}, which nobody holds",
                s.id,
                id
            );
        }
    }
    Ok(())
}

proptest! {
    // A failing case is printed, and kept under target/ (never in the source tree).
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(prop::test_runner::FileFailurePersistence::Direct(
            "target/proptest-regressions/registry-model.txt",
        ))),
        ..ProptestConfig::default()
    })]

    /// The registry and the model agree after every step of any sequence, and the invariants
    /// hold throughout.
    #[test]
    fn the_registry_follows_the_identity_and_routing_model(ops in prop::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let mut h = Harness::new();
            for (n, op) in ops.iter().enumerate() {
                h.step(op);
                h.compare().map_err(|e| TestCaseError::fail(format!("after step {n} ({op:?}): {e}")))?;
                h.invariants().map_err(|e| TestCaseError::fail(format!("after step {n} ({op:?}): {e}")))?;
            }
            h.reg.cancel.cancel();
            Ok::<(), TestCaseError>(())
        })?;
    }
}

/// A session that came in through one editor's door (compat, Gemini: pinned) stays on that
/// editor: `broker/attach` to another is refused and changes nothing, the same editor is
/// fine, and routing never moves it.
#[tokio::test]
async fn a_pinned_session_cannot_attach_to_another_editor() {
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
    let editor = |port: u16| {
        let text = serde_json::json!({
            "pid": std::process::id(),
            "workspaceFolders": ["/p"],
            "ideName": "Neovim",
            "authToken": "0123456789abcdef",
        })
        .to_string();
        let path = dir.path().join(format!("{port}.lock"));
        let lock = crate::registry::lifecycle::lockfile::parse(&text, &path, Family::Pi, port)
            .expect("lockfile");
        reg.apply(LockEvent::Upsert(lock));
        reg.editors()
            .iter()
            .find(|e| e.lockfile().port == port)
            .map(|e| e.id.clone())
            .expect("admitted")
    };
    let (a, b) = (editor(1), editor(2));
    let intro = Intro {
        door: Door::Compat,
        cwd: "/p".into(),
        key: Some("k".into()),
        editor: Some(a.clone()),
        remote: None,
        pinned: true,
        inherit: None,
        family: Family::Pi,
        client: None,
        realm: None,
    };
    let sink = FrameWriter::new(
        Box::pin(tokio::io::sink()) as std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
        Role::Server,
    );
    let id = reg.next_session_id();
    let outbox = Outbox::new(id, sink, reg.cancel.child_token(), &reg.tracker);
    let (control, _) = tokio::sync::mpsc::unbounded_channel();
    let s = crate::session::open(&reg, &intro, id, outbox, control);
    assert_eq!(s.editor_id().as_deref(), Some(a.as_str()));
    let e = reg.attach_explicit(&s, &b).expect_err("another editor");
    assert!(matches!(e, Error::Pinned { .. }), "{e}");
    assert!(e.to_string().contains(&a), "{e}");
    assert_eq!(
        s.editor_id().as_deref(),
        Some(a.as_str()),
        "still on its door's editor"
    );
    reg.attach_explicit(&s, &a).expect("its own editor");
    // Detached, with an editor of its folder up and routable, routing leaves it alone.
    reg.detach(&s, "test", false);
    let up = reg.editor(&b).expect("b");
    up.set_state(LinkState::Ready);
    reg.editor_ready(&up);
    reg.place(&s);
    assert_eq!(
        s.editor_id(),
        None,
        "a pinned session is never routed elsewhere"
    );
    reg.cancel.cancel();
}
