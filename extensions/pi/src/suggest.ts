// Inline suggestions for the editor (`getSuggestions`, `listSuggestionModels`): the prompt,
// the model choice, and reading `<SUGGESTION>` blocks out of the answer.

/** `getSuggestions` params, as pi-ide.nvim sends them (all optional). */
export type SuggestionParams = {
	filePath?: string;
	language?: string;
	outline?: string;
	enclosingScope?: string;
	cursorBefore?: string;
	cursorAfter?: string;
	suggestionCount?: number;
	cursorInComment?: boolean;
	model?: string;
};

/** The system prompt of the completion call. */
export const SUGGESTION_SYSTEM_PROMPT = `You complete code at a cursor. Answer with up to N alternatives, most likely first, each inside its own <SUGGESTION>...</SUGGESTION> block and nothing else.
- Write only the text to insert at <CURSOR>; never repeat what is before or after it.
- Follow the file's indentation, naming and style.
- Inside a comment, continue that comment line only (no new comment marker).
- On an empty line right after a comment that describes code, write that code.
- After code on the same line, finish only the current statement; mid-token, finish the token.
- With one strong answer, give one block; with none, give no block.`;

/** How many suggestions to return: the editor's count clamped to 0..3 (default 3). */
export function suggestionCount(params: SuggestionParams): number {
	const n = Number(params.suggestionCount ?? 3);
	return Number.isFinite(n) ? Math.max(0, Math.min(3, Math.trunc(n))) : 3;
}

/** The user message of the completion call. */
export function suggestionPrompt(params: SuggestionParams): string {
	const lines = [`File: ${params.filePath ?? "<unknown>"}`, `Language: ${params.language ?? "<unknown>"}`, ""];
	const before = params.cursorBefore ?? "";
	const after = params.cursorAfter ?? "";
	if (params.cursorInComment) {
		lines.push("The cursor is inside a comment: continue that comment line only, with prose, not code.");
		lines.push("", "<cursor_context>", `${tail(before, 8)}<CURSOR>${head(after, 4)}`, "</cursor_context>");
	} else {
		lines.push("<file_outline>", params.outline?.trim() || "(none)", "</file_outline>", "");
		lines.push("<enclosing_scope>", params.enclosingScope?.trim() || "(none)", "</enclosing_scope>", "");
		lines.push("<cursor_context>", `${before}<CURSOR>${after}`, "</cursor_context>");
	}
	lines.push("", `Give at most ${suggestionCount(params)} suggestions.`);
	return lines.join("\n");
}

function tail(text: string, n: number): string {
	return text.split("\n").slice(-n).join("\n");
}

function head(text: string, n: number): string {
	return text.split("\n").slice(0, n).join("\n");
}

/** The suggestions in a model answer: each `<SUGGESTION>` block (an unclosed last block
 * counts: the answer may have hit its token limit), trimmed of blank edge lines, with the text
 * already on the cursor line removed when the model repeated it, deduplicated, capped. */
export function parseSuggestions(answer: string, params: SuggestionParams): string[] {
	const blocks: string[] = [];
	const re = /<SUGGESTION>([\s\S]*?)(?:<\/SUGGESTION>|$)/g;
	for (let m = re.exec(answer); m !== null; m = re.exec(answer)) {
		blocks.push(m[1]);
		if (m[0].length === 0) re.lastIndex++;
	}
	const before = params.cursorBefore ?? "";
	const linePrefix = before.slice(before.lastIndexOf("\n") + 1);
	const out: string[] = [];
	for (let b of blocks) {
		b = b.replace(/\r\n/g, "\n").replace(/^\n+/, "").replace(/\s+$/, "");
		if (linePrefix.trim() !== "" && b.startsWith(linePrefix)) b = b.slice(linePrefix.length);
		if (params.cursorInComment || linePrefix.trim() !== "") b = b.split("\n")[0] ?? "";
		if (b.trim() === "" || out.includes(b)) continue;
		out.push(b);
	}
	return out.slice(0, suggestionCount(params));
}

/** `provider/id` split, or an error naming the expected shape. */
export function splitModel(spec: string): { provider: string; id: string } {
	const at = spec.indexOf("/");
	if (at <= 0 || at === spec.length - 1) throw new Error(`a suggestion model is "provider/id", got "${spec}"`);
	return { provider: spec.slice(0, at), id: spec.slice(at + 1) };
}
