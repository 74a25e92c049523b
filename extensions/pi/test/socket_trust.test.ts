// The socket's trust check (src/socket_trust.ts) before any dial (issue 61: a squatter at the
// default socket path in a shared temp dir was sent the user's files). Real dirs and a real
// listener on a real Unix socket: the link to a path someone else may be listening at sends it
// nothing, starts no daemon, says what is wrong once, and connects once the path is fixed.
// The cases with another uid chown to 65534 and need root (as CI runs them). Each check of
// src/socket_trust.ts, removed, fails at least one test here.

import assert from "node:assert/strict";
import { chmodSync, chownSync, lchownSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { createPiIdeBroker } from "../index.ts";
import { BrokerLink } from "../src/broker.ts";
import { socketTrust } from "../src/socket_trust.ts";

delete process.env.PI_IDE_BROKER_SOCKET;
delete process.env.PI_IDE_BROKER_BIN;
delete process.env.PI_IDE_BROKER_NO_SPAWN;
delete process.env.PI_IDE_BROKER_TRUST_UID;

const ME = process.getuid?.() ?? 0;
const ROOT = ME === 0;
const NOBODY = 65534;
const needsRoot = ROOT ? false : "needs root (to chown to another uid)";
/** A spawn command that is not there: a spawn attempt shows as `onSpawnFailed` (ENOENT). */
const NO_BINARY = "/nonexistent/pi-ide-broker";

const base = mkdtempSync(join(tmpdir(), "pi-socket-trust-"));
after(() => rmSync(base, { recursive: true, force: true }));
let n = 0;
/** A fresh dir under `base` (0700, ours). */
function fresh(): string {
	const d = join(base, `case-${++n}`);
	mkdirSync(d, { mode: 0o700 });
	return d;
}

/** A listener that records everything sent to it. */
type Listener = { connections: number; bytes: string; close: () => Promise<void> };
/** Every listener, closed after the tests even when one fails half-way (an open server would
 * keep the test process from ending). */
const listeners: Listener[] = [];
after(async () => {
	for (const l of listeners) await l.close();
});

async function listen(path: string): Promise<Listener> {
	const got: Listener = { connections: 0, bytes: "", close: async () => {} };
	const peers = new Set<Socket>();
	const server: Server = createServer((c) => {
		got.connections++;
		peers.add(c);
		c.on("data", (d) => (got.bytes += d.toString("latin1")));
		c.on("error", () => {});
		c.on("close", () => peers.delete(c));
	});
	await new Promise<void>((done) => server.listen(path, done));
	got.close = () =>
		new Promise<void>((done) => {
			if (!server.listening) return done();
			for (const c of peers) c.destroy();
			server.close(() => done());
		});
	listeners.push(got);
	return got;
}

/** A link to `socket` (started), and what it told. */
function dialer(socket: string, named = false) {
	const told = { untrusted: [] as string[], unreachable: 0, spawnFailed: [] as string[], opened: 0 };
	const link = new BrokerLink(
		socket,
		{ cwd: "/p", session: "trust-1" },
		{
			onUntrusted: (p) => told.untrusted.push(p),
			onUnreachable: () => told.unreachable++,
			onSpawnFailed: (_c, code) => told.spawnFailed.push(String(code)),
			onOpen: () => told.opened++,
		},
		NO_BINARY,
		undefined,
		named,
	);
	link.start();
	return { link, told };
}

const sleep = (ms: number) => new Promise((done) => setTimeout(done, ms));

async function until(what: string, cond: () => boolean, ms = 5000): Promise<void> {
	const t0 = Date.now();
	while (!cond()) {
		if (Date.now() - t0 > ms) throw new Error(`timed out waiting for ${what}`);
		await sleep(20);
	}
}

/** Dials `socket` for 700 ms (several redials: 100, 200, 400 ms apart) and asserts the listener
 * was sent nothing, no daemon was started, and the problem (matching `why`) was told once. */
async function refused(socket: string, squatter: Listener, why: RegExp, named = false): Promise<string> {
	const { link, told } = dialer(socket, named);
	try {
		await sleep(700);
		assert.equal(squatter.connections, 0, "the squatter was dialled");
		assert.equal(squatter.bytes, "", "the squatter was sent bytes");
		assert.ok(told.unreachable >= 3, `redialled (${told.unreachable} attempts)`);
		assert.equal(told.untrusted.length, 1, `told once: ${JSON.stringify(told.untrusted)}`);
		assert.match(told.untrusted[0], why);
		assert.deepEqual(told.spawnFailed, [], "no daemon is started for an untrusted path");
		assert.equal(link.untrusted, told.untrusted[0]);
		return told.untrusted[0];
	} finally {
		link.close();
	}
}

/** The link dials `socket` and the listener gets the session's upgrade request. */
async function connects(socket: string, server: Listener, named = false): Promise<void> {
	const { link, told } = dialer(socket, named);
	try {
		await until("the upgrade request", () => server.bytes.includes("GET /v1/session?"));
		assert.deepEqual(told.untrusted, []);
		assert.equal(link.untrusted, null);
	} finally {
		link.close();
	}
}

test("a good 0700 dir of ours with our socket: the link dials it", async () => {
	const dir = join(fresh(), "pi-ide-broker-me");
	mkdirSync(dir, { mode: 0o700 });
	const s = await listen(join(dir, "sock"));
	assert.deepEqual(socketTrust(join(dir, "sock")), { kind: "trusted" });
	await connects(join(dir, "sock"), s);
	await s.close();
});

test("a socket dir of another uid (the squatter's): nothing sent, no daemon, told once what to do", { skip: needsRoot }, async () => {
	const dir = join(fresh(), "pi-ide-broker-me");
	mkdirSync(dir, { mode: 0o700 });
	const sock = join(dir, "sock");
	const s = await listen(sock);
	chownSync(sock, NOBODY, NOBODY);
	chownSync(dir, NOBODY, NOBODY);
	const said = await refused(sock, s, /the broker socket dir .* belongs to uid 65534, not you \(uid \d+\)(?: \(to reach [^)]*\))?: someone else may be listening there/);
	assert.ok(said.includes(`rm -rf ${dir}`) && said.includes("XDG_RUNTIME_DIR"), said);
	await s.close();
});

