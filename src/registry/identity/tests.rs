use super::*;
use proptest::prelude::*;
use std::collections::{HashMap, HashSet};

fn lineage(n: u8) -> Lineage {
    Lineage {
        family: Family::Pi,
        ide_name: "Neovim".into(),
        folders: vec![format!("/proj/{n}")],
    }
}

fn arrival(l: u8, pid: u32) -> Arrival {
    Arrival {
        lineage: lineage(l),
        process: Process {
            pid,
            start: Some(u64::from(pid) * 7),
            port: 10_000 + (pid % 50_000) as u16,
        },
    }
}

fn alive_set(pids: &[u32]) -> impl Fn(&Process) -> bool + '_ {
    move |p| pids.contains(&p.pid)
}

/// Resolves one arrival alone and returns the id it got.
fn admit(book: &mut Book, a: Arrival, alive: &[u32], now: u64) -> String {
    book.resolve(&[a], &alive_set(alive), now).assigned[0]
        .id
        .clone()
}

/// Saves and loads the book as a broker restart does.
fn restart(book: &Book, saved_at: u64) -> Book {
    let text = serde_json::to_string(book).unwrap();
    let mut b: Book = serde_json::from_str(&text).unwrap();
    b.loaded(saved_at);
    b
}

#[test]
fn two_editors_on_one_folder_keep_their_ids_across_restarts_in_any_order() {
    let mut book = Book::default();
    let a = arrival(0, 100);
    let b = arrival(0, 200);
    let first = book.resolve(std::slice::from_ref(&a), &alive_set(&[100, 200]), 1);
    let second = book.resolve(std::slice::from_ref(&b), &alive_set(&[100, 200]), 2);
    let (ida, idb) = (first.assigned[0].id.clone(), second.assigned[0].id.clone());
    assert_ne!(ida, idb);
    for round in 0..20u64 {
        book = restart(&book, 10 + round);
        let batch = if round % 2 == 0 {
            vec![b.clone(), a.clone()]
        } else {
            vec![a.clone(), b.clone()]
        };
        let r = book.resolve(&batch, &alive_set(&[100, 200]), 11 + round);
        for x in &r.assigned {
            let want = if x.process.pid == 100 { &ida } else { &idb };
            assert_eq!(&x.id, want, "round {round}");
            assert_eq!(x.verdict, Verdict::Same);
        }
        assert!(r.dropped.is_empty() && r.died.is_empty());
    }
}

#[test]
fn a_fast_restart_is_a_successor_even_before_the_old_one_is_noticed() {
    let mut book = Book::default();
    let old = book.resolve(&[arrival(0, 100)], &alive_set(&[100]), 1);
    let id = old.assigned[0].id.clone();
    // pid 100 died; its record is still live (no link noticed yet); pid 101 appears.
    let r = book.resolve(&[arrival(0, 101)], &alive_set(&[101]), 2);
    assert_eq!(r.died, vec![id.clone()]);
    assert_eq!(r.assigned[0].id, id);
    assert_eq!(
        r.assigned[0].verdict,
        Verdict::Successor {
            previous_pid: 100,
            previous_port: arrival(0, 100).process.port
        }
    );
    assert_eq!(book.get(&id).unwrap().restarts, 1);
}

#[test]
fn a_sibling_never_inherits_from_a_live_editor() {
    let mut book = Book::default();
    let a = book.resolve(&[arrival(0, 100)], &alive_set(&[100, 200]), 1);
    let b = book.resolve(&[arrival(0, 200)], &alive_set(&[100, 200]), 2);
    assert_ne!(a.assigned[0].id, b.assigned[0].id);
    assert_eq!(b.assigned[0].verdict, Verdict::New);
}

#[test]
fn the_most_recently_lost_predecessor_is_inherited() {
    let mut book = Book::default();
    let all = [100, 200];
    let a = admit(&mut book, arrival(0, 100), &all, 1);
    let b = admit(&mut book, arrival(0, 200), &all, 2);
    book.lost(&a, &arrival(0, 100).process, 10);
    book.lost(&b, &arrival(0, 200).process, 20);
    let r = book.resolve(&[arrival(0, 300)], &alive_set(&[300]), 30);
    assert_eq!(r.assigned[0].id, b);
    // The next one takes the other.
    let r = book.resolve(&[arrival(0, 400)], &alive_set(&[300, 400]), 31);
    assert_eq!(r.assigned[0].id, a);
}

