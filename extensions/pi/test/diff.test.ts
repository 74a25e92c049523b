import assert from "node:assert/strict";
import { test } from "node:test";
import { applyEdits, parseDiffResult, tabName, toolPath } from "../src/diff.ts";

test("paths resolve as pi's tools resolve them", () => {
	assert.equal(toolPath("/proj", "src/a.ts"), "/proj/src/a.ts");
	assert.equal(toolPath("/proj", "/abs/b.ts"), "/abs/b.ts");
	assert.equal(toolPath("/proj", "@src/c.ts"), "/proj/src/c.ts");
	assert.equal(toolPath("/proj", "~/d.ts", "/home/u"), "/home/u/d.ts");
	assert.equal(toolPath("/proj", "../x/./e.ts"), "/x/e.ts");
});

test("edits apply exactly once each, in order, without $ patterns", () => {
	assert.equal(applyEdits("a b c", [{ oldText: "b", newText: "$&B" }]), "a $&B c");
	assert.equal(applyEdits("one\ntwo\n", [{ oldText: "one", newText: "1" }, { oldText: "two", newText: "2" }]), "1\n2\n");
	assert.throws(() => applyEdits("x x", [{ oldText: "x", newText: "y" }]), /not unique/);
	assert.throws(() => applyEdits("x", [{ oldText: "z", newText: "y" }]), /not found/);
	assert.throws(() => applyEdits("x", [{ oldText: "", newText: "y" }]), /empty/);
});

test("only FILE_SAVED with its text is an acceptance", () => {
	const r = (...texts: unknown[]) => ({ content: texts.map((text) => ({ type: "text", text })) });
	assert.deepEqual(parseDiffResult(r("FILE_SAVED", "final\n")), { kind: "saved", text: "final\n" });
	assert.deepEqual(parseDiffResult(r("FILE_SAVED", "")), { kind: "saved", text: "" });
	assert.equal(parseDiffResult(r("FILE_SAVED")).kind, "rejected");
	assert.equal(parseDiffResult(r("DIFF_REJECTED", "pi-write:1")).kind, "rejected");
	assert.equal(parseDiffResult(r("TAB_CLOSED")).kind, "rejected");
	assert.equal(parseDiffResult(null).kind, "rejected");
	assert.equal(parseDiffResult({ content: "FILE_SAVED" }).kind, "rejected");
	assert.equal(tabName("write", "call_1"), "pi-write:call_1");
	const lost = { ...r("DIFF_REJECTED", "pi-write:1"), _meta: { "pi-ide-broker/undelivered": "editor link lost" } };
	assert.deepEqual(parseDiffResult(lost), { kind: "undelivered", why: "editor link lost" });
});
