import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { Broker, Follow, Mcp } from "../src/methods.ts";

test("every method name the extension and the broker share is spelled the same on both sides", () => {
	const rust = readFileSync(new URL("../../../crates/protocol/src/jsonrpc.rs", import.meta.url), "utf8");
	const spelled = new Set([...rust.matchAll(/pub const [A-Z_]+: &str = "([^"]+)";/g)].map((m) => m[1]));
	const shared = [...Object.values(Broker), ...Object.values(Follow), Mcp.CANCELLED];
	for (const name of shared) assert.ok(spelled.has(name), `${name} is not a constant of the broker's jsonrpc.rs`);
});