test("a socket dir writable by others (0777): nothing sent", { skip: needsRoot }, async () => {
	const dir = join(fresh(), "pi-ide-broker-me");
	mkdirSync(dir);
	chmodSync(dir, 0o777);
	const sock = join(dir, "sock");
	const s = await listen(sock);
	// Whoever could write there put their socket in.
	chownSync(sock, NOBODY, NOBODY);
	const said = await refused(sock, s, /the broker socket dir .* is writable by others \(mode 0777\)/);
	assert.ok(said.includes(`chmod 700 ${dir}`), said);
	await s.close();
});

test("a socket dir that is a symlink (the squatter's, to a dir of ours): nothing sent", async () => {
	const at = fresh();
	const real = join(at, "real");
	mkdirSync(real, { mode: 0o700 });
	const s = await listen(join(real, "sock"));
	const dir = join(at, "pi-ide-broker-me");
	symlinkSync(real, dir);
	if (ROOT) lchownSync(dir, NOBODY, NOBODY);
	await refused(join(dir, "sock"), s, /the broker socket dir .* is a symlink \(to .*real\): whoever made it may be listening/);
	await s.close();
});

test("a socket of another uid in a good dir: nothing sent", { skip: needsRoot }, async () => {
	const dir = fresh();
	const sock = join(dir, "sock");
	const s = await listen(sock);
	chownSync(sock, NOBODY, NOBODY);
	await refused(sock, s, /the broker socket .*sock belongs to uid 65534, not you \(uid \d+\)(?: \(to reach [^)]*\))?: someone else is listening there/);
	await s.close();
});

test("something that is not a socket at the socket path is refused, and starts no daemon", async () => {
	const dir = fresh();
	writeFileSync(join(dir, "sock"), "");
	const none = await listen(join(dir, "elsewhere"));
	await refused(join(dir, "sock"), none, /sock is not a socket/);
	await none.close();
});

