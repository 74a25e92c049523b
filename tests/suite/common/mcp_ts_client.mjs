// The official MCP TypeScript SDK's client (`@modelcontextprotocol/client` 2.x) as a client
// of `pi-ide-broker mcp`, with `versionNegotiation: {mode: 'auto'}`: it probes
// `server/discover` and takes the 2026-07-28 era when the server answers it, else falls back
// to `initialize`. Prints one JSON line per step for tests/suite/stdio.rs.
//
//   node mcp_ts_client.mjs BROKER_BIN CWD SOCKET   (with node_modules beside it)

import { Client } from "@modelcontextprotocol/client";
import { StdioClientTransport } from "@modelcontextprotocol/client/stdio";

const [broker, cwd, socket] = process.argv.slice(2);
const say = (o) => console.log(JSON.stringify(o));

const transport = new StdioClientTransport({
	command: broker,
	args: ["mcp", "--cwd", cwd, "--no-spawn"],
	env: { ...process.env, PI_IDE_BROKER_SOCKET: socket },
});
const client = new Client({ name: "ts-sdk-test", version: "1.0.0" }, { versionNegotiation: { mode: "auto" } });
await client.connect(transport);
say({ step: "connected", era: client.getProtocolEra(), version: client.getNegotiatedProtocolVersion() });
const tools = await client.listTools();
say({ step: "tools", names: tools.tools.map((t) => t.name) });
const diag = await client.callTool({ name: "getDiagnostics", arguments: {} });
say({ step: "diagnostics", is_error: diag.isError === true, content: diag.content });
await client.close();
