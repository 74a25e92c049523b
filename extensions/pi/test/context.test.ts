import assert from "node:assert/strict";
import { test } from "node:test";
import { applySelection, diagnosticsBlock, editorBlock, emptyState, MAX_DIAGNOSTICS, widgetText } from "../src/context.ts";

const sel = (text: string, start: number, end: number, isEmpty: boolean, filePath = "/p/src/main.rs") => ({
	text,
	filePath,
	selection: { start: { line: start, character: 0 }, end: { line: end, character: 3 }, isEmpty },
});

test("the editor block names file, 1-based cursor and selection lines", () => {
	const s = emptyState();
	assert.equal(editorBlock(s), null);
	assert.ok(applySelection(s, sel("", 4, 4, true)));
	assert.equal(editorBlock(s), "<editor>\n  <file>/p/src/main.rs</file>\n  <cursor>line 5</cursor>\n</editor>");
	assert.ok(applySelection(s, sel("fn a()\nfn b()", 9, 10, false)));
	assert.equal(
		editorBlock(s),
		'<editor>\n  <file>/p/src/main.rs</file>\n  <cursor>line 10</cursor>\n  <selection lines="10-11">\nfn a()\nfn b()\n  </selection>\n</editor>',
	);
});

test("a selection over 100 lines is cut with a count of the rest", () => {
	const s = emptyState();
	const text = Array.from({ length: 130 }, (_, i) => `line ${i}`).join("\n");
	applySelection(s, sel(text, 0, 129, false));
	const block = editorBlock(s) ?? "";
	assert.ok(block.includes("line 99\n... <truncated 30 more lines>"), block);
	assert.ok(!block.includes("line 100\n"));
});

test("garbage selections are ignored and relative paths are based on the editor folder", () => {
	const s = emptyState();
	assert.equal(applySelection(s, null), false);
	assert.equal(applySelection(s, { filePath: 3 }), false);
	assert.equal(applySelection(s, { filePath: "/x", selection: { start: {}, end: {} } }), false);
	assert.equal(s.filePath, null);
	assert.ok(applySelection(s, sel("", 0, 0, true, "src/lib.rs"), "/proj"));
	assert.equal(s.filePath, "/proj/src/lib.rs");
});

const diag = (severity: string, line: number, message: string) => ({
	severity,
	message,
	range: { start: { line, character: 2 }, end: { line, character: 5 } },
});

test("diagnostics: both editor shapes, errors and warnings only", () => {
	const map = { "file:///a.lua": [diag("Error", 0, "boom"), diag("Hint", 1, "meh"), diag("Warning", 3, "hm")] };
	const piShape = diagnosticsBlock({ content: [{ type: "text", text: JSON.stringify(map) }] });
	assert.equal(piShape, "<lsp_diagnostics>\nfile:///a.lua:1:3 [Error] boom\nfile:///a.lua:4:3 [Warning] hm\n</lsp_diagnostics>");
	const arr = [{ uri: "file:///a.lua", diagnostics: map["file:///a.lua"] }];
	assert.equal(diagnosticsBlock({ content: [{ type: "text", text: JSON.stringify(arr) }] }), piShape);
});

test("diagnostics: capped, and nothing for empty or unreadable results", () => {
	const many = { "file:///b": Array.from({ length: 80 }, (_, i) => diag("Error", i, `e${i}`)) };
	const block = diagnosticsBlock({ content: [{ text: JSON.stringify(many) }] }) ?? "";
	assert.equal(block.split("\n").length, MAX_DIAGNOSTICS + 2);
	assert.equal(diagnosticsBlock({ content: [{ text: "{}" }] }), null);
	assert.equal(diagnosticsBlock({ content: [{ text: "not json" }] }), null);
	assert.equal(diagnosticsBlock(null), null);
	assert.equal(diagnosticsBlock({ content: [{ text: JSON.stringify({ "file:///c": [diag("Hint", 0, "x")] }) }] }), null);
});

test("widget texts follow pi-ide", () => {
	const s = emptyState();
	assert.equal(widgetText("Neovim", s, null), "Neovim");
	applySelection(s, sel("", 0, 0, true));
	assert.equal(widgetText("Neovim", s, null), "Neovim · In main.rs");
	applySelection(s, sel("x", 2, 4, false));
	assert.equal(widgetText("Neovim", s, "⠋"), "Neovim · Lines 3-5 selected in main.rs · Suggesting ⠋");
});
