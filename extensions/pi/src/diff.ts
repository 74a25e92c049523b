// Diff review: what pi's `write` and `edit` calls propose, and what the editor answered.

import { homedir } from "node:os";
import { resolve } from "node:path";

/** An `edit` tool call's replacements. */
export type Edit = { oldText: string; newText: string };

/** The absolute path a tool call names, resolved as pi's tools resolve it: a leading `@`
 * dropped, `~` expanded, relative to the session's cwd. */
export function toolPath(cwd: string, path: string, home = homedir()): string {
	let p = path.startsWith("@") ? path.slice(1) : path;
	if (p === "~") p = home;
	else if (p.startsWith("~/")) p = home + p.slice(1);
	return resolve(cwd, p);
}

/** Applies `edits` as pi's edit tool would (each `oldText` must occur exactly once);
 * throws with the reason when it would fail. */
export function applyEdits(original: string, edits: Edit[]): string {
	let text = original;
	for (const e of edits) {
		if (typeof e?.oldText !== "string" || typeof e?.newText !== "string") throw new Error("edit without oldText/newText");
		if (e.oldText === "") throw new Error("edit oldText is empty");
		const at = text.indexOf(e.oldText);
		if (at === -1) throw new Error("edit oldText not found in file");
		if (text.indexOf(e.oldText, at + 1) !== -1) throw new Error("edit oldText is not unique in file");
		text = text.slice(0, at) + e.newText + text.slice(at + e.oldText.length);
	}
	return text;
}

/** What the editor decided. */
export type Verdict =
	| { kind: "saved"; text: string }
	| { kind: "rejected"; why: string }
	/** The broker could not show it to the user (editor lost, broker stopping). */
	| { kind: "undelivered"; why: string };

/** Reads an `openDiff` result. Only `FILE_SAVED` with the final text is an acceptance: a
 * missing text is a rejection (never an empty file), anything else is the user's no. */
export function parseDiffResult(result: unknown): Verdict {
	const r = result as { content?: { type?: unknown; text?: unknown }[]; _meta?: Record<string, unknown> } | null;
	const undelivered = r?._meta?.["pi-ide-broker/undelivered"];
	if (typeof undelivered === "string") return { kind: "undelivered", why: undelivered };
	const items = r?.content;
	const marker = Array.isArray(items) ? items[0]?.text : undefined;
	if (marker === "FILE_SAVED") {
		const text = items?.[1]?.text;
		if (typeof text === "string") return { kind: "saved", text };
		return { kind: "rejected", why: "the editor accepted the diff but sent no final text" };
	}
	if (marker === "DIFF_REJECTED") return { kind: "rejected", why: "rejected in the editor" };
	return { kind: "rejected", why: `the editor answered ${typeof marker === "string" ? marker : "nothing usable"}` };
}

/** The tab name of a tool call's diff, as pi-ide names it. */
export function tabName(toolName: string, toolCallId: string): string {
	return `pi-${toolName}:${toolCallId}`;
}
