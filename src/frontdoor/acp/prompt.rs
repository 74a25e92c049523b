//! What an ACP prompt carries to pi: its text and file links, without the blocks a client
//! re-sends.

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

/// The blocks of a prompt that are new, given `resent`: the blocks of this thread's last
/// prompt that the client cancelled (none once a prompt came after it).
///
/// CodeCompanion sends each message of its chat as blocks of its own and marks them sent when
/// their turn ends, unless the user stopped it: a stopped message goes again, whole, at the
/// head of the next prompt. So the re-sent part is exactly the cancelled prompt's blocks, all
/// of them, in order, and a message of its own follows, starting with a text block after a
/// text block. One message typed in Zed is text split around its mentions (`explain `, a
/// link, ` and this`): it never has two text blocks in a row, so it is never cut, even when
/// it starts as the cancelled one did. Anything else is sent whole: a block the thread sent
/// before (the same file mentioned again, the same words) is meant again.
pub(super) fn fresh_blocks<'b>(
    blocks: &'b [ContentBlock],
    resent: &[ContentBlock],
) -> &'b [ContentBlock] {
    let n = resent.len();
    let is_text = |b: Option<&ContentBlock>| b.is_some_and(|b| b.kind.as_deref() == Some("text"));
    // A text block after the re-sent ones: something of its own follows them.
    let cut = n > 0
        && blocks.get(..n) == Some(resent)
        && is_text(blocks.get(n - 1))
        && is_text(blocks.get(n));
    if cut {
        &blocks[n..]
    } else {
        blocks
    }
}
