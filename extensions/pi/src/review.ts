// A write or edit reviewed where a reviewer is: a following ACP editor whose turn is open
// (the broker sends it the diff), else the attached editor. The verdict is pi's `tool_call`
// answer: `{block, reason}` unless the change was accepted (then the input carries the text
// the user accepted).

import { readFile } from "node:fs/promises";
import { LinkLost, RequestAborted } from "./broker.ts";
import { applyEdits, parseDiffResult, tabName, toolPath, type Edit } from "./diff.ts";

/** What a review needs of the session. */
export type ReviewDeps = {
	/** The link to the broker (`null`: not connected). */
	link: { attached: unknown; callTool(name: string, args: Record<string, unknown>, timeoutMs?: number, signal?: AbortSignal): Promise<unknown> } | null;
	/** The attached editor reviews diffs (its link is up and it offers `openDiff`). */
	editorReviews: boolean;
	/** A following ACP editor's turn is open: it reviews. */
	followerReviews: boolean;
	/** Waits a moment for the editor to be attached again (a broker restart); whether it is. */
	attachedWithin: () => Promise<boolean>;
	/** Tells the user something went wrong. */
	notify: (text: string) => void;
};

/** pi's answer to a blocked tool call. */
export type Blocked = { block: true; reason: string };

/** Reviews pi's `write` or `edit` (`event`) where a reviewer is; `undefined` lets it run. */
export async function reviewWrite(
	deps: ReviewDeps,
	event: { toolCallId: string; toolName: string; input: unknown },
	cwd: string,
	signal: AbortSignal | undefined,
): Promise<Blocked | undefined> {
	if (event.toolName !== "write" && event.toolName !== "edit") return;
	if (!deps.editorReviews && !deps.followerReviews) return;
	const l = deps.link;
	if (!l) return;
	if (!l.attached && !deps.followerReviews && !(await deps.attachedWithin())) {
		return {
			block: true,
			reason: `The editor is not reachable right now (pi-ide-broker is reconnecting), so this ${event.toolName} was not reviewed and the file was NOT changed. Try the ${event.toolName} again in a moment.`,
		};
	}
	const input = event.input as { path: string; content?: string; edits?: Edit[] };
	const path = toolPath(cwd, input.path);
	let original: string;
	let proposed: string;
	if (event.toolName === "write") {
		original = await readFile(path, "utf8").catch(() => "");
		proposed = String(input.content ?? "");
	} else {
		try {
			original = await readFile(path, "utf8");
		} catch {
			return; // pi's edit tool reports the missing file itself
		}
		try {
			proposed = applyEdits(original, input.edits ?? []);
		} catch {
			return; // pi's edit tool fails with the same reason; nothing to review
		}
	}
	const tab = tabName(event.toolName, event.toolCallId);
	let result: unknown;
	try {
		const args = { old_file_path: path, new_file_path: path, new_file_contents: proposed, tab_name: tab };
		result = await l.callTool("openDiff", args, undefined, signal);
	} catch (err) {
		// pi stopped the turn (Esc, a follower's cancel) while the diff waited: the review is
		// taken back (the broker closes it where it was shown) and the turn can end.
		if (err instanceof RequestAborted) {
			return { block: true, reason: `pi stopped before the ${event.toolName} of ${input.path} was reviewed; the file was NOT changed.` };
		}
		const why = err instanceof LinkLost ? "the connection to the editor was lost" : err instanceof Error ? err.message : String(err);
		deps.notify(`IDE diff failed: ${why}`);
		return {
			block: true,
			reason: `The ${event.toolName} of ${input.path} could not be reviewed in the editor (${why}); the file was NOT changed. Try again once the editor is back, or ask the user.`,
		};
	}
	void l.callTool("close_tab", { tab_name: tab }).catch(() => {});
	const verdict = parseDiffResult(result);
	if (verdict.kind === "undelivered") {
		deps.notify(`IDE diff failed: ${verdict.why}`);
		return {
			block: true,
			reason: `The ${event.toolName} of ${input.path} could not be reviewed in the editor (${verdict.why}); the file was NOT changed. Try again once the editor is back, or ask the user.`,
		};
	}
	if (verdict.kind === "rejected") return { block: true, reason: `The user rejected the ${event.toolName} of ${input.path} in the editor (${verdict.why}).` };
	if (event.toolName === "write") input.content = verdict.text;
	else input.edits = [{ oldText: original, newText: verdict.text }];
	return undefined;
}
