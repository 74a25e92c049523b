import assert from "node:assert/strict";
import { test } from "node:test";
import { assistantDelta, history, MAX_OUTPUT_CHARS, stopReason, toolCallDone, toolCallProposed, toolKind, userMessage } from "../src/follow.ts";

test("streamed text and thinking become ACP message and thought chunks; other events nothing", () => {
	assert.deepEqual(assistantDelta({ type: "text_delta", delta: "Hi" }), { sessionUpdate: "agent_message_chunk", content: { type: "text", text: "Hi" } });
	assert.deepEqual(assistantDelta({ type: "thinking_delta", delta: "hm" }), { sessionUpdate: "agent_thought_chunk", content: { type: "text", text: "hm" } });
	assert.equal(assistantDelta({ type: "toolcall_delta", delta: "{" }), null);
	assert.equal(assistantDelta({ type: "text_delta", delta: "" }), null);
	assert.deepEqual(userMessage([{ type: "text", text: "a" }, { type: "image" }, { type: "text", text: "b" }]), {
		sessionUpdate: "user_message_chunk",
		content: { type: "text", text: "ab" },
	});
	assert.equal(userMessage([]), null);
});

test("tool calls carry ACP's kind, an absolute location and their status; output is clipped", () => {
	const call = toolCallProposed("/proj", "c1", "write", { path: "src/a.ts", content: "x" });
	assert.equal(call.sessionUpdate, "tool_call");
	assert.equal(call.kind, "edit");
	assert.equal(call.status, "pending");
	assert.deepEqual(call.locations, [{ path: "/proj/src/a.ts" }]);
	assert.equal(call.title, "write src/a.ts");
	assert.equal(toolKind("bash"), "execute");
	assert.equal(toolKind("read"), "read");
	assert.equal(toolKind("mystery"), "other");
	const failed = toolCallDone("c1", { content: [{ type: "text", text: "boom" }] }, true);
	assert.equal(failed.status, "failed");
	assert.deepEqual(failed.content, [{ type: "content", content: { type: "text", text: "boom" } }]);
	const big = toolCallDone("c2", { content: [{ type: "text", text: "y".repeat(MAX_OUTPUT_CHARS + 10) }] }, false);
	const text = ((big.content as { content: { text: string } }[])[0]).content.text;
	assert.equal(big.status, "completed");
	assert.ok(text.length < MAX_OUTPUT_CHARS + 100 && text.endsWith("(10 more characters)"), text.slice(-40));
});

test("history replays the branch in order: user, assistant text, tool call, its result", () => {
	const entries = [
		{ type: "session_info" },
		{ type: "message", message: { role: "user", content: "write it" } },
		{
			type: "message",
			message: { role: "assistant", content: [{ type: "text", text: "ok" }, { type: "toolCall", id: "t1", name: "write", arguments: { path: "a.txt" } }] },
		},
		{ type: "message", message: { role: "toolResult", toolCallId: "t1", content: [{ type: "text", text: "wrote" }], isError: false } },
	];
	const kinds = history("/p", entries).map((u) => [u.sessionUpdate, (u as { status?: string }).status ?? ""]);
	assert.deepEqual(kinds, [
		["user_message_chunk", ""],
		["agent_message_chunk", ""],
		["tool_call", "completed"],
		["tool_call_update", "completed"],
	]);
	assert.equal(stopReason(true), "cancelled");
	assert.equal(stopReason(false), "end_turn");
});

test("a replayed failed tool call is failed from its first update, never completed first", () => {
	const entries = [
		{ type: "message", message: { role: "assistant", content: [{ type: "toolCall", id: "t2", name: "bash", arguments: { command: "false" } }] } },
		{ type: "message", message: { role: "toolResult", toolCallId: "t2", content: [{ type: "text", text: "exit 1" }], isError: true } },
	];
	const statuses = history("/p", entries).map((u) => (u as { status?: string }).status);
	assert.deepEqual(statuses, ["failed", "failed"]);
});

test("a buffer read is marked unsaved, naming the editor", async () => {
	const { bufferNote } = await import("../src/follow.ts");
	assert.equal(bufferNote("Zed"), "(unsaved changes in Zed: this is the editor's buffer, not the file on disk)");
});
