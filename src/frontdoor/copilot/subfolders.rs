//! Copilot CLI sessions started in a subfolder of an editor's folder (Linux).
//!
//! Copilot CLI connects by itself only to a lockfile listing a folder *equal* to its cwd; a
//! CLI started in `ws/sub` of an editor on `ws` would not. But a CLI reads every lockfile in
//! its ide dir when it starts (and again on each change while it waits for an editor), and a
//! waiting CLI connects when a lockfile it re-reads lists its cwd. So the door watches its own
//! lockfiles being opened (inotify `IN_OPEN`), then looks for the user's Copilot CLI processes
//! (same uid, the executable or `argv[0]` named `copilot`) whose cwd is strictly inside an
//! editor's folder, and rewrites that editor's lockfile in place with the cwd added to
//! `workspaceFolders`: the CLI re-reads it and connects. A folder stays listed while such a
//! process lives (each one found is watched through a pidfd; its exit prunes the folder).
//!
//! Only a folder is added to a listing: the socket's checks (peer uid, nonce) are unchanged,
//! so a process misread from `/proc` (exited, pid reused) costs a stale `/ide` row, never a
//! right. Elsewhere (no `/proc`, no open events) a CLI in a subfolder lists the editor's
//! folder in `/ide`, where the user picks it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// At most this many subfolders are added to one editor's lockfile (each is an `/ide` row).
pub(super) const MAX_PER_EDITOR: usize = 32;

/// What wakes the door to look again.
#[derive(Debug)]
pub(super) enum Wake {
    /// A file in the ide dir was opened (its name).
    Opened(OsString),
    /// A Copilot CLI process that was found has exited (only Linux watches them).
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Exited(u32),
}

/// The watch on the ide dir and on the processes found, and what they report.
pub(super) struct Finder {
    tx: mpsc::UnboundedSender<Wake>,
    rx: mpsc::UnboundedReceiver<Wake>,
    /// The OS watcher (inotify), kept alive; `None` where the door finds no subfolders.
    _watcher: Option<notify::RecommendedWatcher>,
    /// Processes whose exit is awaited.
    watched: HashSet<u32>,
    stop: CancellationToken,
}

impl Finder {
    /// Watches `dir` (Copilot CLI's ide dir) for files opened, on Linux; elsewhere it never
    /// wakes (said once in the log). The exit watches end with `stop`.
    pub(super) fn start(dir: &Path, stop: CancellationToken) -> Finder {
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = if cfg!(target_os = "linux") {
            match watch_opens(dir, tx.clone()) {
                Ok(w) => Some(w),
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "copilot door: cannot watch the ide dir; a Copilot CLI in a subfolder of an editor's folder picks the editor in /ide");
                    None
                }
            }
        } else {
            tracing::info!("copilot door: a Copilot CLI in a subfolder of an editor's folder is found on Linux only; elsewhere it picks the editor in /ide");
            None
        };
        Finder {
            tx,
            rx,
            _watcher: watcher,
            watched: HashSet::new(),
            stop,
        }
    }

    /// The next wakes: waits for one, then takes every one already queued (a CLI opens all
    /// lockfiles at once: one look serves them all).
    pub(super) async fn next(&mut self) -> Vec<Wake> {
        let mut out = Vec::new();
        if let Some(w) = self.rx.recv().await {
            out.push(w);
        }
        while let Ok(w) = self.rx.try_recv() {
            out.push(w);
        }
        for w in &out {
            if let Wake::Exited(pid) = w {
                self.watched.remove(pid);
            }
        }
        out
    }

    /// The subfolders to add per editor (`editors`: id and folders), from the Copilot CLI
    /// processes running now; each process that contributed one is watched for its exit.
    pub(super) fn look(
        &mut self,
        editors: &[(String, Vec<String>)],
    ) -> HashMap<String, Vec<String>> {
        let procs = copilot_processes();
        let roots: Vec<(String, Vec<PathBuf>)> = editors
            .iter()
            .map(|(id, folders)| (id.clone(), with_canonical(folders)))
            .collect();
        let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (pid, cwd) in procs {
            let ids = owners(&roots, &cwd);
            if ids.is_empty() {
                continue;
            }
            for id in ids {
                let set = out.entry(id).or_default();
                if set.len() < MAX_PER_EDITOR {
                    set.insert(cwd.display().to_string());
                }
            }
            self.watch_exit(pid);
        }
        out.into_iter()
            .map(|(id, s)| (id, s.into_iter().collect()))
            .collect()
    }

    /// Wakes the door when process `pid` exits (a pidfd, Linux); once per process.
    fn watch_exit(&mut self, pid: u32) {
        if !self.watched.insert(pid) {
            return;
        }
        #[cfg(not(target_os = "linux"))]
        let _ = (&self.tx, &self.stop);
        #[cfg(target_os = "linux")]
        {
            let Some(exit) = crate::platform::process::exit_of(pid) else {
                self.watched.remove(&pid);
                return;
            };
            let (tx, stop) = (self.tx.clone(), self.stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = exit => { let _ = tx.send(Wake::Exited(pid)); }
                }
            });
        }
    }
}

