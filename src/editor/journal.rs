//! The diffs the broker has open in editors, journalled in the state dir.
//!
//! What a daemon that died (or a link that dropped) left open is closed once that editor is
//! linked again.
//!
//! pi-ide.nvim keeps a diff open when its client goes away, and nothing else would close it: a
//! user who answers it answers no one, while the next write's own diff waits. So every diff the
//! broker sends an editor is recorded here (the editor process, by its lockfile's port and pid,
//! and the tab name the editor knows it by) before it is sent, and struck out once the editor
//! has answered it or the broker has sent its `close_tab`. A diff cut off by a lost link is
//! answered to its session at once (undelivered) and stays here: the link that comes up next
//! for that editor, in this daemon or the next one, closes it before anything else is sent.
//!
//! The file (`open-diffs.jsonl`, 0600) is appended to, one JSON line per change, and emptied
//! whenever no diff is open: a SIGKILL loses nothing written, and it stays a few lines long.

use crate::platform::sync::lock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The journal's file name in the state dir.
pub const FILE: &str = "open-diffs.jsonl";

/// Appended lines after which the file is written afresh from what is open (a diff left open
/// for days while others come and go would otherwise grow it forever).
const COMPACT_AFTER: usize = 512;

/// The editor process a diff is open in: its lockfile's port and pid (a restarted editor, or
/// the same port under another pid, has none of its predecessor's diffs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EditorKey {
    /// The editor's port.
    pub port: u16,
    /// The editor's pid.
    pub pid: u32,
}

impl EditorKey {
    /// The editor process on `port` with `pid`.
    pub fn new(port: u16, pid: u32) -> EditorKey {
        EditorKey { port, pid }
    }
}

/// One line of the file.
#[derive(Debug, Serialize, Deserialize)]
struct Line {
    /// True: the diff was opened; false: it is closed.
    open: bool,
    port: u16,
    pid: u32,
    /// The tab name the editor knows the diff by.
    tab: String,
}

/// What is open, and the file that keeps it.
struct Inner {
    open: BTreeSet<(EditorKey, String)>,
    /// `None`: kept in memory only (no state dir yet, or it could not be written).
    file: Option<std::fs::File>,
    /// A write failed (said once): kept in memory only from then on.
    failed: bool,
    /// Lines appended since the file was last written whole.
    appended: usize,
}

/// The diffs open in editors, shared by every editor handle of the daemon.
pub struct DiffJournal {
    path: Option<PathBuf>,
    inner: Mutex<Inner>,
}

impl DiffJournal {
    /// The journal in `state_dir`: what a previous daemon left open is read (entries of editor
    /// processes no longer running dropped) and the file written afresh from it.
    pub fn open(state_dir: &Path, alive: impl Fn(u32) -> bool) -> DiffJournal {
        let path = state_dir.join(FILE);
        let open = read(&path)
            .into_iter()
            .filter(|(k, _)| alive(k.pid))
            .collect::<BTreeSet<_>>();
        if !open.is_empty() {
            tracing::info!(diffs = open.len(), file = %path.display(), "diffs left open in editors by a previous daemon; each is closed once its editor is linked");
        }
        let journal = DiffJournal {
            path: Some(path),
            inner: Mutex::new(Inner {
                open,
                file: None,
                failed: false,
                appended: 0,
            }),
        };
        journal.rewrite(&mut lock(&journal.inner));
        journal
    }

    /// A journal kept in memory only (tests; a handle made outside a daemon).
    pub fn in_memory() -> DiffJournal {
        DiffJournal {
            path: None,
            inner: Mutex::new(Inner {
                open: BTreeSet::new(),
                file: None,
                failed: false,
                appended: 0,
            }),
        }
    }

    /// Records that the diff `tab` is being sent to the editor `key`.
    pub fn opened(&self, key: EditorKey, tab: &str) {
        let mut inner = lock(&self.inner);
        if inner.open.insert((key, tab.to_string())) {
            self.append(&mut inner, true, key, tab);
        }
    }

    /// Strikes out the diff `tab` of the editor `key`: answered by the editor, or closed by
    /// the broker's `close_tab`.
    pub fn closed(&self, key: EditorKey, tab: &str) {
        let mut inner = lock(&self.inner);
        if inner.open.remove(&(key, tab.to_string())) {
            if inner.open.is_empty() {
                self.rewrite(&mut inner);
            } else {
                self.append(&mut inner, false, key, tab);
            }
        }
    }

    /// The diffs open in the editor `key` other than those `still_waiting` (a diff a session
    /// still waits on, sent on this link): what a dead daemon or a lost link left there.
    pub fn leftovers(&self, key: EditorKey, still_waiting: impl Fn(&str) -> bool) -> Vec<String> {
        lock(&self.inner)
            .open
            .iter()
            .filter(|(k, tab)| *k == key && !still_waiting(tab))
            .map(|(_, tab)| tab.clone())
            .collect()
    }

