// The first model call of a session, made before the broker has attached it (as pi-web does:
// a new chat starts with a message): the `context` hook waits for the first attach, bounded,
// and never when nothing is coming. A fake broker on a real Unix socket speaks the native
// door's frames; the extension is the real one, wired to a stand-in for pi's API.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { WebSocketServer, type WebSocket } from "ws";
import { createPiIdeBroker, DEFAULT_LIMITS, type Limits } from "../index.ts";

delete process.env.PI_IDE_BROKER_SOCKET;
delete process.env.PI_IDE_BROKER_BIN;

/** How the fake broker behaves towards the session. */
type Script = {
	/** Attach this long after `initialize` (never when undefined). */
	attachAfterMs?: number;
	/** Answer `broker/editors` (after the attach, as the broker does). */
	answerEditors: boolean;
	/** Answer `getDiagnostics` (a frozen editor does not). */
	diagnostics: boolean;
	/** Drop the connection when an `openDiff` arrives (the broker dies mid-review). */
	dropOnDiff?: boolean;
};

type Broker = {
	socket: string;
	connections: number;
	close: () => Promise<void>;
	/** Sends an editor-initiated request (as the broker hands one on) and awaits the answer. */
	request: (method: string, params: unknown) => Promise<any>;
};

const DIAG = { "file:///p/x.rs": [{ severity: "Error", message: "boom", range: { start: { line: 0, character: 0 } } }] };

function send(ws: WebSocket, msg: unknown) {
	ws.send(JSON.stringify({ jsonrpc: "2.0", ...(msg as object) }));
}

async function fakeBroker(dir: string, script: Script): Promise<Broker> {
	const socket = join(dir, "sock");
	const server: Server = createServer();
	const wss = new WebSocketServer({ server });
	const waiting = new Map<string, (m: any) => void>();
	let last: WebSocket | null = null;
	let asked = 0;
	const broker: Broker = {
		socket,
		connections: 0,
		close: async () => {},
		request: (method, params) =>
			new Promise((done) => {
				const id = `ed-${++asked}`;
				waiting.set(id, done);
				if (last) send(last, { id, method, params });
			}),
	};
	wss.on("connection", (ws) => {
		broker.connections++;
		last = ws;
		let attached = false;
		let editorsAsked: number | null = null;
		const answerEditors = (id: number) =>
			send(ws, { id, result: { attached: attached ? "nvim-1" : null, editors: attached ? [{ id: "nvim-1" }] : [] } });
		ws.on("message", (data) => {
			const m = JSON.parse(String(data));
			if (m.method === undefined && typeof m.id === "string" && waiting.has(m.id)) {
				waiting.get(m.id)?.(m);
				waiting.delete(m.id);
			} else if (m.method === "initialize") {
				send(ws, { id: m.id, result: { protocolVersion: "2024-11-05", capabilities: {} } });
				if (script.attachAfterMs === undefined) return;
				setTimeout(() => {
					attached = true;
					send(ws, { method: "broker/attached", params: { editor: "nvim-1", ide_name: "Neovim", workspace_folders: ["/p"] } });
					send(ws, {
						method: "selection_changed",
						params: { filePath: "/p/src/main.rs", text: "", selection: { start: { line: 6 }, end: { line: 6 }, isEmpty: true } },
					});
					if (editorsAsked !== null && script.answerEditors) answerEditors(editorsAsked);
				}, script.attachAfterMs);
			} else if (m.method === "broker/editors") {
				if (!script.answerEditors) return;
				if (attached || script.attachAfterMs === undefined) answerEditors(m.id);
				else editorsAsked = m.id;
			} else if (m.method === "tools/call" && m.params?.name === "openDiff" && script.dropOnDiff) {
				ws.terminate();
			} else if (m.method === "tools/call" && m.params?.name === "getDiagnostics" && script.diagnostics) {
				send(ws, { id: m.id, result: { content: [{ type: "text", text: JSON.stringify(DIAG) }] } });
			}
		});
	});
	await new Promise<void>((done) => server.listen(socket, done));
	broker.close = () =>
		new Promise<void>((done) => {
			for (const c of wss.clients) c.terminate();
			wss.close();
			server.close(() => done());
		});
	return broker;
}

type Handler = (event: any, ctx: any) => unknown;

