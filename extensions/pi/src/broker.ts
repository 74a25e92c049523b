// One pi session's connection to the broker: a WebSocket over the broker's Unix socket
// (`GET /v1/session?cwd=&session=&dialect=pi`), JSON-RPC both ways, reconnect with backoff,
// and a detached daemon started when none answers: before the first connection, and again
// once in each outage after one (the daemon crashed or was stopped), so the session is back
// within a second or so. Every dial is preceded by the socket's
// trust check (src/socket_trust.ts): a path someone else may be listening at is never dialled,
// and no daemon is started for it. Nothing here is process-global: a host that runs many pi
// sessions in one process (pi-web) gets one link per session.

import { spawn } from "node:child_process";
import { Broker, Mcp } from "./methods.ts";
import { appendFileSync, closeSync, fstatSync, mkdirSync, openSync, readSync } from "node:fs";
import { dirname } from "node:path";
import { socketTrust } from "./socket_trust.ts";
import { CLIENT_NAME, CLIENT_VERSION, olderDaemonNotice, PROTOCOL } from "./version.ts";
import { UnixWebSocket } from "./wsclient.ts";

/** `PI_IDE_BROKER_DEBUG=<file>`: every frame from the broker is appended to that file (cut
 * at 300 chars); pi's own stdout/stderr belong to its UI. */
const DEBUG_FILE = process.env.PI_IDE_BROKER_DEBUG;

/** A JSON-RPC error from the broker or the editor, kept with its code. */
export class RpcError extends Error {
	code: number;
	constructor(code: number, message: string) {
		super(message);
		this.code = code;
	}
}

/** Raised for calls in flight when the link drops: the answer will never come. */
export class LinkLost extends Error {}

/** A request taken back because its caller's signal aborted (pi stopped the turn). */
export class RequestAborted extends Error {
	constructor(method: string) {
		super(`${method} aborted`);
	}
}

/** Who the session is, for the broker's routing. */
export type Intro = {
	cwd: string;
	/** pi's session id: the sticky key. */
	session: string;
	/** The key of the session this one replaces (`/new`, `/fork`). */
	inherit?: string;
	/** Start attached to this editor id. */
	editor?: string;
};

/** The editor the broker attached this session to. */
export type Attached = { id: string; ideName: string; folders: string[] };

/** What the link tells its owner. */
export type LinkEvents = {
	/** The socket is open (first time or after a reconnect). */
	onOpen?: (reconnected: boolean) => void;
	/** The broker attached the session to an editor. */
	onAttached?: (editor: Attached) => void;
	/** The broker detached it (editor gone for good, detached by us, broker stopping). */
	onDetached?: (reason: string) => void;
	/** The socket dropped (the attachment with it); a reconnect is scheduled unless the link
	 * was closed. */
	onDown?: (why: string) => void;
	/** A dial failed before the socket opened (no broker answers there); redialling goes on. */
	onUnreachable?: (why: string) => void;
	/** The socket failed its trust check (someone else may be listening there): nothing was
	 * sent to it and no daemon is started. `problem` says what is wrong and what to do; told
	 * again only when it changes (redialling goes on, checking each time, so a fixed path
	 * connects). */
	onUntrusted?: (problem: string) => void;
	/** A notification from the editor (selection_changed, at_mentioned, …). */
	onNotification?: (method: string, params: unknown) => void;
	/** Something the user should know once (the broker's `broker/notice`, a daemon too old
	 * to say its version); the owner shows each text once. */
	onNotice?: (message: string) => void;
	/** The daemon we started answers; where it logs. `again`: it was started after the daemon
	 * this link was connected to had gone (crashed, stopped), not before the first connection. */
	onSpawned?: (log: string | undefined, again: boolean) => void;
	/** The daemon could not be started with `command` (its errno name, when there is one). */
	onSpawnFailed?: (command: string, code: string | undefined) => void;
	/** Daemons the link started exited before it opened on them, {@link EXITS_TOLD_AFTER} in a
	 * row (a broken config, an unsafe socket dir): told once an outage, while starts go on.
	 * `how` is "exit code 2" or "signal SIGKILL"; `said` the last line of its log (the daemon's
	 * own error, which says what to do), when it logs. */
	onSpawnExited?: (command: string, how: string, said: string | undefined) => void;
};