#[test]
fn ambiguous_succession_is_never_guessed() {
    // Two editors lost at the same instant (the broker was down), one newcomer.
    let mut book = Book::default();
    let all = [100, 200];
    let a = admit(&mut book, arrival(0, 100), &all, 1);
    let b = admit(&mut book, arrival(0, 200), &all, 2);
    let mut book2 = restart(&book, 5);
    let r = book2.resolve(&[arrival(0, 300)], &alive_set(&[300]), 6);
    assert_eq!(r.assigned[0].verdict, Verdict::New);
    let mut dropped = r.dropped.clone();
    dropped.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(dropped, want);
    assert!(![a.as_str(), b.as_str()].contains(&r.assigned[0].id.as_str()));
    // One lost editor, two newcomers in the same scan.
    let mut book3 = Book::default();
    let c = admit(&mut book3, arrival(1, 500), &[500], 1);
    let mut book3 = restart(&book3, 2);
    let r = book3.resolve(
        &[arrival(1, 600), arrival(1, 700)],
        &alive_set(&[600, 700]),
        3,
    );
    assert_eq!(r.dropped, vec![c.clone()]);
    assert!(r
        .assigned
        .iter()
        .all(|x| x.verdict == Verdict::New && x.id != c));
}

#[test]
fn one_process_in_two_families_is_two_editors() {
    let mut book = Book::default();
    let pi = arrival(0, 100);
    let mut claude = pi.clone();
    claude.lineage.family = Family::Claude;
    let r = book.resolve(&[pi, claude], &alive_set(&[100]), 1);
    assert_eq!(r.assigned.len(), 2);
    assert_ne!(r.assigned[0].id, r.assigned[1].id);
}

#[test]
fn old_records_are_pruned() {
    let mut book = Book::default();
    let a = admit(&mut book, arrival(0, 100), &[100], 1);
    book.lost(&a, &arrival(0, 100).process, 10);
    assert!(book.prune(1000, 5000, 16).is_empty());
    assert_eq!(book.prune(10_000, 5000, 16), vec![a]);
    for pid in 1..40 {
        let id = admit(&mut book, arrival(pid as u8, pid), &[pid], 1);
        book.lost(&id, &arrival(pid as u8, pid).process, u64::from(pid));
    }
    let gone = book.prune(50, 1_000_000, 16);
    assert_eq!(gone.len(), 39 - 16);
    assert_eq!(book.records().len(), 16);
}

/// One step of the world: editors start, crash (noticed or not), restart; the broker stops
/// and starts; sessions choose editors.
#[derive(Clone, Debug)]
enum Op {
    Start(u8),
    Crash(usize, bool),
    Restart(usize),
    BrokerRestart(u64),
    Choose(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..2).prop_map(Op::Start),
        (0usize..8, any::<bool>()).prop_map(|(i, n)| Op::Crash(i, n)),
        (0usize..8).prop_map(Op::Restart),
        any::<u64>().prop_map(Op::BrokerRestart),
        (0usize..8).prop_map(Op::Choose),
    ]
}

struct World {
    book: Book,
    now: u64,
    /// Every process ever started: (lineage, pid, alive).
    procs: Vec<(u8, u32, bool)>,
    /// Which process holds each id, as the broker last said.
    holder: HashMap<String, u32>,
    /// Sessions' choices: the id, the process it named, and every process alive then.
    chosen: Vec<(String, u32, Vec<u32>)>,
}

impl World {
    fn alive_pids(&self) -> Vec<u32> {
        self.procs.iter().filter(|p| p.2).map(|p| p.1).collect()
    }

