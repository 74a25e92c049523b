//! Test support (the `testkit` feature): fake editors, agents and clients.
//!
//! Shared by the integration tests, the benches and the `fake-editor` example: a fake editor
//! that answers as the real editors were recorded answering, and fake clients. Real sockets, real frames. May use every layer;
//! nothing in the daemon uses it.

pub mod acp_client;
pub mod agent;
#[cfg(unix)]
pub mod copilot_chat;
pub mod fake_editor;
pub mod pi_client;
pub mod rival;

use std::time::Duration;

/// `openDiff` arguments as pi sends them: the same path on both sides, the proposal, a tab.
pub fn diff_args(path: &str, contents: &str, tab: &str) -> serde_json::Value {
    serde_json::json!({"old_file_path": path, "new_file_path": path, "new_file_contents": contents, "tab_name": tab})
}

/// The bound on every await in tests: a hang fails fast instead of stalling the suite.
pub const WAIT: Duration = Duration::from_secs(10);

/// The text of a tool answer's first content block (`""` when there is none).
pub fn text(answer: &serde_json::Value) -> &str {
    answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or("")
}

/// Awaits `fut` for at most [`WAIT`], panicking with `what` on timeout.
pub async fn within<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    within_for(WAIT, what, fut).await
}

/// Awaits `fut` for at most `bound`, panicking with `what` on timeout: for a step that waits
/// on a real program's own timing, where [`WAIT`] is wrong.
pub async fn within_for<T>(
    bound: Duration,
    what: &str,
    fut: impl std::future::Future<Output = T>,
) -> T {
    match tokio::time::timeout(bound, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {bound:?} waiting for {what}"),
    }
}

/// The bound on a whole program's run or start that loads a runtime and its packages (pi
/// installing a package, node running a test suite, a registry starting): on a loaded 2-core
/// machine these took more than [`WAIT`] (seen beside the soak), and a step's bound is wrong
/// for them.
pub const START: Duration = Duration::from_secs(60);

/// Awaits `fut` for at most [`START`], panicking with `what` on timeout.
pub async fn within_start<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    within_for(START, what, fut).await
}

/// Polls `check` (every 10 ms, at most [`WAIT`]) until it returns `Some`: for state that
/// has no event to await, such as a file appearing in a dir watched by another process.
pub async fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    within(what, async {
        loop {
            if let Some(v) = check() {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}
