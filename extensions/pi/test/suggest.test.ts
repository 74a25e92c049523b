import assert from "node:assert/strict";
import { test } from "node:test";
import { parseSuggestions, splitModel, suggestionCount, suggestionPrompt } from "../src/suggest.ts";

test("suggestion blocks are read, trimmed, deduplicated and capped", () => {
	const p = { cursorBefore: "fn main() {\n", cursorAfter: "}\n", suggestionCount: 2 };
	const answer = "<SUGGESTION>\n  println!(1);\n</SUGGESTION><SUGGESTION>  println!(1);</SUGGESTION><SUGGESTION>x()</SUGGESTION><SUGGESTION>y()</SUGGESTION>";
	assert.deepEqual(parseSuggestions(answer, p), ["  println!(1);", "x()"]);
	assert.deepEqual(parseSuggestions("no blocks", p), []);
	assert.deepEqual(parseSuggestions("<SUGGESTION>cut off", p), ["cut off"]);
});

test("a repeated cursor-line prefix is dropped and only the line is kept", () => {
	const p = { cursorBefore: "let x = foo", cursorAfter: "" };
	assert.deepEqual(parseSuggestions("<SUGGESTION>let x = foo(1);\nmore</SUGGESTION>", p), ["(1);"]);
});

test("counts are clamped and prompts carry the cursor", () => {
	assert.equal(suggestionCount({}), 3);
	assert.equal(suggestionCount({ suggestionCount: 9 }), 3);
	assert.equal(suggestionCount({ suggestionCount: -1 }), 0);
	const prompt = suggestionPrompt({ filePath: "/a.ts", cursorBefore: "const a = ", cursorAfter: ";", outline: "fn a" });
	assert.ok(prompt.includes("const a = <CURSOR>;"));
	assert.ok(prompt.includes("fn a"));
	assert.ok(suggestionPrompt({ cursorInComment: true, cursorBefore: "// expl" }).includes("// expl<CURSOR>"));
	assert.deepEqual(splitModel("openai/gpt-4o"), { provider: "openai", id: "gpt-4o" });
	assert.throws(() => splitModel("gpt-4o"), /provider\/id/);
});
