import assert from "node:assert/strict";
import { test } from "node:test";
import { backoffDelay, sessionPath } from "../src/broker.ts";
import { defaultSocket, readOptions } from "../src/options.ts";
import { BUFFER_READ_MS, DEFAULT_LIMITS, limitsFrom, previousSessionId } from "../index.ts";

test("settings: defaults, project values, environment overrides", () => {
	assert.deepEqual(readOptions(undefined, {}), { autoconnect: true, spawn: true, command: "pi-ide-broker", socket: undefined });
	const s = { "pi-ide-broker": { autoconnect: false, spawn: true, command: "/opt/b", socket: "/s" } };
	assert.deepEqual(readOptions(s, {}), { autoconnect: false, spawn: true, command: "/opt/b", socket: "/s" });
	const o = readOptions(s, { PI_IDE_BROKER_NO_SPAWN: "1", PI_IDE_BROKER_BIN: "/x/b", PI_IDE_BROKER_SOCKET: "/t" });
	assert.deepEqual(o, { autoconnect: false, spawn: false, command: "/x/b", socket: "/t" });
	assert.equal(readOptions({ "pi-ide-broker": { autoconnect: "no" } }, {}).autoconnect, true);
});

test("the socket is found where the daemon puts it", () => {
	assert.equal(defaultSocket({ PI_IDE_BROKER_SOCKET: "/a/sock" }, 1), "/a/sock");
	assert.equal(defaultSocket({ XDG_RUNTIME_DIR: "/run/user/7" }, 7), "/run/user/7/pi-ide-broker/sock");
	assert.match(defaultSocket({}, 7), /pi-ide-broker-7\/sock$/);
	// The daemon's order: its logind runtime dir when ours, else TMPDIR, else /tmp; never
	// node's TMP/TEMP (Rust's temp_dir does not read them), so both sides agree on a Mac.
	const none = () => false;
	assert.equal(defaultSocket({}, 7, (d) => d === "/run/user/7"), "/run/user/7/pi-ide-broker/sock");
	assert.equal(defaultSocket({ TMPDIR: "/var/folders/x/T/" }, 7, none), "/var/folders/x/T/pi-ide-broker-7/sock");
	assert.equal(defaultSocket({ TMP: "/elsewhere", TEMP: "/else" }, 7, none), "/tmp/pi-ide-broker-7/sock");
});

test("session path carries cwd, key, dialect and the inherited key", () => {
	const p = sessionPath({ cwd: "/home/u/my proj", session: "019a-b", inherit: "0199-a" });
	const q = new URLSearchParams(p.split("?")[1]);
	assert.equal(p.split("?")[0], "/v1/session");
	assert.equal(q.get("cwd"), "/home/u/my proj");
	assert.equal(q.get("session"), "019a-b");
	assert.equal(q.get("dialect"), "pi");
	assert.equal(q.get("inherit"), "0199-a");
	assert.equal(new URLSearchParams(sessionPath({ cwd: "/", session: "k" }).split("?")[1]).get("inherit"), null);
});

test("reconnect delays start under 200 ms and are capped", () => {
	for (let i = 0; i < 50; i++) assert.ok(backoffDelay(0) < 200);
	for (let i = 0; i < 50; i++) assert.ok(backoffDelay(20) <= 960);
});

test("the previous session id comes from its file name", () => {
	assert.equal(previousSessionId("/s/--p--/2026-11-30T10-00-00-000Z_019ad0c2-aaaa.jsonl"), "019ad0c2-aaaa");
	assert.equal(previousSessionId(undefined), undefined);
});

test("pi runs the extension with the promised bounds: 1 s per LLM call, the first attach within it", () => {
	assert.equal(DEFAULT_LIMITS.diagnosticsMs, 1000);
	assert.equal(DEFAULT_LIMITS.firstAttachMs, 1000);
	assert.ok(DEFAULT_LIMITS.firstAttachMs <= DEFAULT_LIMITS.diagnosticsMs);
});

test("the binary npm installed for this platform is found beside the package, and comes after settings", async () => {
	const { mkdtempSync, mkdirSync, writeFileSync, rmSync } = await import("node:fs");
	const { tmpdir } = await import("node:os");
	const { join } = await import("node:path");
	const { pathToFileURL } = await import("node:url");
	const { platformBinary, PLATFORMS } = await import("../src/binary.js");
	// As npm lays it out: node_modules/pi-ide-broker (this package) and, beside it, the
	// platform package with vendor/<triple>/bin/pi-ide-broker.
	const root = mkdtempSync(join(tmpdir(), "binary-"));
	const from = pathToFileURL(join(root, "node_modules/pi-ide-broker/extensions/pi/src/binary.js")).href;
	mkdirSync(join(root, "node_modules/pi-ide-broker/extensions/pi/src"), { recursive: true });
	assert.equal(platformBinary(from, "linux", "x64"), null, "no platform package installed");
	const pkg = join(root, "node_modules/pi-ide-broker-linux-arm64");
	const bin = join(pkg, "vendor", PLATFORMS["linux-arm64"], "bin", "pi-ide-broker");
	mkdirSync(join(bin, ".."), { recursive: true });
	writeFileSync(join(pkg, "package.json"), '{"name":"pi-ide-broker-linux-arm64"}');
	assert.equal(platformBinary(from, "linux", "arm64"), null, "a package without its binary");
	writeFileSync(bin, "");
	assert.equal(platformBinary(from, "linux", "arm64"), bin);
	assert.equal(platformBinary(from, "linux", "x64"), null, "another platform's package");
	assert.equal(platformBinary(from, "win32", "arm64"), null, "a platform with no package");
	// Windows: the package's binary is an .exe, and only that is taken.
	const win = join(root, "node_modules/pi-ide-broker-win32-x64");
	const exe = join(win, "vendor", PLATFORMS["win32-x64"], "bin", "pi-ide-broker.exe");
	mkdirSync(join(exe, ".."), { recursive: true });
	writeFileSync(join(win, "package.json"), '{"name":"pi-ide-broker-win32-x64"}');
	writeFileSync(join(exe, "..", "pi-ide-broker"), "");
	assert.equal(platformBinary(from, "win32", "x64"), null, "no .exe: not the Windows binary");
	writeFileSync(exe, "");
	assert.equal(platformBinary(from, "win32", "x64"), exe);
	assert.equal(readOptions(undefined, {}, bin).command, bin);
	assert.equal(readOptions({ "pi-ide-broker": { command: "/opt/b" } }, {}, bin).command, "/opt/b");
	assert.equal(readOptions(undefined, { PI_IDE_BROKER_BIN: "/x/b" }, bin).command, "/x/b");
	rmSync(root, { recursive: true, force: true });
});

test("PI_IDE_BROKER_BUFFER_READ_MS sets how long a read waits for a following editor's buffer", () => {
	assert.equal(limitsFrom({}).bufferReadMs ?? BUFFER_READ_MS, 3000);
	assert.equal(limitsFrom({ PI_IDE_BROKER_BUFFER_READ_MS: "60000" }).bufferReadMs, 60000);
	for (const bad of ["0", "-5", "soon", "1.5", ""]) {
		assert.deepEqual(limitsFrom({ PI_IDE_BROKER_BUFFER_READ_MS: bad }), DEFAULT_LIMITS, bad);
	}
	assert.equal(limitsFrom({ PI_IDE_BROKER_BUFFER_READ_MS: "10" }).diagnosticsMs, DEFAULT_LIMITS.diagnosticsMs);
});
