//! Single-client editors (the Claude Code VS Code extension keeps one client at a time and
//! closes the older one when another connects): a link the editor closed while another client
//! holds it is `taken`, and the broker leaves that client alone (`[editors] single_client =
//! "yield"`) instead of redialling into an eviction loop with it.

use super::{Editor, LinkHost, LinkState};
use crate::config::{Config, SingleClient};
use crate::jsonrpc;
use crate::sync::lock;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The fastest the broker looks whether the other client has left, whatever the config says.
const MIN_PROBE: Duration = Duration::from_millis(20);

/// After the editor closed the link whose local port was `client_port`: why it counts as taken
/// (another client holds it now and the policy yields), or `None` (redial as for any lost
/// link). Knowing needs the kernel's connection table (Linux); elsewhere it is never taken.
pub(super) fn taken_by_another(
    editor: &Editor,
    config: &Config,
    client_port: u16,
) -> Option<String> {
    if config.editors.single_client(editor.family) != SingleClient::Yield {
        return None;
    }
    let port = editor.lockfile().port;
    let others = crate::portpeers::clients_of(port, Some(client_port))?;
    (others > 0).then(|| {
        format!(
            "the editor closed the broker's link when another client connected ({others} now \
             connected to port {port}); it keeps one client at a time"
        )
    })
}

/// Holds the link down while the editor is taken: until a session calls it (it needs the
/// editor), the other client has gone (looked up every `taken_probe_ms` without connecting),
/// or the editor is gone (false). Sessions stay attached and are told.
pub(super) async fn wait_while_taken(
    editor: &Arc<Editor>,
    host: &dyn LinkHost,
    reason: String,
) -> bool {
    tracing::warn!(editor = %editor.id, reason = %reason, "editor taken by another client; yielding until a session calls it or the other client leaves");
    {
        let mut l = lock(&editor.link);
        l.state = LinkState::Taken;
        l.reason = Some(reason.clone());
    }
    host.state_changed();
    announce(editor, host, "taken", Some(&reason));
    let port = editor.lockfile().port;
    loop {
        let probe = Duration::from_millis(host.config().editors.taken_probe_ms).max(MIN_PROBE);
        tokio::select! {
            _ = editor.cancel.cancelled() => return false,
            _ = editor.wanted.notified() => {
                tracing::info!(editor = %editor.id, "a session called the taken editor; connecting again");
                return true;
            }
            _ = tokio::time::sleep(probe) => {
                if crate::portpeers::clients_of(port, None).is_none_or(|n| n == 0) {
                    tracing::info!(editor = %editor.id, "the other client left the editor; connecting again");
                    return true;
                }
            }
        }
    }
}

/// Once the link is up again after being taken: the attached sessions hear it is back.
pub(super) fn announce_back(editor: &Arc<Editor>, host: &dyn LinkHost) {
    if lock(&editor.link).reason.take().is_some() {
        host.state_changed();
        announce(editor, host, "ready", None);
    }
}

/// `broker/editor_state {editor, state, reason}` to every session attached to `editor`.
fn announce(editor: &Arc<Editor>, host: &dyn LinkHost, state: &str, reason: Option<&str>) {
    host.broadcast(
        editor,
        &jsonrpc::notification(
            jsonrpc::broker::EDITOR_STATE,
            json!({"editor": editor.id, "state": state, "reason": reason}),
        ),
    );
}
