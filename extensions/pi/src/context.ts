// The editor context given to the model before each LLM call: an `<editor>` block (file,
// cursor, selection) and an `<lsp_diagnostics>` block, in pi-ide's format.

import { basename, isAbsolute, join } from "node:path";

/** The last `selection_changed` of the attached editor. */
export type EditorState = {
	filePath: string | null;
	/** 0-based cursor line. */
	cursorLine: number | null;
	/** 0-based lines of a non-empty selection, and its text. */
	selection: { startLine: number; endLine: number; text: string } | null;
};

/** Selection text beyond this many lines is cut. */
export const MAX_SELECTION_LINES = 100;
/** At most this many diagnostics are shown. */
export const MAX_DIAGNOSTICS = 50;

export function emptyState(): EditorState {
	return { filePath: null, cursorLine: null, selection: null };
}

/** Applies a `selection_changed` notification; returns false when it carries nothing usable.
 * A relative path (claudecode's `at_mentioned` style) is taken from the editor's first folder. */
export function applySelection(state: EditorState, params: unknown, folder?: string): boolean {
	if (!params || typeof params !== "object") return false;
	const p = params as {
		text?: unknown;
		filePath?: unknown;
		selection?: { start?: { line?: unknown }; end?: { line?: unknown }; isEmpty?: unknown };
	};
	if (typeof p.filePath !== "string" || p.filePath === "" || !p.selection) return false;
	const start = Number(p.selection.start?.line);
	const end = Number(p.selection.end?.line);
	if (!Number.isFinite(start) || !Number.isFinite(end)) return false;
	state.filePath = isAbsolute(p.filePath) || !folder ? p.filePath : join(folder, p.filePath);
	state.cursorLine = start;
	state.selection =
		p.selection.isEmpty === true
			? null
			: { startLine: start, endLine: end, text: typeof p.text === "string" ? p.text : "" };
	return true;
}

/** The `<editor>` block, or null when no file is known. */
export function editorBlock(state: EditorState): string | null {
	if (!state.filePath) return null;
	const out = ["<editor>", `  <file>${state.filePath}</file>`];
	if (state.cursorLine !== null) out.push(`  <cursor>line ${state.cursorLine + 1}</cursor>`);
	if (state.selection) {
		const lines = state.selection.text.split("\n");
		const text =
			lines.length <= MAX_SELECTION_LINES
				? state.selection.text
				: `${lines.slice(0, MAX_SELECTION_LINES).join("\n")}\n... <truncated ${lines.length - MAX_SELECTION_LINES} more lines>`;
		out.push(`  <selection lines="${state.selection.startLine + 1}-${state.selection.endLine + 1}">`);
		out.push(text);
		out.push("  </selection>");
	}
	out.push("</editor>");
	return out.join("\n");
}

type Diag = {
	severity?: unknown;
	message?: unknown;
	range?: { start?: { line?: unknown; character?: unknown } };
};

/** The `<lsp_diagnostics>` block from a `getDiagnostics` result, in either editor's shape
 * (pi-ide.nvim: `{uri: [diag]}`; claudecode: `[{uri, diagnostics: [diag]}]`). Only Errors and
 * Warnings, at most [`MAX_DIAGNOSTICS`]; null when there are none or the result is unreadable. */
export function diagnosticsBlock(result: unknown): string | null {
	const text = (result as { content?: { text?: unknown }[] } | null)?.content?.[0]?.text;
	if (typeof text !== "string") return null;
	let parsed: unknown;
	try {
		parsed = JSON.parse(text);
	} catch {
		return null;
	}
	const entries: [string, Diag[]][] = [];
	if (Array.isArray(parsed)) {
		for (const f of parsed as { uri?: unknown; diagnostics?: unknown }[]) {
			if (f && typeof f.uri === "string" && Array.isArray(f.diagnostics)) entries.push([f.uri, f.diagnostics as Diag[]]);
		}
	} else if (parsed && typeof parsed === "object") {
		for (const [uri, list] of Object.entries(parsed as Record<string, unknown>)) {
			if (Array.isArray(list)) entries.push([uri, list as Diag[]]);
		}
	}
	const lines: string[] = [];
	for (const [uri, list] of entries) {
		for (const d of list) {
			if (lines.length >= MAX_DIAGNOSTICS) break;
			if (d?.severity !== "Error" && d?.severity !== "Warning") continue;
			const line = Number(d.range?.start?.line ?? 0) + 1;
			const col = Number(d.range?.start?.character ?? 0) + 1;
			lines.push(`${uri}:${line}:${col} [${d.severity}] ${String(d.message ?? "")}`);
		}
	}
	if (lines.length === 0) return null;
	return `<lsp_diagnostics>\n${lines.join("\n")}\n</lsp_diagnostics>`;
}

/** The widget text, in pi-ide's words, with the editor's name as the broker reports it. */
export function widgetText(ideName: string, state: EditorState, suggesting: string | null): string {
	let body = ideName;
	if (state.selection && state.filePath) {
		body = `${ideName} · Lines ${state.selection.startLine + 1}-${state.selection.endLine + 1} selected in ${basename(state.filePath)}`;
	} else if (state.filePath) {
		body = `${ideName} · In ${basename(state.filePath)}`;
	}
	if (suggesting) body += ` · Suggesting ${suggesting}`;
	return body;
}
