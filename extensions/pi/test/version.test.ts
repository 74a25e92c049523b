import assert from "node:assert/strict";
import { test } from "node:test";
import { sessionPath } from "../src/broker.ts";
import { CLIENT_NAME, CLIENT_VERSION, olderDaemonNotice, PROTOCOL } from "../src/version.ts";

test("the session path names the extension, its version and its protocol revision", () => {
	const q = new URLSearchParams(sessionPath({ cwd: "/p", session: "k" }).split("?")[1]);
	assert.equal(q.get("client"), CLIENT_NAME);
	assert.equal(q.get("client_version"), CLIENT_VERSION);
	assert.equal(q.get("protocol"), String(PROTOCOL));
});

test("only a daemon that says nothing of its version is called older", () => {
	assert.equal(olderDaemonNotice({ editor: "e", broker: { version: "0.1.0", protocol: PROTOCOL } }), undefined);
	const n = olderDaemonNotice({ editor: "e" });
	// This checkout is a source install: the update it names is cargo's (an npm copy names
	// `pi update`, install.test.ts).
	assert.ok(n?.includes("older than this extension") && n.includes("cargo install --locked --path"), n);
	assert.ok(olderDaemonNotice(undefined));
});