/** One session of the extension under a stand-in for pi's extension API. */
function startSession(limits: Limits, settings: Record<string, unknown>, flags: Record<string, string> = {}) {
	const handlers = new Map<string, Handler[]>();
	/** The models asked to stream, as `provider/id`. */
	const streamed: string[] = [];
	const model = (provider: string, id: string) => ({ provider, id, name: id });
	const pi = {
		registerFlag() {},
		getFlag: (name: string) => flags[name],
		registerCommand() {},
		getSettings: () => ({ "pi-ide-broker": { command: "/nonexistent/pi-ide-broker", spawn: false, ...settings } }),
		on(name: string, h: Handler) {
			handlers.set(name, [...(handlers.get(name) ?? []), h]);
		},
	};
	createPiIdeBroker(limits)(pi as any);
	const ctx = {
		cwd: "/p",
		mode: "rpc",
		sessionManager: { getSessionId: () => "chat-1", getHeader: () => null },
		ui: { notify() {}, setWidget() {} },
		model: model("fake", "session-model"),
		modelRegistry: {
			find: (provider: string, id: string) => model(provider, id),
			getAvailable: () => [model("fake", "session-model"), model("fake", "suggester")],
			streamSimple: (m: { provider: string; id: string }) => {
				streamed.push(`${m.provider}/${m.id}`);
				return { result: async () => ({ stopReason: "stop", content: [{ type: "text", text: "<SUGGESTION>done()</SUGGESTION>" }] }) };
			},
		},
	};
	const fire = async (name: string, event: unknown) => {
		let out: unknown;
		for (const h of handlers.get(name) ?? []) out = await h(event, ctx);
		return out;
	};
	return {
		streamed,
		start: () => fire("session_start", { type: "session_start", reason: "startup" }),
		/** The `context` hook on a user prompt: the text it adds, or null. */
		async context(): Promise<string | null> {
			const out = (await fire("context", { type: "context", messages: [{ role: "user", content: "hi", timestamp: 0 }] })) as
				| { messages: { role: string; content: unknown }[] }
				| undefined;
			const added = out?.messages.find((m) => m.role === "custom");
			return added ? String(added.content) : null;
		},
		/** pi's `tool_call` hook for a `write`: what the extension answers (a block, or nothing). */
		write: (path: string, content: string) =>
			fire("tool_call", { type: "tool_call", toolName: "write", toolCallId: "call-1", input: { path, content } }) as Promise<
				{ block?: boolean; reason?: string } | undefined
			>,
		stop: () => fire("session_shutdown", { type: "session_shutdown" }),
	};
}

async function withDir(f: (dir: string) => Promise<void>) {
	const dir = mkdtempSync(join(tmpdir(), "pi-first-prompt-"));
	try {
		await f(dir);
	} finally {
		rmSync(dir, { recursive: true, force: true });
	}
}

const LONG = 60_000;

test("the first prompt waits for the first attach and carries the editor block", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		const broker = await fakeBroker(dir, { attachAfterMs: 150, answerEditors: true, diagnostics: true });
		const s = startSession({ diagnosticsMs: LONG, firstAttachMs: LONG }, { socket: broker.socket });
		await s.start();
		const first = await s.context();
		assert.ok(first?.includes("<editor>\n  <file>/p/src/main.rs</file>\n  <cursor>line 7</cursor>"), String(first));
		assert.ok(first?.includes("file:///p/x.rs:1:1 [Error] boom"), String(first));
		const second = await s.context();
		assert.ok(second?.includes("<file>/p/src/main.rs</file>"), String(second));
		await s.stop();
		await broker.close();
	}),
);

test("without the wait the same first prompt goes out blind (the bug this guards)", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		const broker = await fakeBroker(dir, { attachAfterMs: 150, answerEditors: true, diagnostics: true });
		const s = startSession({ diagnosticsMs: LONG, firstAttachMs: 0 }, { socket: broker.socket });
		await s.start();
		assert.equal(await s.context(), null);
		await s.stop();
		await broker.close();
	}),
);

test("the wait is bounded when the broker never attaches nor answers", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		const broker = await fakeBroker(dir, { answerEditors: false, diagnostics: true });
		const s = startSession({ diagnosticsMs: LONG, firstAttachMs: 200 }, { socket: broker.socket });
		await s.start();
		const t0 = Date.now();
		assert.equal(await s.context(), null);
		assert.ok(Date.now() - t0 >= 190, "it waited for the attach");
		await s.stop();
		await broker.close();
	}),
);

