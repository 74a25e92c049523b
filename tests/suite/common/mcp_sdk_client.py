"""The official MCP Python SDK (2.x) as a client of `pi-ide-broker mcp`, in its default
`mode="auto"`: it probes `server/discover` at 2026-07-28 and adopts the modern era when the
server answers, else falls back to `initialize`. Prints one JSON line per step for the Rust
test (tests/suite/stdio.rs) to check.

    python mcp_sdk_client.py BROKER_BIN CWD SOCKET
"""

import asyncio
import json
import os
import sys

from mcp import Client
from mcp.client.stdio import StdioServerParameters


def say(**kw):
    print(json.dumps(kw, default=str), flush=True)


async def main(broker, cwd, socket):
    env = dict(os.environ, PI_IDE_BROKER_SOCKET=socket)
    params = StdioServerParameters(command=broker, args=["mcp", "--cwd", cwd, "--no-spawn"], env=env)
    async with Client(params, raise_exceptions=True) as client:
        session = client.session
        say(
            step="connected",
            protocol=client.protocol_version,
            discovered=getattr(session, "discover_result", None) is not None,
            initialized=getattr(session, "initialize_result", None) is not None,
            server=client.server_info.name if client.server_info else None,
        )
        tools = await client.list_tools()
        say(step="tools", names=[t.name for t in tools.tools])
        diag = await client.call_tool("getDiagnostics", {})
        say(step="diagnostics", is_error=bool(diag.is_error), content=[c.model_dump() for c in diag.content])
        ctx = await client.call_tool("editor_context", {})
        say(step="context", text=ctx.content[0].text if ctx.content else "")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
