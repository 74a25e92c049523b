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

test("a follower's prompt waits for pi to be idle, runs alone, and is answered by its own run's settle", async () => {
	const f = new Followers();
	const a = f.prompt("follow-3-1", "first");
	const b = f.prompt("follow-4-2", "second");
	assert.equal(f.next(false), null, "pi is busy (the terminal's turn): nothing is handed over");
	f.settled(false); // the terminal's turn settles: no prompt of ours ran in it
	assert.equal(f.next(true), "first");
	assert.equal(f.next(true), null, "one follower prompt runs at a time");
	f.settled(true);
	assert.equal(await a, true, "its run was aborted");
	assert.equal(f.next(true), "second");
	f.settled(false);
	f.settled(true);
	assert.equal(await b, false, "a prompt is answered by its own run's settle, once");
});

test("a cancel takes a queued prompt back, aborts only the prompt it started, and never touches the terminal's turn", async () => {
	const f = new Followers();
	const queued = f.prompt("follow-3-1", "queued behind the terminal");
	// pi's terminal runs its own turn: the follower's prompt waits; its cancel drops it.
	assert.equal(f.cancel("follow-3-1"), "dropped");
	assert.equal(await queued, true);
	assert.equal(f.next(true), null, "a cancelled prompt never runs");
	assert.equal(f.cancel("follow-3-1"), "none", "nothing runs for it: nothing to abort");
	// Another follower's running prompt is not stopped by this one's cancel.
	const mine = f.prompt("follow-3-2", "mine");
	const theirs = f.prompt("follow-4-3", "theirs");
	assert.equal(f.next(true), "mine");
	assert.equal(f.cancel("follow-4-3"), "dropped");
	assert.equal(await theirs, true);
	assert.equal(f.cancel("follow-3-2"), "abort", "the run it started is to be aborted");
	f.settled(true);
	assert.equal(await mine, true);
	// An older door names no prompt: every follower prompt stops; an older broker names none:
	// any cancel stops it.
	const old = f.prompt(undefined, "from an old broker");
	assert.equal(f.cancel("follow-9-9"), "dropped");
	assert.equal(await old, true);
	const x = f.prompt("follow-5-1", "x");
	assert.equal(f.cancel(undefined), "dropped");
	assert.equal(await x, true);
});

test("the session's end answers every prompt, queued or running, as stopped", async () => {
	const f = new Followers();
	const running = f.prompt("a", "running");
	const queued = f.prompt("b", "queued");
	assert.equal(f.next(true), "running");
	f.ended();
	assert.deepEqual(await Promise.all([running, queued]), [true, true]);
	assert.equal(f.next(true), null);
});
