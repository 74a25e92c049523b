import assert from "node:assert/strict";
import { test } from "node:test";

import { chmodSync, mkdirSync, mkdtempSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { repairExecBit } from "../src/binary.js";
import { brokerCommand, installWay, missingBinary, npmBin, onPath, shellPath, spawnFailure, updateHint } from "../src/install.js";

test("an npm install is told apart from a clone by where the package sits", () => {
	assert.equal(installWay("/home/u/.pi/agent/npm/node_modules/pi-ide-broker/extensions/pi/src/install.js"), "npm");
	assert.equal(installWay("file:///home/u/.npm/_npx/ab/node_modules/pi-ide-broker/extensions/pi/bin/x.js"), "npm");
	assert.equal(installWay("/home/u/src/pi-ide-broker/extensions/pi/src/install.js"), "source");
	assert.equal(installWay("/home/u/.local/share/pi-ide-broker/pi-extension/src/install.js"), "source");
	// This checkout is a source install.
	assert.equal(installWay(), "source");
});

test("commands and hints name only what works for the install", () => {
	// An npm install without the command on PATH: pi's own launcher, never npx (which, outside
	// pi's folder, asks to fetch the registry's newest version).
	const from = "/home/u/.pi/agent/npm/node_modules/pi-ide-broker/extensions/pi/src/install.js";
	assert.equal(
		brokerCommand("status", "npm", { onPath: false, from, home: "/home/u" }),
		"~/.pi/agent/npm/node_modules/.bin/pi-ide-broker status",
	);
	assert.equal(brokerCommand("status", "npm", { onPath: true, from, home: "/home/u" }), "pi-ide-broker status");
	assert.equal(brokerCommand("status", "source", { onPath: false }), "pi-ide-broker status");
	assert.equal(npmBin("/home/u/src/pi-ide-broker/extensions/pi/src/install.js"), null);
	assert.equal(shellPath("/home/my docs/x", "/home/u"), "'/home/my docs/x'");
	assert.equal(shellPath("/home/u/it's", "/home/u"), "'/home/u/it'\\''s'");
	assert.match(updateHint("npm"), /pi update npm:pi-ide-broker/);
	assert.doesNotMatch(updateHint("npm"), /cargo/);
	assert.match(updateHint("source"), /cargo install/);
});

test("a failed spawn says what is missing and what to do, per platform and install", () => {
	const missing = spawnFailure("pi-ide-broker", "ENOENT", { platform: "linux", arch: "x64", way: "npm", installed: false });
	assert.match(missing, /pi-ide-broker-linux-x64/);
	assert.match(missing, /pi install npm:pi-ide-broker/);
	const mac = spawnFailure("pi-ide-broker", "ENOENT", { platform: "freebsd", arch: "x64", way: "npm", installed: false });
	assert.match(mac, /no prebuilt daemon for freebsd-x64/);
	assert.match(mac, /PI_IDE_BROKER_BIN/);
	const clone = spawnFailure("pi-ide-broker", "ENOENT", { way: "source" });
	assert.match(clone, /not on PATH/);
	assert.doesNotMatch(clone, /pi install/);
	const perm = spawnFailure("/x/pi-ide-broker", "EACCES", { way: "npm", installed: true });
	assert.match(perm, /EACCES/);
	assert.match(perm, /chmod \+x \/x\/pi-ide-broker/);
});

test("the launcher and the extension name the same repair for a missing platform package, never cargo", () => {
	const missing = missingBinary("linux-x64");
	assert.match(missing, /pi remove npm:pi-ide-broker && pi install npm:pi-ide-broker/);
	assert.doesNotMatch(missing, /cargo/);
	const spawn = spawnFailure("pi-ide-broker", "ENOENT", { platform: "linux", arch: "x64", way: "npm", installed: false });
	assert.ok(spawn.endsWith(missing), spawn);
});

test("a binary that lost its exec bit gets it back from its read bits", () => {
	const dir = mkdtempSync(join(tmpdir(), "exec-bit-"));
	const bin = join(dir, "pi-ide-broker");
	writeFileSync(bin, "#!/bin/sh\n");
	chmodSync(bin, 0o640);
	assert.equal(repairExecBit(bin), true);
	assert.equal(statSync(bin).mode & 0o777, 0o750);
	assert.equal(repairExecBit(join(dir, "absent")), false);
});

test("a pi-ide-broker on PATH counts, npm's own node_modules/.bin does not", () => {
	const dir = mkdtempSync(join(tmpdir(), "on-path-"));
	const bin = join(dir, "node_modules", ".bin");
	mkdirSync(bin, { recursive: true });
	writeFileSync(join(bin, "pi-ide-broker"), "#!/bin/sh\n", { mode: 0o755 });
	assert.equal(onPath(bin), false);
	writeFileSync(join(dir, "pi-ide-broker"), "#!/bin/sh\n", { mode: 0o755 });
	assert.equal(onPath(`${bin}:${dir}`), true);
});
