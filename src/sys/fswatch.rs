//! A file system watcher whose events arrive on a tokio channel, for a task to await.
//!
//! `notify`'s recommended watcher: inotify, FSEvents, ReadDirectoryChangesW.

use tokio::sync::mpsc;

/// What a [`watcher`] reports, in order; it ends when the watcher is dropped.
pub(crate) type FsEvents = mpsc::UnboundedReceiver<notify::Result<notify::Event>>;

/// A watcher that watches nothing yet (add paths with `notify::Watcher::watch`), and the
/// channel its events arrive on.
pub(crate) fn watcher() -> notify::Result<(notify::RecommendedWatcher, FsEvents)> {
    let (tx, rx) = mpsc::unbounded_channel();
    let w = notify::recommended_watcher(move |res| {
        let _ = tx.send(res);
    })?;
    Ok((w, rx))
}