/// An inotify watch on `dir` that reports the files opened there.
fn watch_opens(
    dir: &Path,
    tx: mpsc::UnboundedSender<Wake>,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::event::{AccessKind, EventKind};
    use notify::Watcher as _;
    let mut w = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        let Ok(ev) = res else { return };
        if !matches!(ev.kind, EventKind::Access(AccessKind::Open(_))) {
            return;
        }
        for p in ev.paths {
            if let Some(name) = p.file_name() {
                let _ = tx.send(Wake::Opened(name.to_os_string()));
            }
        }
    })?;
    w.watch(dir, notify::RecursiveMode::NonRecursive)?;
    Ok(w)
}

/// Each folder, and its canonical form when that differs (`/proc/<pid>/cwd` is canonical).
fn with_canonical(folders: &[String]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for f in folders {
        let p = PathBuf::from(f);
        if let Ok(c) = std::fs::canonicalize(&p) {
            if c != p {
                out.push(c);
            }
        }
        out.push(p);
    }
    out
}

/// The editors whose lockfile should list `cwd`: those with the deepest folder holding it,
/// when that folder is not `cwd` itself (then the CLI already connects by itself).
pub(super) fn owners(roots: &[(String, Vec<PathBuf>)], cwd: &Path) -> Vec<String> {
    let mut best: Option<usize> = None;
    let mut ids: Vec<String> = Vec::new();
    for (id, folders) in roots {
        for f in folders
            .iter()
            .filter(|f| f.is_absolute() && cwd.starts_with(f))
        {
            let depth = f.components().count();
            if best.is_some_and(|b| depth < b) {
                continue;
            }
            if best != Some(depth) {
                ids.clear();
            }
            best = Some(depth);
            if cwd == f.as_path() {
                ids.push(String::new());
            } else if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
    }
    if ids.iter().any(String::is_empty) {
        return Vec::new();
    }
    ids
}

/// The user's Copilot CLI processes (pid and cwd), read from `/proc` (Linux; none elsewhere).
fn copilot_processes() -> Vec<(u32, PathBuf)> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::MetadataExt;
        let uid = rustix::process::geteuid().as_raw();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                if e.metadata().ok()?.uid() != uid || !is_copilot(pid) {
                    return None;
                }
                Some((pid, std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?))
            })
            .collect()
    }
    #[cfg(not(target_os = "linux"))]
    Vec::new()
}

/// Whether process `pid` is a Copilot CLI: its executable, or its `argv[0]`, is named
/// `copilot` (the native binary npm installs, and how it is run; its thread is
/// `MainThread`, so `comm` says nothing).
#[cfg(target_os = "linux")]
fn is_copilot(pid: u32) -> bool {
    let named = |p: &Path| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "copilot" || n == "copilot (deleted)")
    };
    if std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| named(&p)) {
        return true;
    }
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        let argv0 = c.split(|b| *b == 0).next().unwrap_or_default();
        named(Path::new(&*String::from_utf8_lossy(argv0)))
    })
}

