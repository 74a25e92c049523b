import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { LinkLost, RequestAborted } from "../src/broker.ts";
import { reviewWrite, type ReviewDeps } from "../src/review.ts";

/** A link whose `openDiff` answers `answer` (a result, or an error thrown); records calls. */
function link(answer: unknown | Error) {
	const calls: { name: string; args: Record<string, unknown> }[] = [];
	return {
		calls,
		attached: { id: "nvim" },
		async callTool(name: string, args: Record<string, unknown>) {
			calls.push({ name, args });
			if (name !== "openDiff") return {};
			if (answer instanceof Error) throw answer;
			return answer;
		},
	};
}

function deps(l: ReviewDeps["link"], over: Partial<ReviewDeps> = {}): ReviewDeps & { told: string[] } {
	const told: string[] = [];
	return { link: l, editorReviews: true, followerReviews: false, attachedWithin: async () => true, notify: (t) => told.push(t), told, ...over };
}

const saved = (text: string) => ({ content: [{ type: "text", text: "FILE_SAVED" }, { type: "text", text }] });
const rejected = { content: [{ type: "text", text: "DIFF_REJECTED" }, { type: "text", text: "tab" }] };
const write = (input: Record<string, unknown>) => ({ toolCallId: "t1", toolName: "write", input });

test("an accepted write carries the text the user accepted, and its tab is closed", async () => {
	const l = link(saved("accepted\n"));
	const input = { path: "a.txt", content: "proposed\n" };
	assert.equal(await reviewWrite(deps(l), write(input), "/p", undefined), undefined);
	assert.equal(input.content, "accepted\n");
	assert.equal(l.calls[0].args.new_file_path, "/p/a.txt");
	assert.equal(l.calls[0].args.new_file_contents, "proposed\n");
	assert.equal(l.calls[1].name, "close_tab");
});

test("an accepted edit becomes one whole-file edit from the original to the accepted text", async () => {
	const dir = mkdtempSync(join(tmpdir(), "review-"));
	writeFileSync(join(dir, "b.txt"), "one\ntwo\n");
	const input = { path: "b.txt", edits: [{ oldText: "two", newText: "2" }] as { oldText: string; newText: string }[] };
	const l = link(saved("one\nTWO\n"));
	const ev = { toolCallId: "t2", toolName: "edit", input };
	assert.equal(await reviewWrite(deps(l), ev, dir, undefined), undefined);
	assert.equal(l.calls[0].args.new_file_contents, "one\n2\n");
	assert.deepEqual(input.edits, [{ oldText: "one\ntwo\n", newText: "one\nTWO\n" }]);
});

test("rejected, undelivered, lost or aborted: blocked, the file never changes, and why is said", async () => {
	const input = () => ({ path: "a.txt", content: "x" });
	let r = await reviewWrite(deps(link(rejected)), write(input()), "/p", undefined);
	assert.match(r?.reason ?? "", /user rejected/);
	const undelivered = { ...rejected, _meta: { "pi-ide-broker/undelivered": "no editor" } };
	const d = deps(link(undelivered));
	r = await reviewWrite(d, write(input()), "/p", undefined);
	assert.match(r?.reason ?? "", /could not be reviewed .*no editor.*NOT changed/);
	assert.equal(d.told.length, 1);
	r = await reviewWrite(deps(link(new LinkLost("gone"))), write(input()), "/p", undefined);
	assert.match(r?.reason ?? "", /connection to the editor was lost/);
	const quiet = deps(link(new RequestAborted("tools/call")));
	r = await reviewWrite(quiet, write(input()), "/p", undefined);
	assert.match(r?.reason ?? "", /pi stopped before .* was reviewed/);
	assert.equal(quiet.told.length, 0, "an abort is pi's own doing: nothing to warn about");
});

test("nobody reviews: the write is pi's own; other tools are never reviewed", async () => {
	const l = link(saved("x"));
	const none = deps(l, { editorReviews: false, followerReviews: false });
	assert.equal(await reviewWrite(none, write({ path: "a.txt", content: "x" }), "/p", undefined), undefined);
	assert.equal(await reviewWrite(deps(l), { toolCallId: "t", toolName: "bash", input: {} }, "/p", undefined), undefined);
	assert.equal(l.calls.length, 0);
});

test("a follower reviews even while no editor is attached; the editor's review waits for it to be back", async () => {
	const l = { ...link(saved("y")), attached: null };
	const follower = deps(l, { editorReviews: false, followerReviews: true, attachedWithin: async () => false });
	assert.equal(await reviewWrite(follower, write({ path: "a.txt", content: "x" }), "/p", undefined), undefined);
	const editor = deps(link(saved("y")), { attachedWithin: async () => false });
	(editor.link as { attached: unknown }).attached = null;
	const r = await reviewWrite(editor, write({ path: "a.txt", content: "x" }), "/p", undefined);
	assert.match(r?.reason ?? "", /not reachable right now/);
});