test("no wait when no broker answers, autoconnect is off, or the broker has no editor", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		// Each would hang the test (60 s bound) if it waited.
		const limits = { diagnosticsMs: LONG, firstAttachMs: LONG };
		const nobody = startSession(limits, { socket: join(dir, "nobody") });
		await nobody.start();
		assert.equal(await nobody.context(), null);
		await nobody.stop();

		const broker = await fakeBroker(dir, { answerEditors: true, diagnostics: true });
		const off = startSession(limits, { socket: broker.socket, autoconnect: false });
		await off.start();
		assert.equal(await off.context(), null);
		await off.stop();
		assert.equal(broker.connections, 0, "autoconnect off dials nothing");

		const noEditor = startSession(limits, { socket: broker.socket });
		await noEditor.start();
		assert.equal(await noEditor.context(), null);
		assert.equal(broker.connections, 1);
		await noEditor.stop();
		await broker.close();
	}),
);

test("a frozen editor delays the first call by the diagnostics bound, the attach wait included", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		const broker = await fakeBroker(dir, { attachAfterMs: 2000, answerEditors: true, diagnostics: false });
		const s = startSession({ diagnosticsMs: 3000, firstAttachMs: LONG }, { socket: broker.socket });
		await s.start();
		const t0 = Date.now();
		const first = await s.context();
		const took = Date.now() - t0;
		assert.ok(first?.includes("<editor>") && !first.includes("lsp_diagnostics"), String(first));
		// 2 s waiting for the attach plus a full 3 s for diagnostics would be 5 s.
		assert.ok(took >= 2900 && took < 4500, `took ${took} ms`);
		await s.stop();
		await broker.close();
	}),
);

test("a write whose review is cut by a lost broker link is blocked, never applied unreviewed", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		const broker = await fakeBroker(dir, { attachAfterMs: 0, answerEditors: true, diagnostics: true, dropOnDiff: true });
		const s = startSession({ diagnosticsMs: LONG, firstAttachMs: LONG }, { socket: broker.socket });
		try {
			await s.start();
			assert.ok((await s.context())?.includes("<editor>"), "attached");
			const verdict = await s.write(join(dir, "f.txt"), "new\n");
			assert.equal(verdict?.block, true, JSON.stringify(verdict));
			assert.match(String(verdict?.reason), /NOT changed/);
		} finally {
			// Closed on a failure too: an open socket would keep the test process from ending.
			await s.stop();
			await broker.close();
		}
	}),
);

test("--pi-ide-suggestion-model picks the model for the editor's suggestions and is listed as the override", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		const broker = await fakeBroker(dir, { attachAfterMs: 0, answerEditors: true, diagnostics: true });
		const flags = { "pi-ide-suggestion-model": "fake/suggester" };
		const s = startSession({ diagnosticsMs: LONG, firstAttachMs: LONG }, { socket: broker.socket }, flags);
		try {
			await s.start();
			assert.ok((await s.context())?.includes("<editor>"), "attached");
			const models = await broker.request("listSuggestionModels", {});
			assert.equal(models.result?.cliOverride, "fake/suggester", JSON.stringify(models));
			assert.equal(models.result?.currentModel, "fake/session-model");
			const params = { cursorBefore: "x = ", cursorAfter: "", model: "fake/session-model" };
			const got = await broker.request("getSuggestions", params);
			assert.deepEqual(got.result?.suggestions, ["done()"], JSON.stringify(got));
			assert.deepEqual(s.streamed, ["fake/suggester"], "the flag wins over the editor's model");
		} finally {
			await s.stop();
			await broker.close();
		}
	}),
);

test("with pi's own limits, an attach slowed by a loaded machine (600 ms) still reaches the first prompt", { timeout: 20_000 }, () =>
	withDir(async (dir) => {
		const broker = await fakeBroker(dir, { attachAfterMs: 600, answerEditors: true, diagnostics: true });
		const s = startSession(DEFAULT_LIMITS, { socket: broker.socket });
		try {
			await s.start();
			const first = await s.context();
			assert.ok(first?.includes("<editor>"), String(first));
		} finally {
			await s.stop();
			await broker.close();
		}
	}),
);