    fn apply(&mut self, arrivals: &[Arrival]) -> Result<(), TestCaseError> {
        self.now += 1000;
        let pids = self.alive_pids();
        let r = self.book.resolve(arrivals, &alive_set(&pids), self.now);
        for x in &r.assigned {
            let pid = x.process.pid;
            // A process the broker knew never changes id (no swaps).
            for (id, h) in &self.holder {
                if *h == pid && self.book.get(id).is_some() {
                    prop_assert_eq!(id, &x.id, "pid {} changed id", pid);
                }
            }
            if let Some(prev) = self.holder.get(&x.id).copied() {
                if prev != pid {
                    // Handed to another process: only as a successor of a dead one.
                    let prev_alive = self.procs.iter().any(|p| p.1 == prev && p.2);
                    prop_assert!(!prev_alive, "{} taken from live pid {}", x.id, prev);
                    let lin = |pid: u32| self.procs.iter().find(|p| p.1 == pid).map(|p| p.0);
                    prop_assert_eq!(lin(prev), lin(pid), "successor of another lineage");
                    let successor = matches!(x.verdict, Verdict::Successor { .. });
                    prop_assert!(successor, "{} reused without succession", x.id);
                }
            }
            self.holder.insert(x.id.clone(), pid);
        }
        for id in &r.dropped {
            self.holder.remove(id);
            self.chosen.retain(|(c, _, _)| c != id);
        }
        // Two live processes never share an id.
        let mut seen = HashSet::new();
        for (id, pid) in &self.holder {
            if self.procs.iter().any(|p| p.1 == *pid && p.2) && self.book.get(id).is_some() {
                prop_assert!(seen.insert(*pid), "pid {} holds two ids", pid);
            }
        }
        Ok(())
    }

