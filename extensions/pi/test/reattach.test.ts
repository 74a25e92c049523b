// The link reattaches when its daemon dies (src/broker.ts): a daemon that crashes (SIGKILL) is
// started again, once per outage, and the link opens on it; before the first connection the
// link starts one as it always did; a daemon it started that exits at once (the old one still
// stopping held the lock) is started again; a link without a command waits for a daemon started
// another way. The "daemon" is a real process the link spawns (`<command> daemon`): a node
// script serving WebSocket upgrades on the link's Unix socket, counting its starts.

import assert from "node:assert/strict";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { BrokerLink } from "../src/broker.ts";

/** What the link told, and a bounded wait for it: `until` checks its condition at each event
 * the link reports (no polling), failing after `ms`. */
function recorder() {
	const opens: boolean[] = [];
	const spawned: boolean[] = [];
	let wake = () => {};
	const told = () => wake();
	const events = {
		onOpen: (again: boolean) => {
			opens.push(again);
			told();
		},
		onSpawned: (_log: string | undefined, again: boolean) => {
			spawned.push(again);
			told();
		},
	};
	const until = async (what: string, cond: () => boolean, ms = 10_000) => {
		const deadline = Date.now() + ms;
		while (!cond()) {
			const left = deadline - Date.now();
			if (left <= 0) throw new Error(`timed out waiting for ${what}`);
			await new Promise<void>((resolve) => {
				const t = setTimeout(resolve, left);
				wake = () => {
					clearTimeout(t);
					resolve();
				};
			});
		}
	};
	return { opens, spawned, events, until };
}

/** A dir (0700) with the socket path, and a fake daemon command that serves it. */
function world() {
	const dir = mkdtempSync(join(tmpdir(), "reattach-"));
	const socket = join(dir, "sock");
	const starts = join(dir, "starts");
	const pidFile = join(dir, "pid");
	// While this file is there, the next start fails at once (and removes it), as a daemon does
	// whose lock another, still stopping, holds.
	const failNext = join(dir, "fail-next");
	const ws = pathToFileURL(join(import.meta.dirname, "..", "node_modules", "ws", "wrapper.mjs")).href;
	const script = join(dir, "fake-daemon.mjs");
	writeFileSync(
		script,
		`#!${process.execPath}
import { appendFileSync, existsSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { WebSocketServer } from ${JSON.stringify(ws)};
appendFileSync(${JSON.stringify(starts)}, "start\\n");
if (existsSync(${JSON.stringify(failNext)})) {
	rmSync(${JSON.stringify(failNext)});
	console.error("error: pi-ide-broker is already running");
	process.exit(1);
}
rmSync(${JSON.stringify(socket)}, { force: true });
const server = createServer();
new WebSocketServer({ server });
server.listen(${JSON.stringify(socket)}, () => writeFileSync(${JSON.stringify(pidFile)}, String(process.pid)));
`,
	);
	chmodSync(script, 0o700);
	const startCount = () => {
		try {
			return readFileSync(starts, "utf8").split("\n").filter(Boolean).length;
		} catch {
			return 0;
		}
	};
	const kill = () => {
		const pid = Number(readFileSync(pidFile, "utf8"));
		rmSync(pidFile, { force: true });
		process.kill(pid, "SIGKILL");
	};
	const cleanup = () => {
		try {
			kill();
		} catch {
			// already gone
		}
		rmSync(dir, { recursive: true, force: true });
	};
	const failNextStart = () => writeFileSync(failNext, "");
	return { dir, socket, script, startCount, kill, failNextStart, cleanup };
}

/** A link with a command on a fresh world, started and connected once; `body` runs, then the
 * link is closed and the world cleaned up. */
async function connected(
	respawnAfterMs: number,
	body: (w: ReturnType<typeof world>, r: ReturnType<typeof recorder>) => Promise<void>,
) {
	const w = world();
	const r = recorder();
	const link = new BrokerLink(w.socket, { cwd: "/p", session: "s" }, r.events, w.script);
	link.respawnAfterMs = respawnAfterMs;
	try {
		link.start();
		await r.until("the first connection", () => r.opens.length === 1);
		await body(w, r);
	} finally {
		link.close();
		w.cleanup();
	}
}

test("a daemon that crashes is started again once and the link reopens on it", async () => {
	await connected(300, async (w, { opens, spawned, until }) => {
		assert.deepEqual(spawned, [false], "started before the first connection");
		for (let round = 1; round <= 3; round++) {
			const t0 = Date.now();
			w.kill();
			await until(`reopened after crash ${round}`, () => opens.length === round + 1);
			console.log(`crash ${round}: reopened after ${Date.now() - t0} ms`);
			assert.equal(opens[round], true, "a reconnection");
			assert.equal(w.startCount(), round + 1, "one daemon started per outage");
		}
		assert.deepEqual(spawned, [false, true, true, true], "each restart told as one");
	});
});

test("a daemon started while the old one still stops, which exits at once, is started again", async () => {
	await connected(300, async (w, { opens, spawned, until }) => {
		w.failNextStart();
		const t0 = Date.now();
		w.kill();
		await until("reopened on the daemon started after the one that exited", () => opens.length === 2);
		console.log(`reopened ${Date.now() - t0} ms after the crash, past a start that failed`);
		assert.equal(w.startCount(), 3, "the first start, the one that exited, the one that serves");
		assert.deepEqual(spawned, [false, true], "the restart told once");
	});
});

test("an outage shorter than the service manager's restart starts no daemon", async () => {
	await connected(60_000, async (w, { opens, until }) => {
		w.kill();
		// The "service manager" brings it back itself: the link waits for it and reopens.
		await new Promise((r) => setTimeout(r, 400));
		assert.equal(w.startCount(), 1, "the link started none while the outage was short");
		const { spawn } = await import("node:child_process");
		spawn(w.script, ["daemon"], { stdio: "ignore" }).unref();
		await until("reopened on the daemon started elsewhere", () => opens.length === 2);
		assert.equal(w.startCount(), 2);
	});
});

test("a link without a command never starts a daemon, before or after a crash", async () => {
	const w = world();
	const { opens, events, until } = recorder();
	const { spawn } = await import("node:child_process");
	spawn(w.script, ["daemon"], { stdio: "ignore" }).unref();
	const link = new BrokerLink(w.socket, { cwd: "/p", session: "s" }, events);
	link.respawnAfterMs = 0;
	try {
		link.start();
		await until("the first connection", () => opens.length === 1);
		w.kill();
		await new Promise((r) => setTimeout(r, 500));
		assert.equal(w.startCount(), 1);
		assert.equal(opens.length, 1);
	} finally {
		link.close();
		w.cleanup();
	}
});