    /// Drops the entries of editor processes that are no longer running (their diffs went
    /// with them).
    pub fn forget_dead(&self, alive: impl Fn(u32) -> bool) {
        let mut inner = lock(&self.inner);
        let before = inner.open.len();
        inner.open.retain(|(k, _)| alive(k.pid));
        if inner.open.len() != before {
            self.rewrite(&mut inner);
        }
    }

    /// How many diffs are recorded open (status, tests).
    pub fn len(&self) -> usize {
        lock(&self.inner).open.len()
    }

    /// True when no diff is recorded open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn append(&self, inner: &mut Inner, open: bool, key: EditorKey, tab: &str) {
        if inner.appended >= COMPACT_AFTER {
            return self.rewrite(inner);
        }
        let Some(f) = inner.file.as_mut() else {
            return;
        };
        let line = Line {
            open,
            port: key.port,
            pid: key.pid,
            tab: tab.to_string(),
        };
        let mut text = serde_json::to_string(&line).unwrap_or_default();
        text.push('\n');
        // One write of the whole line: a kill leaves whole lines (the reader skips a torn one).
        if let Err(e) = f.write_all(text.as_bytes()) {
            self.failed(inner, &e);
        } else {
            inner.appended += 1;
        }
    }

    /// Writes the file afresh from what is open (empty when nothing is) and keeps it open for
    /// appending.
    fn rewrite(&self, inner: &mut Inner) {
        let Some(path) = self.path.as_ref().filter(|_| !inner.failed) else {
            return;
        };
        let mut text = String::new();
        for (k, tab) in &inner.open {
            let line = Line {
                open: true,
                port: k.port,
                pid: k.pid,
                tab: tab.clone(),
            };
            text.push_str(&serde_json::to_string(&line).unwrap_or_default());
            text.push('\n');
        }
        // Nothing open: the file emptied in place (one call). Else written beside it and
        // renamed into place, so a kill at any point leaves the old lines or the new ones.
        let result = match inner.file.as_mut() {
            Some(f) if text.is_empty() => f.set_len(0),
            _ => {
                // Closed first: Windows replaces no file that is open (the rename would fail
                // and leave the journal in memory only).
                inner.file = None;
                replace(path, &text).map(|f| inner.file = Some(f))
            }
        };
        match result {
            Ok(()) => inner.appended = 0,
            Err(e) => self.failed(inner, &e),
        }
    }

    fn failed(&self, inner: &mut Inner, e: &std::io::Error) {
        inner.file = None;
        inner.failed = true;
        tracing::warn!(file = %self.path.as_deref().unwrap_or(Path::new("")).display(), error = %e, "cannot write the journal of open diffs: a diff left open by a crash will not be closed by the next daemon");
    }
}

/// Writes `text` as the whole of the file at `path` (see `platform::user::replace_private`);
/// returns the file open for appending.
fn replace(path: &Path, text: &str) -> std::io::Result<std::fs::File> {
    crate::platform::user::replace_private(path, text.as_bytes(), false)?;
    crate::platform::user::private_file_options()
        .append(true)
        .open(path)
}

