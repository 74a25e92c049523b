//! Reviews: the broker's diff offered to the client as a permission, and the client's verdict
//! taken back to the broker.

use super::{error_text, Agent, Out, Review, INTERNAL_ERROR};
use crate::protocol::acp::{self, method, PermissionOutcome};
use crate::protocol::jsonrpc;
use serde::Deserialize as _;
use serde_json::{json, Map, Value};

impl Agent {
    /// The broker asks the client to review a diff: a `session/request_permission` whose tool
    /// call carries the diff.
    pub(super) fn review(
        &mut self,
        key: &str,
        broker_id: Value,
        params: Option<&Value>,
    ) -> Vec<Out> {
        let args = crate::protocol::follow::params::<crate::protocol::follow::Review>(params)
            .unwrap_or_default()
            .arguments;
        let (path, new_text, tab) = (args.new_file_path, args.new_file_contents, args.tab_name);
        let old_text = args
            .old_file_path
            .and_then(|p| std::fs::read_to_string(p).ok());
        // pi's tab names are `pi-<tool>:<toolCallId>`: the permission names pi's own call.
        let tool_call_id = tab
            .split_once(':')
            .map_or(tab.as_str(), |(_, id)| id)
            .to_string();
        let verb = if old_text.is_some() { "Edit" } else { "Write" };
        let ours = self.mint("permission");
        self.reviews.insert(
            ours.clone(),
            Review {
                session: key.to_string(),
                broker_id,
                new_text: new_text.clone(),
                tab,
            },
        );
        let option = |id: &str, name: &str, kind: &str| acp::PermissionOption {
            option_id: id.into(),
            name: name.into(),
            kind: kind.into(),
        };
        let request = acp::RequestPermissionRequest {
            session_id: key.to_string(),
            tool_call: acp::ToolCallUpdate {
                tool_call_id,
                title: format!("{verb} {path}"),
                kind: "edit".into(),
                status: "pending".into(),
                content: vec![acp::DiffContent {
                    path: path.clone(),
                    old_text,
                    new_text,
                }],
                locations: vec![acp::Location { path }],
            },
            options: vec![
                option("allow", "Allow", "allow_once"),
                option("reject", "Reject", "reject_once"),
            ],
        };
        vec![Out::Client(jsonrpc::request(
            &Value::String(ours),
            method::REQUEST_PERMISSION,
            acp::to_value(&request),
        ))]
    }

    pub(super) fn permission_answered(&mut self, id: &Value, msg: &Map<String, Value>) -> Vec<Out> {
        if let Some((key, broker_id)) = id.as_str().and_then(|k| self.reads.remove(k)) {
            let answer = match (msg.get("result"), msg.get("error")) {
                (Some(r), _) => jsonrpc::result(&broker_id, r.clone()),
                (None, Some(e)) => jsonrpc::error(&broker_id, INTERNAL_ERROR, &error_text(e)),
                _ => jsonrpc::error(&broker_id, INTERNAL_ERROR, "the editor gave no buffer"),
            };
            return vec![Out::Broker(key, answer)];
        }
        let Some(r) = id.as_str().and_then(|k| self.reviews.remove(k)) else {
            return Vec::new();
        };
        let answer = msg
            .get("result")
            .and_then(|r| acp::RequestPermissionResponse::deserialize(r).ok());
        let allowed = matches!(answer.map(|a| a.outcome),
            Some(PermissionOutcome::Selected { option_id }) if option_id == "allow");
        let result = if allowed {
            json!({"content": [acp::ContentBlock::text("FILE_SAVED"), acp::ContentBlock::text(&r.new_text)]})
        } else {
            jsonrpc::diff_rejected(&r.tab)
        };
        vec![Out::Broker(
            r.session,
            jsonrpc::result(&r.broker_id, result),
        )]
    }
}