    fn start(&mut self, l: u8) -> Result<(), TestCaseError> {
        let pid = 100 + self.procs.len() as u32;
        self.procs.push((l, pid, true));
        self.apply(&[arrival(l, pid)])
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever happens, a session's chosen id leads to the process it chose or to a chain of
    /// successors of it (each took the id only after its holder was dead, same lineage).
    #[test]
    fn sessions_only_ever_follow_their_editor_or_its_successors(ops in prop::collection::vec(op(), 1..40)) {
        let mut w = World { book: Book::default(), now: 0, procs: vec![], holder: HashMap::new(), chosen: vec![] };
        for op in ops {
            match op {
                Op::Start(l) => w.start(l)?,
                Op::Crash(i, noticed) => {
                    let alive: Vec<usize> = (0..w.procs.len()).filter(|&j| w.procs[j].2).collect();
                    if let Some(&j) = alive.get(i % alive.len().max(1)) {
                        w.procs[j].2 = false;
                        if noticed {
                            let pid = w.procs[j].1;
                            let id = w.holder.iter().find(|(_, p)| **p == pid).map(|(id, _)| id.clone());
                            if let Some(id) = id { w.now += 1000; let p = arrival(w.procs[j].0, pid).process; w.book.lost(&id, &p, w.now); }
                        }
                    }
                }
                Op::Restart(i) => {
                    let alive: Vec<usize> = (0..w.procs.len()).filter(|&j| w.procs[j].2).collect();
                    if let Some(&j) = alive.get(i % alive.len().max(1)) {
                        w.procs[j].2 = false;
                        let l = w.procs[j].0;
                        w.start(l)?;
                    }
                }
                Op::BrokerRestart(seed) => {
                    w.now += 1000;
                    w.book = restart(&w.book, w.now);
                    let mut batch: Vec<Arrival> = w.procs.iter().filter(|p| p.2).map(|p| arrival(p.0, p.1)).collect();
                    let n = batch.len().max(1);
                    batch.rotate_left((seed as usize) % n);
                    if seed % 2 == 1 { batch.reverse(); }
                    w.apply(&batch)?;
                }
                Op::Choose(i) => {
                    let ids: Vec<(String, u32)> = w.holder.iter()
                        .filter(|(id, pid)| w.procs.iter().any(|p| p.1 == **pid && p.2) && w.book.get(id).is_some())
                        .map(|(id, pid)| (id.clone(), *pid)).collect();
                    if let Some((id, pid)) = ids.get(i % ids.len().max(1)) {
                        let alive = w.alive_pids();
                        w.chosen.push((id.clone(), *pid, alive));
                    }
                }
            }
            // Every chosen id is held by its chosen process or a (checked) successor of it:
            // never by a process that was alive when it was chosen, other than the chosen one.
            for (id, chosen_pid, alive_then) in &w.chosen {
                if let Some(h) = w.holder.get(id) {
                    prop_assert!(h == chosen_pid || !alive_then.contains(h), "{} moved to sibling pid {}", id, h);
                }
            }
        }
    }
}

/// The same editor is the same pid on the same port, and where both start times are known,
/// the same start: a recycled pid (another start) is another process (cargo-mutants found
/// the start-time arm deletable).
#[test]
fn a_recycled_pid_is_another_process() {
    let p = |pid, start, port| Process { pid, start, port };
    let running = p(100, Some(5_000), 40_000);
    assert!(running.same_as(&p(100, Some(5_000), 40_000)));
    assert!(
        !running.same_as(&p(100, Some(9_000), 40_000)),
        "a recycled pid"
    );
    assert!(
        !running.same_as(&p(100, Some(5_000), 40_001)),
        "another port"
    );
    assert!(
        !running.same_as(&p(101, Some(5_000), 40_000)),
        "another pid"
    );
    // Where the OS tells no start time, pid and port decide.
    assert!(running.same_as(&p(100, None, 40_000)));
    assert!(p(100, None, 40_000).same_as(&running));
    assert!(!p(100, None, 40_000).same_as(&p(100, None, 40_001)));
}

/// An id is a function of the lineage alone, the same in every build (users keep it:
/// `/ide neovim-…`, scripts reading `status --json`), and the folders' boundaries count: two
/// lineages whose folders only join to the same text get different ids (cargo-mutants found
/// the field separator's xor replaceable).
#[test]
fn ids_are_stable_and_folder_boundaries_count() {
    let l = |folders: &[&str]| Lineage {
        family: Family::Pi,
        ide_name: "Neovim".into(),
        folders: folders.iter().map(|f| f.to_string()).collect(),
    };
    assert_eq!(l(&["/proj/a"]).base_id(), GOLDEN_ID);
    assert_ne!(l(&["/ab", "c"]).base_id(), l(&["/a", "bc"]).base_id());
    assert_ne!(l(&["/p", ""]).base_id(), l(&["/p"]).base_id());
}
/// The id of a Neovim (pi family) on `/proj/a`, as every build since ids became readable
/// gives it.
const GOLDEN_ID: &str = "neovim-f6c39d";

/// A forgotten record is gone for good: a newcomer of its lineage does not inherit it.
#[test]
fn a_forgotten_record_is_not_inherited() {
    let mut book = Book::default();
    let a = admit(&mut book, arrival(0, 100), &[100], 1);
    book.lost(&a, &arrival(0, 100).process, 10);
    book.forget(&a);
    assert!(book.get(&a).is_none());
    let r = book.resolve(&[arrival(0, 101)], &alive_set(&[101]), 20);
    assert_eq!(r.assigned[0].verdict, Verdict::New);
}

/// The window is "older than": a record lost exactly `window_ms` ago stays. The cap counts
/// what the window left, and only the oldest lost records beyond it go.
#[test]
fn pruning_keeps_the_window_edge_and_trims_only_beyond_the_cap() {
    let mut book = Book::default();
    let a = admit(&mut book, arrival(0, 100), &[100], 1);
    book.lost(&a, &arrival(0, 100).process, 10);
    assert!(book.prune(10 + 5000, 5000, 16).is_empty(), "at the edge");
    assert_eq!(book.prune(10 + 5001, 5000, 16), vec![a]);

    // One expired record, four lost within the window, cap 3: the expired one and the
    // oldest of the four go, nothing else.
    let mut book = Book::default();
    let expired = admit(&mut book, arrival(0, 100), &[100], 1);
    book.lost(&expired, &arrival(0, 100).process, 10);
    let mut recent = Vec::new();
    for (i, pid) in (200..204).enumerate() {
        let id = admit(&mut book, arrival(pid as u8, pid), &[pid], 1);
        book.lost(&id, &arrival(pid as u8, pid).process, 9_000 + i as u64);
        recent.push(id);
    }
    let mut gone = book.prune(9_100, 5_000, 3);
    gone.sort();
    let mut want = vec![expired.clone(), recent[0].clone()];
    want.sort();
    assert_eq!(gone, want);
    assert_eq!(book.records().len(), 3);

    // Within the cap once the window has done its work: nothing more goes.
    let mut book = Book::default();
    let expired = admit(&mut book, arrival(0, 100), &[100], 1);
    book.lost(&expired, &arrival(0, 100).process, 10);
    for pid in [200, 201] {
        admit(&mut book, arrival(pid as u8, pid), &[pid], 1);
    }
    assert_eq!(book.prune(9_100, 5_000, 3), vec![expired]);
    assert_eq!(book.records().len(), 2);
}

/// One server announced twice in one batch (two lockfiles of one process) gets one id for
/// both arrivals.
#[test]
fn one_process_announced_twice_in_a_batch_gets_one_id_for_both() {
    let mut book = Book::default();
    let r = book.resolve(&[arrival(0, 100), arrival(0, 100)], &alive_set(&[100]), 1);
    assert_eq!(r.assigned.len(), 2);
    assert_eq!(r.assigned[0].id, r.assigned[1].id);
}

/// A process the OS facts call gone but that is announced again in this very batch did not
/// die (a pid namespace the broker cannot see into): it keeps its id and is not reported
/// died.
#[test]
fn a_process_announced_again_is_not_reported_died() {
    let mut book = Book::default();
    let id = admit(&mut book, arrival(0, 100), &[100], 1);
    let r = book.resolve(&[arrival(0, 100)], &alive_set(&[]), 2);
    assert!(r.died.is_empty(), "{:?}", r.died);
    assert_eq!(r.assigned[0].id, id);
    assert_eq!(r.assigned[0].verdict, Verdict::Same);
}

/// Two editors started within one clock tick share a start token: the second, in another
/// folder, is not the first one "moved to a new port".
#[test]
fn a_shared_start_tick_is_not_a_move() {
    let mut book = Book::default();
    let tick = Some(5_000);
    let mut a = arrival(0, 100);
    a.process.start = tick;
    let mut b = arrival(1, 200);
    b.process.start = tick;
    let first = admit(&mut book, a.clone(), &[100], 1);
    book.lost(&first, &a.process, 10);
    let r = book.resolve(&[b], &alive_set(&[200]), 20);
    assert_ne!(r.assigned[0].id, first);
    assert_eq!(r.assigned[0].verdict, Verdict::New);
}

/// The OS side of the facts, on a real child process: its start token is the one the OS
/// tells, it is alive while it runs with that token and not with another (a recycled pid),
/// and not once it has exited and been reaped; the clock is the wall clock.
#[cfg(unix)] // POSIX paths, FIFOs or child processes
#[test]
fn the_os_tells_a_running_process_from_a_recycled_or_dead_one() {
    let os = Os;
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id();
    let token = os.start_token(pid);
    assert_eq!(token, crate::platform::process::start_token(pid));
    let running = Process {
        pid,
        start: token,
        port: 1,
    };
    assert!(os.alive(&running));
    if let Some(t) = token {
        let recycled = Process {
            start: Some(t + 1),
            ..running
        };
        assert!(
            !os.alive(&recycled),
            "another start time is another process"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!os.alive(&running), "exited and reaped");
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(os.now_ms().abs_diff(wall) < 60_000, "{}", os.now_ms());
}

/// The identity and lockfile test modules again, in a child of this test binary, with the
/// signal-only process facts: what a platform without `/proc` or `proc_pidinfo` runs.
#[cfg(unix)] // POSIX paths, FIFOs or child processes
#[test]
fn identity_and_lockfile_tests_pass_with_signal_only_process_facts() {
    crate::platform::process::rerun_with_signal_only_facts(&["identity::", "lockfile::"]);
}
