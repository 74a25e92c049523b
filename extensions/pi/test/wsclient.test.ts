// The extension's own WebSocket client (src/wsclient.ts) against `ws`'s server (a dev-only
// dependency: the extension itself has none) on a real Unix socket, and against raw servers
// that misbehave the ways a dead or foreign listener does.

import assert from "node:assert/strict";
import { once } from "node:events";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer as createHttpServer, type Server } from "node:http";
import { createServer as createNetServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { WebSocketServer, type WebSocket } from "ws";
import { UnixWebSocket } from "../src/wsclient.ts";

/** Bounded wait for `event` on `emitter` (every await in these tests has a limit). */
async function within<T>(what: string, p: Promise<T>, ms = 5000): Promise<T> {
	let timer: ReturnType<typeof setTimeout> | undefined;
	const limit = new Promise<never>((_, reject) => {
		timer = setTimeout(() => reject(new Error(`timed out waiting for ${what}`)), ms);
	});
	try {
		return await Promise.race([p, limit]);
	} finally {
		clearTimeout(timer);
	}
}

type Served = { socket: string; dir: string; server: Server; wss: WebSocketServer; peer: Promise<[WebSocket, any]> };

async function serve(): Promise<Served> {
	const dir = mkdtempSync(join(tmpdir(), "wsclient-"));
	const socket = join(dir, "sock");
	const server = createHttpServer();
	const wss = new WebSocketServer({ server });
	const peer = once(wss, "connection") as Promise<[WebSocket, any]>;
	server.listen(socket);
	await once(server, "listening");
	return { socket, dir, server, wss, peer };
}

async function shut(s: Served): Promise<void> {
	for (const c of s.wss.clients) c.terminate();
	s.wss.close();
	s.server.close();
	rmSync(s.dir, { recursive: true, force: true });
}

function dial(socket: string, path = "/v1/session?cwd=%2Fp", handshakeTimeout = 5000): UnixWebSocket {
	return new UnixWebSocket(socket, path, { handshakeTimeout });
}

test("messages of every length cross both ways whole, on the path asked for", async () => {
	const s = await serve();
	const ws = dial(s.socket);
	await within("open", once(ws, "open"));
	const [peer, req] = await within("the server's side", s.peer);
	assert.equal(req.url, "/v1/session?cwd=%2Fp");
	peer.on("message", (d: Buffer) => peer.send(String(d)));
	// Each length crosses a frame-length boundary (7-bit, 16-bit, 64-bit) or is large.
	for (const n of [0, 1, 125, 126, 65535, 65536, 3 * 1024 * 1024 + 7]) {
		const text = "é".repeat(n >> 1) + "x".repeat(n & 1);
		const echoed = once(ws, "message");
		ws.send(text);
		const [back] = await within(`echo of ${n}`, echoed);
		assert.equal(back.length, text.length, `length ${n}`);
		assert.ok(back === text, `content of ${n}`);
	}
	ws.close(1000);
	await within("close", once(ws, "close"));
	await shut(s);
});

test("a fragmented message is joined; a ping is answered with its payload", async () => {
	const s = await serve();
	const ws = dial(s.socket);
	await within("open", once(ws, "open"));
	const [peer] = await within("the server's side", s.peer);
	const got = once(ws, "message");
	peer.send("hello ", { fin: false });
	peer.send("broken ", { fin: false });
	peer.send("world", { fin: true });
	assert.equal((await within("joined message", got))[0], "hello broken world");
	const pong = once(peer, "pong");
	peer.ping(Buffer.from("are you there"));
	assert.equal(String((await within("pong", pong))[0]), "are you there");
	ws.close(1000);
	await within("close", once(ws, "close"));
	await shut(s);
});

test("the server's close is answered with its code and ends the link once", async () => {
	const s = await serve();
	const ws = dial(s.socket);
	let closes = 0;
	ws.on("close", () => closes++);
	await within("open", once(ws, "open"));
	const [peer] = await within("the server's side", s.peer);
	const peerClosed = once(peer, "close");
	const clientClosed = once(ws, "close");
	peer.close(4001, "going");
	const [code] = await within("close answered", peerClosed);
	assert.equal(code, 4001);
	await within("client close", clientClosed);
	assert.equal(closes, 1);
	await shut(s);
});

test("a missing socket is an error with ENOENT, then close, and no open", async () => {
	const dir = mkdtempSync(join(tmpdir(), "wsclient-"));
	const ws = dial(join(dir, "nothing-here"));
	let opened = false;
	ws.on("open", () => (opened = true));
	const [err] = await within("error", once(ws, "error"));
	assert.equal((err as NodeJS.ErrnoException).code, "ENOENT");
	await within("close", once(ws, "close"));
	assert.equal(opened, false);
	rmSync(dir, { recursive: true, force: true });
});

test("a listener that never answers the upgrade times out; a wrong accept key is refused", async () => {
	const dir = mkdtempSync(join(tmpdir(), "wsclient-"));
	const silent = createNetServer(() => {});
	const socket = join(dir, "silent");
	silent.listen(socket);
	await once(silent, "listening");
	const ws = dial(socket, "/", 200);
	const [err] = await within("handshake timeout", once(ws, "error"));
	assert.match((err as Error).message, /handshake timed out/);
	await within("close", once(ws, "close"));
	silent.close();

	const liar = createNetServer((c) => {
		c.once("data", () =>
			c.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: bm90IHRoZSBrZXk=\r\n\r\n"),
		);
	});
	const socket2 = join(dir, "liar");
	liar.listen(socket2);
	await once(liar, "listening");
	const ws2 = dial(socket2);
	let opened = false;
	ws2.on("open", () => (opened = true));
	const [err2] = await within("wrong accept", once(ws2, "error"));
	assert.match((err2 as Error).message, /Sec-WebSocket-Accept/);
	await within("close", once(ws2, "close"));
	assert.equal(opened, false);
	liar.close();
	rmSync(dir, { recursive: true, force: true });
});

test("a message over the limit closes the link with 1009 instead of buffering it", async () => {
	const s = await serve();
	const ws = new UnixWebSocket(s.socket, "/", { handshakeTimeout: 5000, maxMessage: 1024 });
	await within("open", once(ws, "open"));
	const [peer] = await within("the server's side", s.peer);
	const peerClosed = once(peer, "close");
	const err = once(ws, "error");
	peer.send("x".repeat(4096));
	assert.match(((await within("error", err))[0] as Error).message, /exceeds 1024 bytes/);
	const [code] = await within("peer sees the close", peerClosed);
	assert.ok(code === 1009 || code === 1006, `close code ${code}`);
	await shut(s);
});
