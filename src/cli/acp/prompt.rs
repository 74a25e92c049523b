//! What an ACP prompt carries to pi: its text and file links, without the blocks a client
//! re-sends.

use super::agent::FOLLOW_WORDS;
use crate::protocol::acp::ContentBlock;

/// A prompt's parts, one per block carried (its text blocks, its resource links as `@path`;
/// joined by spaces, as Zed puts a mention between two text blocks), and the types of the
/// blocks it cannot carry (an image, audio, an embedded resource).
pub(super) fn prompt_parts(blocks: &[ContentBlock]) -> (Vec<String>, Vec<String>) {
    let (mut parts, mut unsent) = (Vec::new(), Vec::new());
    for b in blocks {
        match b.kind.as_deref() {
            Some("text") => parts.extend(b.text.clone()),
            Some("resource_link") => parts.extend(
                b.uri
                    .as_deref()
                    .map(|u| format!("@{}", u.strip_prefix("file://").unwrap_or(u))),
            ),
            Some(other) => unsent.push(other.to_string()),
            None => unsent.push("a block without a type".to_string()),
        }
    }
    parts.retain(|p| !p.trim().is_empty());
    (parts, unsent)
}

/// The parts of a prompt that are new: leading parts this thread already sent to pi, or a
/// `follow` word, are a client re-sending unfinished messages (CodeCompanion re-sends a
/// cancelled one with the next) and are dropped; the last part always stays.
pub(super) fn fresh_parts<'p>(
    parts: &'p [String],
    sent: &std::collections::VecDeque<String>,
) -> &'p [String] {
    let mut start = 0;
    while start + 1 < parts.len() {
        let p = parts[start].trim();
        if FOLLOW_WORDS.contains(&p.to_lowercase().as_str()) || sent.iter().any(|s| s == p) {
            start += 1;
        } else {
            break;
        }
    }
    &parts[start..]
}