test("a dir above the socket dir writable by others without the sticky bit: nothing sent", async () => {
	const open = join(fresh(), "open");
	mkdirSync(open);
	chmodSync(open, 0o777);
	const dir = join(open, "pi-ide-broker-me");
	mkdirSync(dir, { mode: 0o700 });
	const s = await listen(join(dir, "sock"));
	const said = await refused(join(dir, "sock"), s, /the dir .*open above the broker socket is writable by others \(mode 0777\) without the sticky bit/);
	assert.ok(said.includes(`chmod +t ${open}`), said);
	await s.close();
	// With the sticky bit (like /tmp) the same place is safe.
	chmodSync(open, 0o1777);
	const t = await listen(join(dir, "sock2"));
	await connects(join(dir, "sock2"), t);
	await t.close();
});

test("a dir above the socket dir of another uid: nothing sent", { skip: needsRoot }, async () => {
	const theirs = join(fresh(), "theirs");
	mkdirSync(theirs, { mode: 0o755 });
	const dir = join(theirs, "pi-ide-broker-me");
	mkdirSync(dir, { mode: 0o700 });
	const s = await listen(join(dir, "sock"));
	chownSync(theirs, NOBODY, NOBODY);
	await refused(join(dir, "sock"), s, /the dir .*theirs above the broker socket belongs to uid 65534, not you \(uid \d+\)(?: \(to reach [^)]*\))?: its owner could put their own socket/);
	await s.close();
});

test("a symlink of another uid on the way to the socket dir: nothing sent; one of ours is followed", { skip: needsRoot }, async () => {
	const at = fresh();
	const real = join(at, "real");
	mkdirSync(join(real, "pi-ide-broker-me"), { recursive: true, mode: 0o700 });
	const s = await listen(join(real, "pi-ide-broker-me", "sock"));
	symlinkSync(real, join(at, "via"));
	await connects(join(at, "via", "pi-ide-broker-me", "sock"), s);
	await s.close();
	lchownSync(join(at, "via"), NOBODY, NOBODY);
	const t = await listen(join(real, "pi-ide-broker-me", "sock2"));
	await refused(join(at, "via", "pi-ide-broker-me", "sock2"), t, /via on the way to the broker socket is a symlink of uid 65534/);
	await t.close();
});

test("a socket path the user named may sit in a shared sticky dir (ssh -R into /tmp), if the socket is theirs", { skip: needsRoot }, async () => {
	const shared = join(fresh(), "shared");
	mkdirSync(shared);
	chmodSync(shared, 0o1777);
	const mine = await listen(join(shared, "pi-ide-broker.sock"));
	await connects(join(shared, "pi-ide-broker.sock"), mine, true);
	// The default path is never let into such a dir.
	assert.match(String((socketTrust(join(shared, "pi-ide-broker.sock")) as { problem?: string }).problem), /writable by others/);
	await mine.close();
	const squat = await listen(join(shared, "squat.sock"));
	chownSync(join(shared, "squat.sock"), NOBODY, NOBODY);
	await refused(join(shared, "squat.sock"), squat, /squat\.sock belongs to uid 65534, not you/, true);
	await squat.close();
	// Writable by others without the sticky bit: refused, named or not.
	chmodSync(shared, 0o777);
	const open = await listen(join(shared, "open.sock"));
	await refused(join(shared, "open.sock"), open, /the broker socket dir .*shared is writable by others \(mode 0777\) without the sticky bit/, true);
	await open.close();
});

