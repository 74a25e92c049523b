// A WebSocket client over a Unix socket (RFC 6455), with just what the broker link needs: the
// upgrade, masked text frames out, text (fragmented or not), ping and close in.
//
// Why not a package: node's own WebSocket cannot dial a Unix socket, and a dependency (`ws`)
// needs an install step, which a local path (`pi install <dir>`, a clone, the copy `setup`
// writes out of the binary) never gets (issue 41). The broker's side is RFC 6455 too
// (crates/wire/src/wsupgrade.rs, crates/wire/src/wsframe.rs); test/wsclient.test.ts holds this one to it.

import { createHash, randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import * as net from "node:net";

const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/** The largest message accepted from the broker (its own default frame limit). */
export const MAX_MESSAGE = 64 * 1024 * 1024;

export interface UnixWebSocketOptions {
	/** The upgrade must be answered within this many ms. */
	handshakeTimeout: number;
	/** Messages larger than this close the link (1009). */
	maxMessage?: number;
}

/**
 * One client connection. Events: `open`; `message` (the text); `error` (an `Error`, with
 * `code` as node's socket errors have it: `ENOENT`, `ECONNREFUSED`, ...); `close`, once, last.
 */
export class UnixWebSocket extends EventEmitter {
	private sock: net.Socket;
	private key = randomBytes(16).toString("base64");
	private opened = false;
	private closeSent = false;
	private ended = false;
	private head: Buffer | null = Buffer.alloc(0);
	private chunks: Buffer[] = [];
	private buffered = 0;
	private parts: Buffer[] = [];
	private partsLen = 0;
	private timer: ReturnType<typeof setTimeout> | null;
	private maxMessage: number;

	constructor(socketPath: string, path: string, opts: UnixWebSocketOptions) {
		super();
		this.maxMessage = opts.maxMessage ?? MAX_MESSAGE;
		this.sock = net.createConnection({ path: socketPath });
		this.timer = setTimeout(() => this.fail(new Error("WebSocket handshake timed out")), opts.handshakeTimeout);
		this.sock.on("connect", () => {
			this.sock.write(
				`GET ${path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
					`Sec-WebSocket-Key: ${this.key}\r\nSec-WebSocket-Version: 13\r\n\r\n`,
			);
		});
		this.sock.on("data", (d: Buffer) => this.onData(d));
		this.sock.on("error", (err) => this.fail(err));
		this.sock.on("close", () => this.finish());
	}

	/** Sends one text message (one frame). Ignored once closing. */
	send(text: string): void {
		if (!this.opened || this.closeSent || this.ended) return;
		this.frame(0x1, Buffer.from(text, "utf8"));
	}

	/** Starts the closing handshake with `code`; the socket ends once the broker answers (or 1 s). */
	close(code = 1000): void {
		if (this.ended) return;
		if (!this.opened) return this.terminate();
		if (!this.closeSent) {
			const body = Buffer.alloc(2);
			body.writeUInt16BE(code);
			this.frame(0x8, body);
			this.closeSent = true;
		}
		setTimeout(() => this.terminate(), 1000).unref();
	}

	/** Drops the connection at once. */
	terminate(): void {
		this.sock.destroy();
	}

	private fail(err: Error): void {
		if (this.ended) return;
		this.emit("error", err);
		this.sock.destroy();
	}

	private finish(): void {
		if (this.ended) return;
		this.ended = true;
		if (this.timer) clearTimeout(this.timer);
		this.timer = null;
		this.emit("close");
	}

	private onData(d: Buffer): void {
		if (this.head) {
			const head = Buffer.concat([this.head, d]);
			const end = head.indexOf("\r\n\r\n");
			if (end < 0) {
				if (head.length > 16 * 1024) this.fail(new Error("WebSocket upgrade answer too long"));
				else this.head = head;
				return;
			}
			this.head = null;
			const problem = this.checkUpgrade(head.subarray(0, end).toString("latin1"));
			if (problem) return this.fail(new Error(problem));
			if (this.timer) clearTimeout(this.timer);
			this.timer = null;
			this.opened = true;
			this.emit("open");
			d = head.subarray(end + 4);
			if (d.length === 0) return;
		}
		this.chunks.push(d);
		this.buffered += d.length;
		this.parseFrames();
	}

	private checkUpgrade(head: string): string | null {
		const [status, ...lines] = head.split("\r\n");
		if (!/^HTTP\/1\.1 101\b/.test(status)) return `WebSocket upgrade refused: ${status}`;
		const accept = lines
			.map((l) => l.split(/:\s*/, 2))
			.find(([k]) => k.toLowerCase() === "sec-websocket-accept")?.[1]
			?.trim();
		const want = createHash("sha1").update(this.key + GUID).digest("base64");
		return accept === want ? null : "WebSocket upgrade answered with a wrong Sec-WebSocket-Accept";
	}

	/** The first `n` buffered bytes, joined (only when they span chunks). */
	private peek(n: number): Buffer {
		if (this.chunks[0].length < n) this.chunks = [Buffer.concat(this.chunks)];
		return this.chunks[0];
	}

	private take(n: number): Buffer {
		if (n === 0) return Buffer.alloc(0);
		const buf = this.peek(n);
		const out = buf.subarray(0, n);
		if (buf.length === n) this.chunks.shift();
		else this.chunks[0] = buf.subarray(n);
		this.buffered -= n;
		return out;
	}

	private parseFrames(): void {
		while (!this.ended && this.buffered >= 2) {
			const h = this.peek(Math.min(this.buffered, 14));
			const fin = (h[0] & 0x80) !== 0;
			const opcode = h[0] & 0x0f;
			const masked = (h[1] & 0x80) !== 0;
			let len = h[1] & 0x7f;
			let at = 2;
			if (len === 126) {
				if (this.buffered < 4) return;
				len = h.readUInt16BE(2);
				at = 4;
			} else if (len === 127) {
				if (this.buffered < 10) return;
				const big = h.readBigUInt64BE(2);
				if (big > BigInt(this.maxMessage)) return this.tooBig();
				len = Number(big);
				at = 10;
			}
			if (masked) at += 4;
			if (this.buffered < at + len) {
				if (this.partsLen + len > this.maxMessage) this.tooBig();
				return;
			}
			const header = this.take(at);
			const payload = this.take(len);
			if (masked) unmask(payload, header.subarray(at - 4, at));
			this.onFrame(fin, opcode, payload);
		}
	}

	private onFrame(fin: boolean, opcode: number, payload: Buffer): void {
		switch (opcode) {
			case 0x0:
			case 0x1:
			case 0x2:
				if (this.partsLen + payload.length > this.maxMessage) return this.tooBig();
				this.parts.push(payload);
				this.partsLen += payload.length;
				if (fin) {
					const msg = Buffer.concat(this.parts, this.partsLen).toString("utf8");
					this.parts = [];
					this.partsLen = 0;
					this.emit("message", msg);
				}
				return;
			case 0x8:
				// The broker closes: answer with its code (once) and end.
				if (!this.closeSent) {
					this.frame(0x8, payload.subarray(0, 2));
					this.closeSent = true;
				}
				this.sock.end();
				return;
			case 0x9:
				if (!this.closeSent) this.frame(0xa, payload);
				return;
			default:
				return; // pong, or a reserved opcode: nothing to do
		}
	}

	private tooBig(): void {
		if (!this.closeSent) {
			const body = Buffer.alloc(2);
			body.writeUInt16BE(1009);
			this.frame(0x8, body);
			this.closeSent = true;
		}
		this.fail(new Error(`a message from pi-ide-broker exceeds ${this.maxMessage} bytes`));
	}

	/** Writes one masked frame (a client's frames are always masked). */
	private frame(opcode: number, payload: Buffer): void {
		const len = payload.length;
		const ext = len < 126 ? 0 : len < 65536 ? 2 : 8;
		const header = Buffer.alloc(2 + ext + 4);
		header[0] = 0x80 | opcode;
		header[1] = 0x80 | (ext === 0 ? len : ext === 2 ? 126 : 127);
		if (ext === 2) header.writeUInt16BE(len, 2);
		else if (ext === 8) header.writeBigUInt64BE(BigInt(len), 2);
		const mask = randomBytes(4);
		mask.copy(header, 2 + ext);
		// A copy of its own, 4-byte aligned (allocUnsafeSlow is never pooled): masked a word at a time.
		const body = Buffer.allocUnsafeSlow(len);
		payload.copy(body);
		unmask(body, mask);
		this.sock.write(Buffer.concat([header, body]));
	}
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/** XORs `data` in place with the 4-byte `mask` (masking and unmasking are the same). */
function unmask(data: Buffer, mask: Buffer): void {
	const n = data.length;
	const words = n >>> 2;
	if (LITTLE_ENDIAN && words > 0 && data.byteOffset % 4 === 0) {
		const m = mask.readUInt32LE(0);
		const view = new Uint32Array(data.buffer, data.byteOffset, words);
		for (let i = 0; i < words; i++) view[i] ^= m;
		for (let i = words * 4; i < n; i++) data[i] ^= mask[i & 3];
		return;
	}
	for (let i = 0; i < n; i++) data[i] ^= mask[i & 3];
}
