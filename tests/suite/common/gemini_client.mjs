// A Streamable-HTTP MCP client as Gemini CLI makes it (@modelcontextprotocol/sdk's Client
// with StreamableHTTPClientTransport, bearer token in requestInit), driven line by line:
// stdin takes {"op": "list"|"call"|"close", ...}, stdout gives one JSON record per event.
// argv: <sdk dir> <url> [token]   (token "-" means no Authorization header)
import path from 'node:path';
import readline from 'node:readline';
import { pathToFileURL } from 'node:url';

const [sdkDir, url, token] = process.argv.slice(2);
const load = (p) => import(pathToFileURL(path.join(sdkDir, 'dist', 'esm', p)).href);
const { Client } = await load('client/index.js');
const { StreamableHTTPClientTransport } = await load('client/streamableHttp.js');

const say = (record) => process.stdout.write(JSON.stringify(record) + '\n');

const client = new Client({ name: 'gemini-door-test', version: '0.0.1' });
client.fallbackNotificationHandler = async (n) => say({ ev: 'notification', method: n.method, params: n.params });
client.onerror = (e) => say({ ev: 'transport-error', message: String(e?.message ?? e) });
client.onclose = () => say({ ev: 'closed' });
const headers = token && token !== '-' ? { Authorization: `Bearer ${token}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
try {
  await client.connect(transport);
} catch (e) {
  say({ ev: 'connect-failed', message: String(e?.message ?? e) });
  process.exit(0);
}
say({ ev: 'connected', sessionId: transport.sessionId });

const rl = readline.createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  const cmd = JSON.parse(line);
  try {
    if (cmd.op === 'list') {
      say({ ev: 'result', tag: cmd.tag, result: await client.listTools() });
    } else if (cmd.op === 'call') {
      say({ ev: 'result', tag: cmd.tag, result: await client.callTool({ name: cmd.name, arguments: cmd.args }) });
    } else if (cmd.op === 'close') {
      await transport.terminateSession();
      await client.close();
      break;
    }
  } catch (e) {
    say({ ev: 'error', tag: cmd.tag, message: String(e?.message ?? e) });
  }
}
process.exit(0);
