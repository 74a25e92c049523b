// pi-ide-broker for pi: every pi session reaches its editor through the broker's socket.
// Editor context before each LLM call, write/edit reviewed as diffs in the editor, inline
// suggestions for the editor, a sticky editor per pi session (kept by the broker across
// /new, /resume, /fork and broker restarts), reconnect when the broker restarts.
//
// All state lives in this factory's closure: one instance per pi session, so a host that runs
// many sessions in one process (pi-web) gives each its own link, key and widget.

import type { ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";
import { readFile } from "node:fs/promises";
import { basename } from "node:path";
import { BrokerLink, type Attached } from "./src/broker.ts";
import { applySelection, diagnosticsBlock, editorBlock, emptyState, widgetText } from "./src/context.ts";
import { FirstAttach } from "./src/first_attach.ts";
import { toolPath } from "./src/diff.ts";
import { readOptions, resolvePaths, type Options } from "./src/options.ts";
import { platformBinary } from "./src/binary.js";
import { brokerCommand, spawnFailure } from "./src/install.js";
import * as follow from "./src/follow.ts";
import { Followers } from "./src/followers.ts";
import { reviewWrite } from "./src/review.ts";
import { Broker, Editor, Follow } from "./src/methods.ts";
import { parseSuggestions, splitModel, SUGGESTION_SYSTEM_PROMPT, suggestionPrompt, type SuggestionParams } from "./src/suggest.ts";

const WIDGET = "pi-ide-broker";
const CONTEXT_TYPE = "pi-ide-broker.editor-context";
const SUGGESTION_FLAG = "pi-ide-suggestion-model";
/** How long the extension may hold up an LLM call. */
export type Limits = {
	/** A frozen editor (or a first attach still in flight) delays an LLM call by at most this. */
	diagnosticsMs: number;
	/** The first LLM call of a session waits at most this long for the session's first attach
	 * (within `diagnosticsMs`). */
	firstAttachMs: number;
	/** A `read` waits at most this long for a following editor's buffer (default
	 * `BUFFER_READ_MS`; `PI_IDE_BROKER_BUFFER_READ_MS` sets it). */
	bufferReadMs?: number;
};

/** The limits pi runs the extension with. The first attach may take the whole budget: on a
 * loaded machine (a fork in pi-web while the parent chat is torn down) the dial, handshake and
 * attach can take longer than a few hundred ms, and nothing is lost by waiting where no editor
 * is coming, since the broker's answer to `broker/editors` (or no broker) settles the wait. */
export const DEFAULT_LIMITS: Limits = { diagnosticsMs: 1000, firstAttachMs: 1000 };
/** How long a write/edit waits for a dropped broker link to come back before it is blocked. */
const REATTACH_WAIT_MS = 3000;
/** How long the note that the daemon was started again waits to ride with the reattach. */
const RESTART_NOTE_WAIT_MS = 3000;
/** How long a `read` waits for a following editor's buffer: a big buffer (6 MB for 300,000
 * lines) crosses the client, `acp`, the broker and this socket, and pi's read has run already. */
export const BUFFER_READ_MS = 3000;

/** The limits, with what the environment sets: `PI_IDE_BROKER_BUFFER_READ_MS` (a positive
 * number of ms; anything else keeps the default). */
export function limitsFrom(env: NodeJS.ProcessEnv, base: Limits = DEFAULT_LIMITS): Limits {
	const ms = Number(env.PI_IDE_BROKER_BUFFER_READ_MS);
	return Number.isInteger(ms) && ms > 0 ? { ...base, bufferReadMs: ms } : base;
}
const SPINNER = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/** The session whose editor a starting session takes: the one a `/new` or `/fork` replaced,
 * else the parent named in the session's header (a fork that a host such as pi-web opens as
 * a session of its own). The broker ignores it for a key that has an editor already. */
function inheritFrom(
	event: { reason: string; previousSessionFile?: string },
	c: ExtensionContext,
): string | undefined {
	const replaced = event.reason === "new" || event.reason === "fork" ? previousSessionId(event.previousSessionFile) : undefined;
	return replaced ?? previousSessionId(c.sessionManager.getHeader?.()?.parentSession);
}

/** The session id of the session a `/new` or `/fork` replaced, from its file name
 * (`<timestamp>_<session-id>.jsonl`). */
export function previousSessionId(file: string | undefined): string | undefined {
	if (!file) return undefined;
	const name = basename(file).replace(/\.jsonl$/, "");
	const at = name.indexOf("_");
	const id = at >= 0 ? name.slice(at + 1) : name;
	return id || undefined;
}

/** The extension as pi loads it. */
export default function piIdeBroker(pi: ExtensionAPI) {
	createPiIdeBroker(limitsFrom(process.env))(pi);
}

/** The extension with these limits (tests shorten or stretch them). */
export function createPiIdeBroker(limits: Limits) {
	return (pi: ExtensionAPI) => wire(pi, limits);
}

function wire(pi: ExtensionAPI, limits: Limits) {
	pi.registerFlag(SUGGESTION_FLAG, {
		type: "string",
		description: "Model for inline suggestions in the editor (provider/id); default: the session's model.",
	});

	let ctx: ExtensionContext | null = null;
	let options: Options | null = null;
	let link: BrokerLink | null = null;
	// Why the daemon could not be started, once a spawn failed (what `/ide` then says).
	let spawnFailed: string | undefined;
	let state = emptyState();
	let lastDiagnostics: string | null = null;
	/** Set once attached; cleared only when the broker says the editor is gone or we detach:
	 * while it holds, a write/edit is never applied without the editor's review. */
	let reviewing = false;
	/** The toast for the next attach. */
	let nextAttachToast: "Auto-connected to" | "Reconnected to" | "Connected to" = "Auto-connected to";
	let suggesting = 0;
	let spinner: ReturnType<typeof setInterval> | null = null;
	let frame = 0;
	let attachWaiters: (() => void)[] = [];
	const firstAttach = new FirstAttach();
	/** Said with the next attach (or alone, if none comes): the daemon had gone and this
	 * session started it again. */
	let restartNote: string | null = null;
	/** The editor id of the last attachment. */
	let lastEditor: string | null = null;
	let lastName = "the editor";

	/** The ACP editors following this session through the broker (`pi-ide-broker acp`). */
	const followers = new Followers();
	const mirror = (update: follow.SessionUpdate | null) => {
		if (update && followers.watched) link?.notify(Follow.UPDATE, { update });
	};

	const notify = (text: string, kind: "info" | "warning" | "error" = "info") => ctx?.ui.notify(text, kind);
	// Notices already shown in this pi session (a version skew, an untrusted socket: told once,
	// not per reconnect).
	const told = new Set<string>();
	const tellOnce = (text: string, kind: "warning" | "error") => {
		if (told.has(text)) return;
		told.add(text);
		notify(text, kind);
	};

	const render = () => {
		if (!ctx) return;
		const a = link?.attached;
		if (!a) return ctx.ui.setWidget(WIDGET, undefined);
		const spin = suggesting > 0 ? (ctx.mode === "tui" ? SPINNER[frame] : "…") : null;
		ctx.ui.setWidget(WIDGET, [widgetText(a.ideName, state, spin)]);
	};

	const suggestionsChanged = (delta: number) => {
		suggesting += delta;
		if (suggesting > 0 && !spinner && ctx?.mode === "tui") {
			spinner = setInterval(() => {
				frame = (frame + 1) % SPINNER.length;
				render();
			}, 80);
		}
		if (suggesting === 0 && spinner) {
			clearInterval(spinner);
			spinner = null;
		}
		render();
	};

	const onAttached = (a: Attached) => {
		const switched = reviewing && nextAttachToast === "Connected to";
		reviewing = true;
		// Back on the same editor (after a broker restart): what it last said still holds
		// until it says more; editors replay their selection only to new connections.
		if (a.id !== lastEditor) {
			state = emptyState();
			lastDiagnostics = null;
		}
		lastEditor = a.id;
		lastName = a.ideName;
		// One toast for an outage: the reattach, and why it was needed when we restarted the daemon.
		notify(`${switched ? "Switched to" : nextAttachToast} ${a.ideName}${restartNote ? ` (${restartNote})` : ""}`);
		restartNote = null;
		nextAttachToast = "Reconnected to";
		for (const w of attachWaiters.splice(0)) w();
		firstAttach.settle();
		render();
	};

	const onDetached = (reason: string) => {
		firstAttach.settle();
		if (reason.includes("shutting down")) {
			// The broker is restarting: the link will come back and re-attach; keep reviewing.
			render();
			return;
		}
		state = emptyState();
		lastEditor = null;
		reviewing = false;
		notify(reason === "detached by client" ? `Disconnected from ${lastName}` : `IDE disconnected: ${reason}`, "warning");
		render();
	};

	/** Waits (bounded) until the link is attached again. */
	const attachedWithin = (ms: number) =>
		new Promise<boolean>((done) => {
			if (link?.attached) return done(true);
			const t = setTimeout(() => done(Boolean(link?.attached)), ms);
			attachWaiters.push(() => {
				clearTimeout(t);
				done(true);
			});
		});

	const openLink = async (c: ExtensionContext, intro: { session: string; inherit?: string }) => {
		options ??= readOptions(pi.getSettings?.(), process.env);
		const paths = await resolvePaths(options, process.env);
		const l = new BrokerLink(
			paths.socket,
			{ cwd: c.cwd, session: intro.session, inherit: intro.inherit },
			{
				onAttached,
				onDetached,
				onOpen: (reconnected) => {
					if (reconnected) nextAttachToast = "Reconnected to";
					void l.request(Broker.EDITORS, {}, 5000).then(
						(r: { attached?: string | null; editors?: unknown[] }) => {
							// Answered after the attach notice, if the broker placed the session.
							if (!r?.attached) firstAttach.settle();
							// A restarted daemon links its editors as the session arrives: the note
							// waits for the attach a moment, and is said alone if none comes.
							if (!r?.attached && restartNote) {
								setTimeout(() => {
									if (restartNote) notify(restartNote);
									restartNote = null;
								}, RESTART_NOTE_WAIT_MS);
							}
							if (!r?.attached && Array.isArray(r?.editors) && r.editors.length > 1) {
								notify(`${r.editors.length} editors match ${c.cwd}; choose one with /ide`, "warning");
							}
						},
						() => firstAttach.settle(),
					);
				},
				onDown: () => {
					followers.lost();
					render();
				},
				onUnreachable: () => firstAttach.settle(),
				// Someone else may be listening at the socket: said once (the link keeps checking
				// at each redial, and connects once the path is fixed).
				onUntrusted: (problem) => tellOnce(problem, "error"),
				onNotification: (method, params) => {
					if (method === Editor.SELECTION_CHANGED && applySelection(state, params, l.attached?.folders[0])) render();
					if (method === Broker.FOLLOWERS) {
						const took = followers.heard(params);
						if (took) notify(`Diffs are reviewed in ${took} while its turn is open`);
					}
				},
				onSpawned: (log, again) => {
					if (again) restartNote = `pi-ide-broker had stopped and was started again${log ? `; log: ${log}` : ""}`;
					else notify(`Started pi-ide-broker${log ? ` (log: ${log})` : ""}`);
				},
				onSpawnFailed: (command, code) => {
					spawnFailed = spawnFailure(command, code, { installed: platformBinary() !== null });
					notify(spawnFailed, "error");
				},
				onSpawnExited: (command, how, said) => {
					const log = paths.log ? ` (log: ${paths.log})` : "";
					// Without a log (its config broken, the binary could not say where), what it
					// said when asked for its paths.
					const reason = said ?? paths.problem;
					const why = reason ? `: ${reason}` : `. \`${command} doctor\` says what is wrong`;
					spawnFailed = `The pi-ide-broker daemon exits as it starts (\`${command} daemon\`, ${how})${log}${why}. Starting it again now and then.`;
					notify(spawnFailed, "error");
				},
				onNotice: (message) => tellOnce(message, "warning"),
			},
			options.spawn ? options.command : undefined,
			paths.log,
			paths.named,
		);
		l.handle(Editor.GET_SUGGESTIONS, (params, signal) => suggest((params ?? {}) as SuggestionParams, signal));
		l.handle(Editor.LIST_SUGGESTION_MODELS, async () => listModels());
		l.handle(Follow.HISTORY, async () => ({ updates: follow.history(c.cwd, ctx?.sessionManager.getBranch() ?? []) }));
		l.handle(Follow.PROMPT, (params) => {
			const p = (params ?? {}) as { text?: unknown; prompt?: unknown };
			return promptFromFollower(String(p.text ?? ""), typeof p.prompt === "string" ? p.prompt : undefined);
		});
		l.handle(Follow.CANCEL, async (params) => {
			const named = (params as { prompt?: unknown } | null)?.prompt;
			// Only a follower's own prompt is stopped: a queued one leaves the queue untouched by
			// pi, a running one (its run was started for it) is aborted; pi's terminal turn and
			// another follower's prompt go on.
			if (followers.cancel(typeof named === "string" ? named : undefined) === "abort") {
				ctx?.abort();
				// Stopped before its run began: no run will settle it, so it is answered now.
				if (ctx?.isIdle()) {
					followers.unstarted();
					startQueued();
				}
			}
			return {};
		});
		link = l;
		l.start();
		return l;
	};

	/** A prompt typed in a following ACP editor (`id`: the broker's name for it): sent to pi as
	 * the user's once pi is idle (queued here behind a running turn, so that its cancel can take
	 * it back), answered when its run has settled. */
	const promptFromFollower = async (text: string, id: string | undefined): Promise<{ stopReason: string }> => {
		if (!ctx) throw new Error("session not yet started");
		if (!text.trim()) throw new Error("empty prompt");
		const settled = followers.prompt(id, text);
		startQueued();
		return { stopReason: follow.stopReason(await settled) };
	};

	/** Hands pi the oldest queued follower prompt, if pi is idle and none of them runs. */
	const startQueued = () => {
		const text = followers.next(ctx?.isIdle() ?? false);
		if (text !== null) pi.sendUserMessage(text);
	};

	const suggest = async (params: SuggestionParams, signal: AbortSignal): Promise<{ suggestions: string[] }> => {
		const c = ctx;
		if (!c) throw new Error("session not yet started");
		suggestionsChanged(1);
		try {
			const flag = pi.getFlag(SUGGESTION_FLAG);
			const spec = typeof flag === "string" && flag ? flag : params.model;
			let model = c.model;
			if (spec) {
				const { provider, id } = splitModel(spec);
				model = c.modelRegistry.find(provider, id);
				if (!model) throw new Error(`model not found: ${spec}`);
			}
			if (!model) throw new Error("no model: pick one in pi or pass --pi-ide-suggestion-model");
			const stream = c.modelRegistry.streamSimple(
				model,
				{
					systemPrompt: SUGGESTION_SYSTEM_PROMPT,
					messages: [{ role: "user", content: [{ type: "text", text: suggestionPrompt(params) }], timestamp: Date.now() }],
				},
				{ maxTokens: 1024, signal },
			);
			const answer = await stream.result();
			if (answer.stopReason === "error" || answer.stopReason === "aborted") {
				throw new Error(answer.errorMessage ?? `suggestion model stopped: ${answer.stopReason}`);
			}
			const text = answer.content
				.filter((b): b is { type: "text"; text: string } => b.type === "text")
				.map((b) => b.text)
				.join("");
			return { suggestions: parseSuggestions(text, params) };
		} finally {
			suggestionsChanged(-1);
		}
	};

	const listModels = () => {
		const c = ctx;
		if (!c) throw new Error("session not yet started");
		const flag = pi.getFlag(SUGGESTION_FLAG);
		return {
			cliOverride: typeof flag === "string" && flag ? flag : undefined,
			currentModel: c.model ? `${c.model.provider}/${c.model.id}` : undefined,
			models: c.modelRegistry.getAvailable().map((m) => ({
				provider: m.provider,
				id: m.id,
				name: m.name,
				model: `${m.provider}/${m.id}`,
			})),
		};
	};

	const sessionKey = (c: ExtensionContext) => c.sessionManager.getSessionId() || `pi-${process.pid}-${Date.now()}`;

	pi.on("session_start", async (event, c) => {
		ctx = c;
		options = readOptions(pi.getSettings?.(), process.env);
		nextAttachToast = event.reason === "startup" ? "Auto-connected to" : "Reconnected to";
		if (!options.autoconnect) return;
		firstAttach.begin();
		await openLink(c, { session: sessionKey(c), inherit: inheritFrom(event, c) });
	});

	pi.on("message_start", (event) => {
		const m = (event as { message?: { role?: unknown; content?: unknown } }).message;
		if (m?.role !== "user") return;
		// Every follower sees every prompt, a follower's too: its own ACP door drops the echo.
		mirror(follow.userMessage(m.content));
	});
	pi.on("message_update", (event) => mirror(follow.assistantDelta((event as { assistantMessageEvent?: unknown }).assistantMessageEvent)));
	// pi runs `tool_execution_start` before `tool_call` (its docs, "tool call hooks"): the
	// thread hears of the call here, pending (a review may follow in `tool_call`), and that it
	// runs once `tool_call` has let it through.
	pi.on("tool_execution_start", (event) =>
		mirror(follow.toolCallProposed(ctx?.cwd ?? process.cwd(), event.toolCallId, event.toolName, event.args)),
	);
	pi.on("tool_execution_end", (event) => mirror(follow.toolCallDone(event.toolCallId, event.result, event.isError)));
	// A `read` of a file a following ACP editor holds with unsaved changes: the model gets the
	// editor's text instead of the disk's (the client's `fs/read_text_file`, through the
	// broker), cut as pi's own `read` cuts a file: its offset/limit, its line and byte limits.
	pi.on("tool_result", async (event, c) => {
		if (event.toolName !== "read" || event.isError || !followers.buffers) return;
		if (event.content.some((b) => b.type !== "text")) return; // an image: no text to swap
		const input = event.input as { path?: unknown; offset?: unknown; limit?: unknown };
		if (typeof input?.path !== "string") return;
		const path = toolPath(c.cwd, input.path);
		let read: { content?: unknown; editor?: unknown } | undefined;
		try {
			read = await link?.request(Broker.READ, { path }, limits.bufferReadMs ?? BUFFER_READ_MS);
		} catch {
			return;
		}
		const buffer = read?.content;
		if (typeof buffer !== "string") return;
		const disk = await readFile(path, "utf8").catch(() => null);
		if (buffer === disk) return;
		const note = follow.bufferNote(typeof read?.editor === "string" ? read.editor : "the following ACP editor");
		const shown = await readAsPiWould(c.cwd, event.toolCallId, event.input, buffer);
		return { content: [{ type: "text", text: `${note}\n${shown.text}` }], details: shown.details, isError: shown.isError };
	});
	pi.on("agent_settled", (event) => {
		followers.settled(Boolean((event as { aborted?: unknown }).aborted));
		startQueued();
	});

	pi.on("session_shutdown", () => {
		followers.ended();
		link?.close();
		link = null;
		reviewing = false;
		state = emptyState();
		if (spinner) clearInterval(spinner);
		spinner = null;
		suggesting = 0;
		for (const w of attachWaiters.splice(0)) w();
		firstAttach.settle();
		ctx?.ui.setWidget(WIDGET, undefined);
	});

	pi.registerCommand("ide", {
		description: "Choose the editor for this session through pi-ide-broker; choosing the connected one disconnects.",
		async handler(_args, c) {
			ctx = c;
			const l = link ?? (await openLink(c, { session: sessionKey(c) }));
			const up = await new Promise<boolean>((done) => {
				if (l.isOpen()) return done(true);
				const t0 = Date.now();
				const poll = setInterval(() => {
					if (l.isOpen() || Date.now() - t0 > 3000) {
						clearInterval(poll);
						done(l.isOpen());
					}
				}, 50);
			});
			if (!up) {
				notify(
					l.untrusted ??
						spawnFailed ??
						`Failed to connect: pi-ide-broker is not answering on ${l.socket}; start it with \`${brokerCommand("daemon")}\``,
					"error",
				);
				return;
			}
			type Choice = { id: string; ide_name: string; matched_folder: string; state: string };
			let r: { attached: string | null; editors: Choice[] };
			try {
				r = await l.request(Broker.EDITORS, {}, 5000);
			} catch (err) {
				notify(`Failed to list editors: ${err instanceof Error ? err.message : String(err)}`, "error");
				return;
			}
			const current = r.editors.find((e) => e.id === r.attached);
			if (r.editors.length === 0) {
				if (r.attached) {
					await l.request(Broker.DETACH, {}).catch(() => {});
					notify(`Disconnected from ${l.attached?.ideName ?? r.attached}`, "warning");
				} else {
					notify("No running IDE found for this project", "warning");
				}
				return;
			}
			const labels = r.editors.map(
				(e) => `${e.ide_name} · ${e.matched_folder} · ${e.state} · ${e.id}${e.id === r.attached ? " · (connected)" : ""}`,
			);
			const choice = await c.ui.select(current ? "Select IDE (toggle to disconnect)" : "Connect to IDE", labels);
			if (!choice) return;
			const picked = r.editors[labels.indexOf(choice)];
			if (!picked) return;
			if (picked.id === r.attached) {
				await l.request(Broker.DETACH, {}).catch(() => {});
				return;
			}
			nextAttachToast = "Connected to";
			try {
				await l.request(Broker.ATTACH, { editor: picked.id }, 5000);
			} catch (err) {
				notify(`Failed to connect: ${err instanceof Error ? err.message : String(err)}`, "error");
			}
		},
	});

	pi.on("context", async (event) => {
		const began = Date.now();
		// A host that prompts at once (pi-web) gets here before the first attach: wait for it.
		await firstAttach.wait(Math.min(limits.firstAttachMs, limits.diagnosticsMs));
		const l = link;
		if (!l?.attached) return;
		const last = event.messages[event.messages.length - 1] as { role?: string } | undefined;
		const onPrompt = last?.role === "user";
		const blocks: string[] = [];
		const budget = limits.diagnosticsMs - (Date.now() - began);
		let diagnostics: string | null = null;
		try {
			if (budget > 0) diagnostics = diagnosticsBlock(await l.callTool("getDiagnostics", {}, budget));
		} catch {
			diagnostics = null;
		}
		// Read after the diagnostics: the selection the broker replays right after an attach
		// is in by then.
		const editor = onPrompt ? editorBlock(state) : null;
		if (editor) blocks.push(editor);
		if (diagnostics && (onPrompt || diagnostics !== lastDiagnostics)) blocks.push(diagnostics);
		lastDiagnostics = diagnostics;
		if (blocks.length === 0) return;
		return {
			messages: [
				...event.messages,
				{ role: "custom", customType: CONTEXT_TYPE, content: blocks.join("\n\n"), display: false, timestamp: Date.now() },
			],
		};
	});

	pi.on("tool_call", async (event, c) => {
		const verdict = await reviewToolCall(event, c);
		if (!verdict?.block) mirror(follow.toolCallRunning(event.toolCallId));
		return verdict;
	});

	/** A write or edit reviewed where a reviewer is (`src/review.ts`). */
	const reviewToolCall = (event: { toolCallId: string; toolName: string; input: unknown }, c: ExtensionContext) =>
		reviewWrite(
			{
				link,
				editorReviews: reviewing,
				followerReviews: followers.reviewer !== null,
				attachedWithin: () => attachedWithin(REATTACH_WAIT_MS),
				notify: (text) => notify(text, "warning"),
			},
			event,
			c.cwd,
			c.signal,
		);
}

/** `text` as pi's own `read` tool gives a file to the model (its `offset`/`limit`, its line and
 * byte limits and their "[Showing lines …]" notes), run on that text instead of the disk. */
async function readAsPiWould(
	cwd: string,
	toolCallId: string,
	input: Record<string, unknown>,
	text: string,
): Promise<{ text: string; details: unknown; isError: boolean }> {
	// Imported here, not at the top: pi provides the module to its extensions, and the unit
	// tests load this file without pi.
	const { createReadTool } = await import("@earendil-works/pi-coding-agent");
	const bytes = Buffer.from(text, "utf8");
	const tool = createReadTool(cwd, {
		operations: { readFile: async () => bytes, access: async () => {}, detectImageMimeType: async () => null },
	});
	try {
		const r = await tool.execute(toolCallId, input as never);
		return { text: follow.contentText(r.content), details: r.details, isError: false };
	} catch (err) {
		return { text: err instanceof Error ? err.message : String(err), details: undefined, isError: true };
	}
}
