// The pi transcript as ACP `SessionUpdate`s, for an ACP editor that follows this session
// through the broker (`pi-ide-broker acp`; docs/protocol.md, "Following a session"). The
// broker passes these on untouched: the shapes are ACP v1's (agentclientprotocol.com,
// protocol/prompt-turn and protocol/tool-calls).

import { resolve } from "node:path";

/** One ACP `session/update` payload (`update`). */
export type SessionUpdate = Record<string, unknown> & { sessionUpdate: string };

/** The most of a tool's output an update carries (a `read` of a large file is not copied
 * whole into the editor's thread). */
export const MAX_OUTPUT_CHARS = 8000;

/** ACP's tool kinds for pi's built-in tools. */
export function toolKind(toolName: string): string {
	switch (toolName) {
		case "read":
			return "read";
		case "write":
		case "edit":
			return "edit";
		case "bash":
			return "execute";
		case "grep":
		case "find":
		case "ls":
			return "search";
		default:
			return "other";
	}
}

/** A title for a tool call: its name and what it works on. */
export function toolTitle(toolName: string, args: unknown): string {
	const a = (args ?? {}) as Record<string, unknown>;
	const on = [a.path, a.command, a.pattern].find((x) => typeof x === "string") as string | undefined;
	return on ? `${toolName} ${on.length > 120 ? `${on.slice(0, 117)}...` : on}` : toolName;
}

function locations(cwd: string, args: unknown): { path: string }[] {
	const p = (args as { path?: unknown } | null)?.path;
	return typeof p === "string" && p ? [{ path: resolve(cwd, p.startsWith("@") ? p.slice(1) : p) }] : [];
}

/** The text of a message's content (a string, or blocks whose text ones are joined). */
export function contentText(content: unknown): string {
	if (typeof content === "string") return content;
	if (!Array.isArray(content)) return "";
	return content
		.filter((b) => b && typeof b === "object" && (b as { type?: unknown }).type === "text")
		.map((b) => String((b as { text?: unknown }).text ?? ""))
		.join("");
}

function clip(text: string): string {
	return text.length > MAX_OUTPUT_CHARS ? `${text.slice(0, MAX_OUTPUT_CHARS)}\n… (${text.length - MAX_OUTPUT_CHARS} more characters)` : text;
}

const chunk = (kind: string, text: string): SessionUpdate => ({ sessionUpdate: kind, content: { type: "text", text } });

/** A user message as it starts (typed in pi's terminal, or sent by pi's RPC client). */
export function userMessage(content: unknown): SessionUpdate | null {
	const text = contentText(content);
	return text ? chunk("user_message_chunk", text) : null;
}

/** An assistant streaming event (`message_update`'s `assistantMessageEvent`). */
export function assistantDelta(event: unknown): SessionUpdate | null {
	const e = (event ?? {}) as { type?: unknown; delta?: unknown };
	if (typeof e.delta !== "string" || !e.delta) return null;
	if (e.type === "text_delta") return chunk("agent_message_chunk", e.delta);
	if (e.type === "thinking_delta") return chunk("agent_thought_chunk", e.delta);
	return null;
}

/** A tool call pi is about to make (`tool_call`, before any review). */
export function toolCallProposed(cwd: string, toolCallId: string, toolName: string, args: unknown): SessionUpdate {
	return {
		sessionUpdate: "tool_call",
		toolCallId,
		title: toolTitle(toolName, args),
		kind: toolKind(toolName),
		status: "pending",
		rawInput: args ?? {},
		locations: locations(cwd, args),
	};
}

/** A tool call that started running. */
export function toolCallRunning(toolCallId: string): SessionUpdate {
	return { sessionUpdate: "tool_call_update", toolCallId, status: "in_progress" };
}

/** A tool call that finished (or failed, or was blocked: pi reports those as errors). */
export function toolCallDone(toolCallId: string, result: unknown, isError: boolean): SessionUpdate {
	const r = (result ?? {}) as { content?: unknown };
	const text = clip(contentText(r.content ?? result));
	return {
		sessionUpdate: "tool_call_update",
		toolCallId,
		status: isError ? "failed" : "completed",
		content: text ? [{ type: "content", content: { type: "text", text } }] : [],
	};
}

/** The session so far (its current branch's entries), as the updates that replay it. */
export function history(cwd: string, entries: readonly unknown[]): SessionUpdate[] {
	const out: SessionUpdate[] = [];
	// A replayed call carries its final status from the start: a failed one never shows
	// `completed` before its result says `failed`.
	const failed = new Set<unknown>();
	for (const entry of entries) {
		const m = (entry as { type?: unknown; message?: Record<string, unknown> })?.message;
		if (m?.role === "toolResult" && m.isError === true) failed.add(m.toolCallId);
	}
	for (const entry of entries) {
		const e = entry as { type?: unknown; message?: Record<string, unknown> };
		if (e?.type !== "message" || !e.message) continue;
		const m = e.message;
		if (m.role === "user") {
			const u = userMessage(m.content);
			if (u) out.push(u);
		} else if (m.role === "assistant" && Array.isArray(m.content)) {
			for (const b of m.content as Record<string, unknown>[]) {
				if (b?.type === "text" && typeof b.text === "string" && b.text) out.push(chunk("agent_message_chunk", b.text));
				else if (b?.type === "thinking" && typeof b.thinking === "string" && b.thinking) out.push(chunk("agent_thought_chunk", b.thinking));
				else if (b?.type === "toolCall" && typeof b.id === "string") {
					const name = String(b.name ?? "tool");
					const status = failed.has(b.id) ? "failed" : "completed";
					out.push({ ...toolCallProposed(cwd, b.id, name, b.arguments), status });
				}
			}
		} else if (m.role === "toolResult" && typeof m.toolCallId === "string") {
			out.push(toolCallDone(m.toolCallId, m, m.isError === true));
		}
	}
	return out;
}

/** The line put before a `read`'s result when it shows the editor's buffer (unsaved changes)
 * instead of the file on disk. */
export function bufferNote(editor: string): string {
	return `(unsaved changes in ${editor}: this is the editor's buffer, not the file on disk)`;
}

/** How a follower's prompt turn ended: ACP's `stopReason`. */
export function stopReason(aborted: boolean): "end_turn" | "cancelled" {
	return aborted ? "cancelled" : "end_turn";
}