/// The entries the file at `path` leaves open (a missing file: none; a torn or foreign line is
/// skipped).
fn read(path: &Path) -> Vec<(EditorKey, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut open = BTreeSet::new();
    for l in text.lines() {
        let Ok(line) = serde_json::from_str::<Line>(l) else {
            continue;
        };
        let entry = (
            EditorKey {
                port: line.port,
                pid: line.pid,
            },
            line.tab,
        );
        if line.open {
            open.insert(entry);
        } else {
            open.remove(&entry);
        }
    }
    open.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: EditorKey = EditorKey { port: 4000, pid: 7 };
    const OTHER: EditorKey = EditorKey { port: 4001, pid: 8 };

    /// What a daemon started on `dir` after this one died finds open.
    fn next_daemon(dir: &Path, alive: &[u32]) -> DiffJournal {
        DiffJournal::open(dir, |pid| alive.contains(&pid))
    }

    #[test]
    fn what_a_dead_daemon_left_open_is_what_the_next_one_finds() {
        let dir = tempfile::tempdir().unwrap();
        let j = next_daemon(dir.path(), &[7, 8]);
        j.opened(ED, "pi-write:a");
        j.opened(ED, "pi-write:b");
        j.opened(OTHER, "pi-edit:c");
        j.closed(ED, "pi-write:a"); // answered
                                    // Killed here (nothing more written): the next daemon reads the file.
        drop(j);
        let next = next_daemon(dir.path(), &[7, 8]);
        assert_eq!(next.leftovers(ED, |_| false), vec!["pi-write:b"]);
        assert_eq!(next.leftovers(OTHER, |_| false), vec!["pi-edit:c"]);
        // A diff a session waits on again (sent on this link) is no leftover.
        assert!(next.leftovers(ED, |t| t == "pi-write:b").is_empty());
        // An editor process that is gone took its diffs with it.
        let after_kill = next_daemon(dir.path(), &[8]);
        assert!(after_kill.leftovers(ED, |_| false).is_empty());
        assert_eq!(after_kill.len(), 1);
    }

    #[test]
    fn the_file_is_emptied_once_nothing_is_open_and_compacted_when_long() {
        let dir = tempfile::tempdir().unwrap();
        let j = next_daemon(dir.path(), &[7]);
        let file = dir.path().join(FILE);
        j.opened(ED, "t1");
        assert!(std::fs::read_to_string(&file).unwrap().contains("t1"));
        j.closed(ED, "t1");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "");
        // One diff left open for long while many come and go: the file stays short.
        j.opened(ED, "kept");
        for i in 0..(3 * COMPACT_AFTER) {
            j.opened(ED, &format!("d{i}"));
            j.closed(ED, &format!("d{i}"));
        }
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        assert!(lines <= COMPACT_AFTER + 1, "{lines} lines");
        drop(j);
        assert_eq!(
            next_daemon(dir.path(), &[7]).leftovers(ED, |_| false),
            vec!["kept"]
        );
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_the_rest_read() {
        let dir = tempfile::tempdir().unwrap();
        let good = r#"{"open":true,"port":4000,"pid":7,"tab":"pi-write:x"}"#;
        std::fs::write(dir.path().join(FILE), format!("{good}\n{{\"open\":tr")).unwrap();
        let j = next_daemon(dir.path(), &[7]);
        assert_eq!(j.leftovers(ED, |_| false), vec!["pi-write:x"]);
    }

    #[test]
    fn a_state_dir_that_cannot_be_written_leaves_the_journal_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, "").unwrap();
        let j = next_daemon(&not_a_dir.join("state"), &[7]);
        j.opened(ED, "a");
        j.opened(ED, "b");
        j.closed(ED, "a");
        assert_eq!(j.leftovers(ED, |_| false), vec!["b"]);
        assert!(lock(&j.inner).failed, "said once, then in memory only");
    }

    #[cfg(unix)]
    #[test]
    fn the_file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let j = next_daemon(&dir.path().join("state"), &[7]);
        j.opened(ED, "t");
        let mode = std::fs::metadata(dir.path().join("state").join(FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    /// One step of a daemon's life as the journal sees it.
    #[derive(Clone, Debug)]
    enum Step {
        Opened(bool, u8),
        Closed(bool, u8),
        /// The daemon is killed and the next one reads the file (`bool`: the second editor
        /// died meanwhile).
        Restart(bool),
        /// The second editor dies while the daemon runs.
        SecondDies,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (any::<bool>(), 0u8..6).prop_map(|(e, t)| Step::Opened(e, t)),
            4 => (any::<bool>(), 0u8..6).prop_map(|(e, t)| Step::Closed(e, t)),
            1 => any::<bool>().prop_map(Step::Restart),
            1 => Just(Step::SecondDies),
        ]
    }

    proptest::proptest! {
        /// Against a model (the set of diffs open per editor process): after every step, what
        /// the journal (and a daemon started on its file after a kill) says is open is the
        /// model's; a dead editor's diffs are never leftovers.
        #[test]
        fn the_journal_is_the_set_of_open_diffs_across_kills(steps in proptest::collection::vec(step(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let mut alive = vec![7u32, 8];
            let mut j = next_daemon(dir.path(), &alive);
            let mut model: BTreeSet<(EditorKey, String)> = BTreeSet::new();
            let key = |second: bool| if second { OTHER } else { ED };
            for s in steps {
                match s {
                    Step::Opened(e, t) if alive.contains(&key(e).pid) => {
                        j.opened(key(e), &format!("t{t}"));
                        model.insert((key(e), format!("t{t}")));
                    }
                    Step::Opened(..) => {}
                    Step::Closed(e, t) => {
                        j.closed(key(e), &format!("t{t}"));
                        model.remove(&(key(e), format!("t{t}")));
                    }
                    Step::Restart(second_died) => {
                        if second_died {
                            alive.retain(|p| *p != OTHER.pid);
                            model.retain(|(k, _)| *k != OTHER);
                        }
                        drop(j);
                        j = next_daemon(dir.path(), &alive);
                    }
                    Step::SecondDies => {
                        alive.retain(|p| *p != OTHER.pid);
                        model.retain(|(k, _)| *k != OTHER);
                        j.forget_dead(|pid| alive.contains(&pid));
                    }
                }
                for k in [ED, OTHER] {
                    let want: Vec<String> = model.iter().filter(|(m, _)| *m == k).map(|(_, t)| t.clone()).collect();
                    proptest::prop_assert_eq!(j.leftovers(k, |_| false), want);
                }
                let reread = read(&dir.path().join(FILE)).into_iter().filter(|(k, _)| alive.contains(&k.pid)).collect::<BTreeSet<_>>();
                proptest::prop_assert_eq!(&reread, &model, "the file, as the next daemon reads it");
            }
        }
    }
}
