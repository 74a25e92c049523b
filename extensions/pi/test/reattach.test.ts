// The link reattaches when its daemon dies (src/broker.ts): a daemon that crashes (SIGKILL) is
// started again, once per outage, and the link opens on it; before the first connection the
// link starts one as it always did; a daemon it started that exits at once (the old one still
// stopping held the lock) is started again; a link without a command waits for a daemon started
// another way; starts that fail otherwise (a broken config) are told once, with the daemon's own
// error. The "daemon" is a real process the link spawns (`<command> daemon`): a node script
// serving WebSocket upgrades on the link's Unix socket, counting its starts.

import assert from "node:assert/strict";
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { pathToFileURL } from "node:url";
import { BrokerLink, EXIT_ALREADY_RUNNING } from "../src/broker.ts";

/** What the link told, and a bounded wait for it: `until` checks its condition at each event
 * the link reports (no polling), failing after `ms`. */
function recorder() {
	const opens: boolean[] = [];
	const spawned: boolean[] = [];
	const exited: { how: string; said: string | undefined }[] = [];
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
		onSpawnExited: (_command: string, how: string, said: string | undefined) => {
			exited.push({ how, said });
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
	return { opens, spawned, exited, events, until };
}

/** A dir (0700) with the socket path, and a fake daemon command that serves it. */
function world() {
	const dir = mkdtempSync(join(tmpdir(), "reattach-"));
	const socket = join(dir, "sock");
	const starts = join(dir, "starts");
	const pidFile = join(dir, "pid");
	// While this file says n > 0, a start fails at once (and counts n down), as a daemon does
	// whose lock another, still stopping, holds.
	const failNext = join(dir, "fail-next");
	// While this file is there, every start fails as a daemon with a broken config does.
	const broken = join(dir, "broken");
	const ws = pathToFileURL(join(import.meta.dirname, "..", "node_modules", "ws", "wrapper.mjs")).href;
	const script = join(dir, "fake-daemon.mjs");
	writeFileSync(
		script,
		`#!${process.execPath}
import { appendFileSync, existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { WebSocketServer } from ${JSON.stringify(ws)};
appendFileSync(${JSON.stringify(starts)}, "start\\n");
if (existsSync(${JSON.stringify(broken)})) {
	console.error("error: fix the config file, or pass --config with another one: config x.toml is invalid");
	process.exit(1);
}
const left = existsSync(${JSON.stringify(failNext)}) ? Number(readFileSync(${JSON.stringify(failNext)}, "utf8")) : 0;
if (left > 0) {
	writeFileSync(${JSON.stringify(failNext)}, String(left - 1));
	console.error("error: pi-ide-broker is already running");
	process.exit(${EXIT_ALREADY_RUNNING});
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
	const failNextStarts = (n: number) => writeFileSync(failNext, String(n));
	const breakStarts = (on: boolean) => (on ? writeFileSync(broken, "") : rmSync(broken, { force: true }));
	return { dir, socket, script, startCount, kill, failNextStarts, breakStarts, cleanup };
}

/** A link with a command on a fresh world, started and connected once; `body` runs, then the
 * link is closed and the world cleaned up. */
async function connected(
	respawnAfterMs: number,
	body: (w: ReturnType<typeof world>, r: ReturnType<typeof recorder>, link: BrokerLink) => Promise<void>,
) {
	const w = world();
	const r = recorder();
	const link = new BrokerLink(w.socket, { cwd: "/p", session: "s" }, r.events, w.script, join(w.dir, "daemon.log"));
	link.respawnAfterMs = respawnAfterMs;
	try {
		link.start();
		await r.until("the first connection", () => r.opens.length === 1);
		await body(w, r, link);
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

test("daemons started while the old one still stops, which exit at once, are started again", async () => {
	await connected(300, async (w, { opens, spawned, exited, until }, link) => {
		link.spawnAgainMs = 100;
		w.failNextStarts(2);
		const t0 = Date.now();
		w.kill();
		await until("reopened on the daemon started after the ones that exited", () => opens.length === 2);
		console.log(`reopened ${Date.now() - t0} ms after the crash, past two starts that lost the race`);
		assert.equal(w.startCount(), 4, "the first start, the two that exited, the one that serves");
		assert.deepEqual(spawned, [false, true], "the restart told once");
		assert.deepEqual(exited, [], "a start that lost the race is not a failure to tell");
	});
});

test("daemons that fail at their start are told once, with their own error, and started until one serves", async () => {
	await connected(0, async (w, { opens, exited, until }, link) => {
		link.spawnAgainMs = 50;
		w.breakStarts(true);
		w.kill();
		await until("the failed starts told", () => exited.length === 1);
		assert.equal(exited[0].how, "exit code 1");
		assert.match(exited[0].said ?? "", /^error: fix the config file, .* is invalid$/);
		const deadline = Date.now() + 10_000;
		while (w.startCount() < 5) {
			assert.ok(Date.now() < deadline, `started ${w.startCount()} times`);
			await new Promise((r) => setTimeout(r, 20));
		}
		w.breakStarts(false);
		await until("reopened once the config is mended", () => opens.length === 2);
		assert.equal(exited.length, 1, "told once an outage");
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