test("a rootful container's root reaches its host user's bind-mounted socket only with PI_IDE_BROKER_TRUST_UID", { skip: needsRoot }, async () => {
	const dir = join(fresh(), "mounted");
	mkdirSync(dir, { mode: 0o700 });
	const sock = join(dir, "sock");
	const s = await listen(sock);
	chownSync(sock, NOBODY, NOBODY);
	chownSync(dir, NOBODY, NOBODY);
	const said = await refused(sock, s, /the broker socket dir .*mounted belongs to uid 65534, not you \(uid 0\) \(to reach that user's broker as root, set PI_IDE_BROKER_TRUST_UID=65534\)/, true);
	assert.ok(said.includes("PI_IDE_BROKER_SOCKET"), said);
	process.env.PI_IDE_BROKER_TRUST_UID = ` 1000, ${NOBODY}`;
	try {
		await connects(sock, s, true);
		assert.deepEqual(socketTrust(sock), { kind: "trusted" }, "the default path takes the listed uids too");
	} finally {
		delete process.env.PI_IDE_BROKER_TRUST_UID;
	}
	assert.equal(socketTrust(sock, { env: { PI_IDE_BROKER_TRUST_UID: "1000" } }).kind, "refused");
	await s.close();
});

test("nothing at a safe path: no dial, the daemon is started (once), no trust notice", async () => {
	const dir = join(fresh(), "not-yet");
	assert.deepEqual(socketTrust(join(dir, "sock")), { kind: "absent" });
	const { link, told } = dialer(join(dir, "sock"));
	try {
		await until("the spawn attempt", () => told.spawnFailed.length > 0);
		await sleep(400);
		assert.deepEqual(told.spawnFailed, ["ENOENT"]);
		assert.deepEqual(told.untrusted, []);
	} finally {
		link.close();
	}
});

test("a squatted path keeps being checked, told once, and connects once fixed", { skip: needsRoot }, async () => {
	const dir = join(fresh(), "pi-ide-broker-me");
	mkdirSync(dir);
	chmodSync(dir, 0o777);
	const sock = join(dir, "sock");
	const s = await listen(sock);
	const { link, told } = dialer(sock);
	try {
		await sleep(1200);
		assert.equal(told.untrusted.length, 1, JSON.stringify(told.untrusted));
		assert.equal(s.connections, 0);
		chmodSync(dir, 0o700);
		await until("the upgrade request after the fix", () => s.bytes.includes("GET /v1/session?"));
		assert.equal(told.untrusted.length, 1);
		assert.equal(link.untrusted, null);
		assert.deepEqual(told.spawnFailed, []);
	} finally {
		link.close();
		await s.close();
	}
});

test("Windows (a named pipe) is not checked: its DACL is the daemon's guard", () => {
	assert.deepEqual(socketTrust("\\\\.\\pipe\\pi-ide-broker-S-1-5-21", { platform: "win32" }), { kind: "trusted" });
});

test("the extension says a squatted default socket once, starts no daemon, and /ide repeats why", { skip: needsRoot, timeout: 20_000 }, async () => {
	const xdg = fresh();
	process.env.XDG_RUNTIME_DIR = xdg;
	const dir = join(xdg, "pi-ide-broker");
	mkdirSync(dir, { mode: 0o700 });
	const s = await listen(join(dir, "sock"));
	chownSync(join(dir, "sock"), NOBODY, NOBODY);
	chownSync(dir, NOBODY, NOBODY);
	const handlers = new Map<string, ((event: unknown, ctx: unknown) => unknown)[]>();
	const commands = new Map<string, { handler: (args: string, ctx: unknown) => Promise<void> }>();
	const notes: { text: string; kind: string }[] = [];
	const pi = {
		registerFlag() {},
		getFlag: () => undefined,
		registerCommand: (name: string, c: { handler: (args: string, ctx: unknown) => Promise<void> }) => commands.set(name, c),
		// The default socket (no `socket` setting) and a daemon binary that is not there: a spawn
		// attempt would say "Could not start".
		getSettings: () => ({ "pi-ide-broker": { command: NO_BINARY } }),
		on(name: string, h: (event: unknown, ctx: unknown) => unknown) {
			handlers.set(name, [...(handlers.get(name) ?? []), h]);
		},
	};
	createPiIdeBroker({ diagnosticsMs: 100, firstAttachMs: 100 })(pi as never);
	const ctx = {
		cwd: "/p",
		mode: "rpc",
		sessionManager: { getSessionId: () => "chat-1", getHeader: () => null },
		ui: { notify: (text: string, kind: string) => notes.push({ text, kind }), setWidget() {} },
	};
	const fire = async (name: string, event: unknown) => {
		for (const h of handlers.get(name) ?? []) await h(event, ctx);
	};
	try {
		await fire("session_start", { type: "session_start", reason: "startup" });
		await sleep(1200);
		assert.equal(s.connections, 0, "the squatter was dialled");
		assert.equal(notes.length, 1, JSON.stringify(notes));
		assert.equal(notes[0].kind, "error");
		assert.match(notes[0].text, new RegExp(`the broker socket dir ${dir} belongs to uid 65534`));
		await commands.get("ide")?.handler("", ctx);
		assert.equal(notes.length, 2, JSON.stringify(notes));
		assert.equal(notes[1].text, notes[0].text, "/ide says why it is not connected");
		assert.equal(s.connections, 0);
	} finally {
		await fire("session_shutdown", { type: "session_shutdown" });
		await s.close();
	}
});
