import assert from "node:assert/strict";
import { test } from "node:test";
import { Followers } from "../src/followers.ts";

test("the followers notice sets the count, the reviewer and buffers, and says a new reviewer once", () => {
	const f = new Followers();
	assert.equal(f.watched, false);
	assert.equal(f.heard({ count: 2, reviewer: "Zed", buffers: true }), "Zed");
	assert.deepEqual([f.count, f.reviewer, f.buffers, f.watched], [2, "Zed", true, true]);
	assert.equal(f.heard({ count: 2, reviewer: "Zed", buffers: true }), null, "the same reviewer is not said twice");
	assert.equal(f.heard({ count: 1, reviewer: null }), null);
	assert.deepEqual([f.count, f.reviewer, f.buffers], [1, null, false]);
	assert.equal(f.heard({ count: "x", reviewer: 3 }), null, "garbage is no follower");
	assert.deepEqual([f.count, f.reviewer], [0, null]);
	f.heard({ count: 1, reviewer: "agentic.nvim", buffers: true });
	f.lost();
	assert.deepEqual([f.count, f.reviewer, f.buffers, f.watched], [0, null, false, false]);
});

test("prompts waiting for pi are all answered when it settles, each once", async () => {
	const f = new Followers();
	const a = f.untilSettled();
	const b = f.untilSettled();
	f.settled(true);
	assert.deepEqual(await Promise.all([a, b]), [true, true]);
	const c = f.untilSettled();
	f.settled(false);
	f.settled(true);
	assert.equal(await c, false, "a prompt is answered by the first settle after it");
});