/** The last line of `text` that is not blank (colour escapes left out), if any: what a
 * program said last. */
export function lastLineOf(text: string): string | undefined {
	return text
		.replace(/\x1b\[[0-9;]*m/g, "")
		.split("\n")
		.map((l) => l.trim())
		.filter(Boolean)
		.at(-1);
}

/** The last line of the log at `path` (its last 4 KiB read), as {@link lastLineOf} says. */
export function lastLine(path: string | undefined): string | undefined {
	if (!path) return undefined;
	try {
		const fd = openSync(path, "r");
		try {
			const size = fstatSync(fd).size;
			const buf = Buffer.alloc(Math.min(size, 4096));
			readSync(fd, buf, 0, buf.length, size - buf.length);
			return lastLineOf(buf.toString("utf8"));
		} finally {
			closeSync(fd);
		}
	} catch {
		return undefined;
	}
}

/** Answers an editor-initiated request; throw to answer with an error. */
export type RequestHandler = (params: unknown, signal: AbortSignal) => Promise<unknown>;

/** Reconnect delays: first retry fast, then doubling to a cap (a dial of a Unix socket is
 * cheap, and a restarted broker should see its sessions back within a second), ±20 % jitter. */
export function backoffDelay(attempt: number, firstMs = 100, capMs = 800): number {
	const base = Math.min(capMs, firstMs * 2 ** Math.max(0, attempt));
	return Math.round(base * (0.8 + 0.4 * Math.random()));
}

/** The request path for a session. */
export function sessionPath(intro: Intro): string {
	const q = new URLSearchParams({
		cwd: intro.cwd,
		session: intro.session,
		dialect: "pi",
		client: CLIENT_NAME,
		client_version: CLIENT_VERSION,
		protocol: String(PROTOCOL),
	});
	if (intro.inherit) q.set("inherit", intro.inherit);
	if (intro.editor) q.set("editor", intro.editor);
	return `/v1/session?${q.toString()}`;
}

/** How long an outage lasts before the link starts a daemon again: a service manager restarts
 * a daemon it runs after 1 s (the systemd unit's `RestartSec=1`), and that one should win. */
export const RESPAWN_AFTER_MS = 1500;

/** A daemon the link started that exited before the link opened on it (the daemon it follows
 * was still stopping and held the claim, say) is started again this long after it exited,
 * doubling at each such exit in one outage, up to {@link SPAWN_AGAIN_CAP_MS}. */
export const SPAWN_AGAIN_MS = 1000;
/** The longest wait before a daemon is started again after one that exited at its start. */
export const SPAWN_AGAIN_CAP_MS = 16_000;
/** After this many daemons in a row failed at their start, the user is told (one such exit may
 * be a fluke; a broken config fails every time). */
export const EXITS_TOLD_AFTER = 2;
/** The exit status of a daemon that found another holding the socket (running, or still
 * stopping): a start that lost a race, never counted as failed. */
export const EXIT_ALREADY_RUNNING = 4;

type Pending = { resolve: (v: any) => void; reject: (e: Error) => void };

/** The session's link to the broker. */
export class BrokerLink {
	socket: string;
	intro: Intro;
	events: LinkEvents;
	spawnCommand: string | undefined;
	logPath: string | undefined;
	/** The user named the socket (`PI_IDE_BROKER_SOCKET`, the `socket` setting): its dir may be
	 * a shared one like /tmp (an `ssh -R` forward), see `socketTrust`. */
	named: boolean;
	attached: Attached | null = null;
	/** Why the socket is not trusted, while it is not (what `/ide` then says). */
	untrusted: string | null = null;
	private ws: UnixWebSocket | null = null;
	private open = false;
	private closed = false;
	private everOpen = false;
	/** A daemon was started since the link was last open, and has not exited (at most one at a
	 * time; another only once it exited before the link opened on it). */
	private spawned = false;
	/** Which start {@link spawned} is about (an exit of an earlier one is not this one's). */
	private spawnGen = 0;
	/** Daemons started in this outage that exited before the link opened. */
	private earlyExits = 0;
	/** Of those, the ones in a row that failed otherwise than "already running". */
	private failedStarts = 0;
	/** When a daemon may be started again after one exited at its start (0: at once). */
	private spawnAgainAt = 0;
	/** When the open link was last lost (0: never open). */
	private lostAt = 0;
	/** See {@link RESPAWN_AFTER_MS} (tests shorten it). */
	respawnAfterMs = RESPAWN_AFTER_MS;
	/** See {@link SPAWN_AGAIN_MS} (tests shorten it). */
	spawnAgainMs = SPAWN_AGAIN_MS;
	private attempt = 0;
	private timer: ReturnType<typeof setTimeout> | null = null;
	private nextId = 1;
	private pending = new Map<number, Pending>();
	private handlers = new Map<string, RequestHandler>();
	private inflight = new Map<string, AbortController>();

	constructor(socket: string, intro: Intro, events: LinkEvents, spawnCommand?: string, logPath?: string, named = false) {
		this.socket = socket;
		this.intro = intro;
		this.events = events;
		this.spawnCommand = spawnCommand;
		this.logPath = logPath;
		this.named = named;
	}

	/** Registers the answer to an editor-initiated request method. */
	handle(method: string, handler: RequestHandler): void {
		this.handlers.set(method, handler);
	}

	/** True while the socket is open. */
	isOpen(): boolean {
		return this.open;
	}

	/** Dials now (and keeps redialling until closed). */
	start(): void {
		this.closed = false;
		this.dial();
	}

	/** Closes for good: no reconnect; calls in flight fail with [`LinkLost`]. */
	close(): void {
		this.closed = true;
		if (this.timer) clearTimeout(this.timer);
		this.timer = null;
		const ws = this.ws;
		this.ws = null;
		if (ws) {
			try {
				ws.close(1000);
			} catch {
				ws.terminate();
			}
		}
		this.down("closed by pi", false);
	}

	/** A JSON-RPC request to the broker (or through it, the editor). An abort of `signal` takes
	 * it back (`notifications/cancelled`: the broker forgets it, and a diff is withdrawn from
	 * whoever reviews it) and rejects with {@link RequestAborted}. */
	request(method: string, params: unknown, timeoutMs?: number, signal?: AbortSignal): Promise<any> {
		const ws = this.ws;
		if (!ws || !this.open) return Promise.reject(new LinkLost("not connected to pi-ide-broker"));
		if (signal?.aborted) return Promise.reject(new RequestAborted(method));
		const id = this.nextId++;
		return new Promise((resolve, reject) => {
			let timer: ReturnType<typeof setTimeout> | undefined;
			const onAbort = () => {
				this.notify(Mcp.CANCELLED, { requestId: id, reason: "aborted in pi" });
				this.pending.get(id)?.reject(new RequestAborted(method));
			};
			signal?.addEventListener("abort", onAbort, { once: true });
			const done = (f: () => void) => {
				if (timer) clearTimeout(timer);
				signal?.removeEventListener("abort", onAbort);
				this.pending.delete(id);
				f();
			};
			this.pending.set(id, {
				resolve: (v) => done(() => resolve(v)),
				reject: (e) => done(() => reject(e)),
			});
			if (timeoutMs !== undefined) {
				timer = setTimeout(() => {
					this.pending.get(id)?.reject(new Error(`${method} timed out after ${timeoutMs} ms`));
				}, timeoutMs);
			}
			ws.send(JSON.stringify({ jsonrpc: "2.0", id, method, params }));
		});
	}

	/** A JSON-RPC notification to the broker; dropped when not connected. */
	notify(method: string, params: unknown): void {
		const ws = this.ws;
		if (ws && this.open) ws.send(JSON.stringify({ jsonrpc: "2.0", method, params }));
	}

	/** `tools/call` of an editor tool (always with `arguments`). */
	callTool(name: string, args: Record<string, unknown>, timeoutMs?: number, signal?: AbortSignal): Promise<any> {
		return this.request(Mcp.TOOLS_CALL, { name, arguments: args }, timeoutMs, signal);
	}

	private dial(): void {
		if (this.closed || this.ws) return;
		// Checked at every dial, right before it: a squatter can come (or be removed) any time.
		const trust = socketTrust(this.socket, { named: this.named });
		if (trust.kind === "refused") {
			// Never dialled, and no daemon started for this path (it would refuse a squatted dir
			// anyway); told once per problem, checked again at every redial.
			if (this.untrusted !== trust.problem) this.events.onUntrusted?.(trust.problem);
			this.untrusted = trust.problem;
			return this.down(`not connecting: someone else may be listening at ${this.socket}`, true);
		}
		this.untrusted = null;
		if (trust.kind === "absent") {
			// Nothing there: as an ENOENT from the dial, without the dial (in a shared dir the
			// path could be taken between the check and the dial).
			this.noDaemon();
			return this.down(`pi-ide-broker is not running at ${this.socket}`, true);
		}
		const ws = new UnixWebSocket(this.socket, sessionPath(this.intro), { handshakeTimeout: 5000 });
		this.ws = ws;
		ws.on("open", () => {
			if (this.ws !== ws) return;
			this.open = true;
			this.attempt = 0;
			const reconnected = this.everOpen;
			// "Started" only now that the daemon this link spawned answers.
			if (this.spawned) this.events.onSpawned?.(this.logPath, reconnected);
			this.spawned = false;
			this.earlyExits = 0;
			this.failedStarts = 0;
			this.spawnAgainAt = 0;
			this.everOpen = true;
			// A proper MCP client: initialize first (answered by the broker, which also holds
			// back notifications until then).
			this.request(Mcp.INITIALIZE, {
				protocolVersion: "2024-11-05",
				capabilities: {},
				clientInfo: { name: "pi-ide-broker-pi", version: "0.1.0" },
			})
				.then(() => ws.send(JSON.stringify({ jsonrpc: "2.0", method: Mcp.INITIALIZED })))
				.catch(() => {});
			this.events.onOpen?.(reconnected);
		});
		ws.on("message", (text: string) => this.onMessage(text));
		ws.on("error", (err: NodeJS.ErrnoException) => {
			if (this.ws !== ws) return;
			if (isNotRunning(err)) this.noDaemon();
		});
		ws.on("close", () => {
			if (this.ws !== ws) return;
			this.ws = null;
			this.down("pi-ide-broker connection lost", true);
		});
	}

	private down(why: string, reconnect: boolean): void {
		const wasOpen = this.open;
		this.open = false;
		for (const p of [...this.pending.values()]) p.reject(new LinkLost(why));
		this.pending.clear();
		for (const c of this.inflight.values()) c.abort();
		this.inflight.clear();
		// Not a detach: the broker keeps the session's sticky target and re-attaches it when
		// the link is back.
		this.attached = null;
		if (wasOpen) this.lostAt = Date.now();
		if (wasOpen) this.events.onDown?.(why);
		else if (reconnect) this.events.onUnreachable?.(why);
		if (reconnect && !this.closed) {
			let delay = backoffDelay(this.attempt++);
			// A daemon is due to be started: the dial that starts it comes when it is due.
			const due = this.lostAt + this.respawnAfterMs - Date.now();
			if (this.everOpen && !this.spawned && this.spawnCommand && due > 0) delay = Math.min(delay, due + 10);
			this.timer = setTimeout(() => {
				this.timer = null;
				this.dial();
			}, delay);
		}
	}

	/** No daemon answers: start one, if the link has a command, once per outage: before the
	 * first connection, and after the daemon it was connected to went away (a crash, a stop).
	 * Another session may start one at the same moment: the daemon's own lock keeps one. One
	 * that exits before the link opens on it (the old daemon, still stopping, held the lock)
	 * is started again, {@link SPAWN_AGAIN_MS} later and doubling. */
	private noDaemon(): void {
		if (this.spawned || !this.spawnCommand) return;
		if (this.everOpen && Date.now() - this.lostAt < this.respawnAfterMs) return;
		if (Date.now() < this.spawnAgainAt) return;
		this.spawnDaemon();
		// Dialled again soon: the daemon binds its socket within a few hundred ms.
		this.attempt = 0;
	}

	private spawnDaemon(): void {
		this.spawned = true;
		const gen = ++this.spawnGen;
		const command = this.spawnCommand;
		if (!command) return;
		try {
			let out: number | "ignore" = "ignore";
			if (this.logPath) {
				mkdirSync(dirname(this.logPath), { recursive: true, mode: 0o700 });
				out = openSync(this.logPath, "a", 0o600);
			}
			const child = spawn(command, ["daemon"], { detached: true, stdio: ["ignore", out, out] });
			// Not installed, not executable: said once, with what to do (the reconnect loop
			// keeps trying, for a daemon started another way).
			child.on("error", (err: NodeJS.ErrnoException) => this.events.onSpawnFailed?.(command, err.code));
			child.on("exit", (code, signal) => this.spawnExited(gen, command, code, signal));
			child.unref();
		} catch (err) {
			this.events.onSpawnFailed?.(command, (err as NodeJS.ErrnoException).code);
		}
	}

	/** Start `gen` (of `command`) exited with `code` or `signal`: if the link never opened on
	 * it, another may be started later; the {@link EXITS_TOLD_AFTER}th failure in a row that
	 * is not "already running" is told. */
	private spawnExited(gen: number, command: string, code: number | null, signal: NodeJS.Signals | null): void {
		if (gen !== this.spawnGen || !this.spawned || this.closed) return;
		this.spawned = false;
		const wait = Math.min(SPAWN_AGAIN_CAP_MS, this.spawnAgainMs * 2 ** this.earlyExits++);
		this.spawnAgainAt = Date.now() + wait;
		if (code === EXIT_ALREADY_RUNNING) return;
		if (++this.failedStarts !== EXITS_TOLD_AFTER) return;
		const how = code !== null ? `exit code ${code}` : `signal ${signal}`;
		this.events.onSpawnExited?.(command, how, lastLine(this.logPath));
	}

	private onMessage(text: string): void {
		if (DEBUG_FILE) {
			try {
				appendFileSync(DEBUG_FILE, `${new Date().toISOString()} <- ${text.slice(0, 300)}\n`);
			} catch {
				// Debugging must never break the link.
			}
		}
		let msg: any;
		try {
			msg = JSON.parse(text);
		} catch {
			return;
		}
		if (!msg || typeof msg !== "object") return;
		const hasId = msg.id !== undefined && msg.id !== null;
		if (hasId && typeof msg.method === "string") return void this.onRequest(msg.id, msg.method, msg.params);
		if (hasId) {
			const p = typeof msg.id === "number" ? this.pending.get(msg.id) : undefined;
			if (!p) return;
			if (msg.error) p.reject(new RpcError(Number(msg.error.code ?? -32603), String(msg.error.message ?? "error")));
			else p.resolve(msg.result);
			return;
		}
		if (typeof msg.method !== "string") return;
		switch (msg.method) {
			case Broker.ATTACHED: {
				const p = msg.params ?? {};
				this.attached = {
					id: String(p.editor ?? ""),
					ideName: typeof p.ide_name === "string" ? p.ide_name : String(p.editor ?? "editor"),
					folders: Array.isArray(p.workspace_folders) ? p.workspace_folders.map(String) : [],
				};
				this.events.onAttached?.(this.attached);
				const old = olderDaemonNotice(p);
				if (old) this.events.onNotice?.(old);
				return;
			}
			case Broker.NOTICE:
				if (typeof msg.params?.message === "string") this.events.onNotice?.(msg.params.message);
				return;
			case Broker.DETACHED:
				this.attached = null;
				this.events.onDetached?.(String(msg.params?.reason ?? "detached"));
				return;
			case "request_cancelled": {
				const id = msg.params?.id;
				this.inflight.get(String(id))?.abort();
				return;
			}
			default:
				this.events.onNotification?.(msg.method, msg.params);
		}
	}

	private async onRequest(id: unknown, method: string, params: unknown): Promise<void> {
		const ws = this.ws;
		const reply = (body: Record<string, unknown>) => {
			if (ws && ws === this.ws && this.open) ws.send(JSON.stringify({ jsonrpc: "2.0", id, ...body }));
		};
		const handler = this.handlers.get(method);
		if (!handler) return reply({ error: { code: -32601, message: `Method not found: ${method}` } });
		const abort = new AbortController();
		const key = String(id);
		this.inflight.set(key, abort);
		try {
			const result = await handler(params, abort.signal);
			if (abort.signal.aborted) return reply({ error: { code: -32800, message: "Request cancelled" } });
			reply({ result });
		} catch (err) {
			const message = err instanceof Error ? err.message : String(err);
			reply({ error: { code: abort.signal.aborted ? -32800 : -32603, message } });
		} finally {
			this.inflight.delete(key);
		}
	}
}

function isNotRunning(err: NodeJS.ErrnoException): boolean {
	return err.code === "ENOENT" || err.code === "ECONNREFUSED";
}
