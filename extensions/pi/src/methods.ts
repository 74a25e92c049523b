// The method names of the broker's socket, spelled once (the broker spells them in
// crates/protocol/src/jsonrpc.rs; test/methods.test.ts holds the two to each other).

/** The broker's own methods on a session. */
export const Broker = {
	EDITORS: "broker/editors",
	ATTACH: "broker/attach",
	DETACH: "broker/detach",
	ATTACHED: "broker/attached",
	DETACHED: "broker/detached",
	NOTICE: "broker/notice",
	EDITOR_STATE: "broker/editor_state",
	FOLLOWERS: "broker/followers",
	READ: "broker/read",
} as const;

/** What a following ACP editor asks of pi, and pi's transcript to it. */
export const Follow = {
	UPDATE: "pi/update",
	HISTORY: "pi/history",
	PROMPT: "pi/prompt",
	CANCEL: "pi/cancel",
} as const;

/** MCP's own methods this client sends. */
export const Mcp = {
	INITIALIZE: "initialize",
	INITIALIZED: "notifications/initialized",
	CANCELLED: "notifications/cancelled",
	TOOLS_CALL: "tools/call",
} as const;

/** What an editor sends or asks (the pi-ide protocol). */
export const Editor = {
	SELECTION_CHANGED: "selection_changed",
	GET_SUGGESTIONS: "getSuggestions",
	LIST_SUGGESTION_MODELS: "listSuggestionModels",
} as const;