// Unix paths ("/w"): the finder runs on Linux only.
#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn roots(v: &[(&str, &[&str])]) -> Vec<(String, Vec<PathBuf>)> {
        v.iter()
            .map(|(id, f)| (id.to_string(), f.iter().map(PathBuf::from).collect()))
            .collect()
    }

    #[test]
    fn a_cwd_strictly_inside_an_editors_folder_goes_to_that_editor() {
        let r = roots(&[("a", &["/w/one", "/w/two"]), ("b", &["/x"])]);
        assert_eq!(owners(&r, Path::new("/w/two/sub/deep")), vec!["a"]);
        assert_eq!(owners(&r, Path::new("/x/y")), vec!["b"]);
        assert!(owners(&r, Path::new("/w/one")).is_empty(), "equal: no need");
        assert!(owners(&r, Path::new("/w")).is_empty(), "outside");
        assert!(
            owners(&r, Path::new("/w/onex")).is_empty(),
            "a prefix is not a parent"
        );
        assert!(owners(&r, Path::new("/elsewhere")).is_empty());
    }

    #[test]
    fn the_deepest_folder_wins_and_an_equal_one_needs_nothing() {
        let r = roots(&[
            ("outer", &["/w"]),
            ("inner", &["/w/sub"]),
            ("twin", &["/w/sub"]),
        ]);
        assert_eq!(owners(&r, Path::new("/w/other")), vec!["outer"]);
        assert_eq!(owners(&r, Path::new("/w/sub/x")), vec!["inner", "twin"]);
        assert!(
            owners(&r, Path::new("/w/sub")).is_empty(),
            "inner and twin list it already; outer must not take it"
        );
        let rel = roots(&[("rel", &["w"])]);
        assert!(owners(&rel, Path::new("w/x")).is_empty(), "relative: never");
    }

    #[test]
    fn a_symlinked_folder_also_matches_its_canonical_form() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir_all(real.join("sub")).unwrap();
        #[cfg(unix)]
        {
            let link = dir.path().join("link");
            std::os::unix::fs::symlink(&real, &link).unwrap();
            let folders = with_canonical(&[link.display().to_string()]);
            let r = vec![("e".to_string(), folders)];
            let cwd = std::fs::canonicalize(real.join("sub")).unwrap();
            assert_eq!(owners(&r, &cwd), vec!["e"]);
        }
    }

    /// This very process is not a Copilot CLI; a process started as `copilot` (argv[0]) is,
    /// with its cwd, and its exit wakes the finder.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_process_named_copilot_is_found_in_its_cwd_and_its_exit_wakes() {
        use std::io::BufRead as _;
        use std::os::unix::process::CommandExt;
        use std::process::Stdio;
        assert!(!is_copilot(std::process::id()));
        let dir = tempfile::tempdir().unwrap();
        let ws = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        // A shell named `copilot` that says it runs, then waits: `spawn` returns once exec
        // began, before the kernel has set the new argv (`/proc/<pid>/cmdline` reads empty
        // meanwhile), so the line is what says the process is what it will be looked up as.
        let mut child = std::process::Command::new("sh")
            .arg0("copilot")
            .args(["-c", "echo up; read _"])
            .current_dir(ws.join("sub"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut up = String::new();
        let out = child.stdout.take().unwrap();
        std::io::BufReader::new(out).read_line(&mut up).unwrap();
        assert_eq!(up, "up\n");
        let mut f = Finder::start(&ws, CancellationToken::new());
        let editors = vec![("e".to_string(), vec![ws.display().to_string()])];
        let found = f.look(&editors);
        assert_eq!(
            found.get("e"),
            Some(&vec![ws.join("sub").display().to_string()]),
            "{found:?}"
        );
        child.kill().unwrap();
        child.wait().unwrap();
        let pid = child.id();
        let exited = async {
            loop {
                let wakes = f.next().await;
                if wakes
                    .iter()
                    .any(|w| matches!(w, Wake::Exited(p) if *p == pid))
                {
                    return;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), exited)
            .await
            .expect("the exit wakes the finder");
        assert!(f.look(&editors).is_empty(), "gone: pruned");
    }
}
