import assert from "node:assert/strict";
import { test } from "node:test";

import { brokerCommand, installWay, spawnFailure, updateHint } from "../src/install.js";

test("an npm install is told apart from a clone by where the package sits", () => {
	assert.equal(installWay("/home/u/.pi/agent/npm/node_modules/pi-ide-broker/extensions/pi/src/install.js"), "npm");
	assert.equal(installWay("file:///home/u/.npm/_npx/ab/node_modules/pi-ide-broker/extensions/pi/bin/x.js"), "npm");
	assert.equal(installWay("/home/u/src/pi-ide-broker/extensions/pi/src/install.js"), "source");
	assert.equal(installWay("/home/u/.local/share/pi-ide-broker/pi-extension/src/install.js"), "source");
	// This checkout is a source install.
	assert.equal(installWay(), "source");
});

test("commands and hints name only what works for the install", () => {
	assert.equal(brokerCommand("status", "npm"), "npx pi-ide-broker status");
	assert.equal(brokerCommand("status", "source"), "pi-ide-broker status");
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
});
