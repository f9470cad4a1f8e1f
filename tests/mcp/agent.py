"""An agent framework loads Rampart's MCP tools and calls one, without a model: the OpenAI
Agents SDK's MCP clients (stdio and Streamable HTTP) list the tools and call run_command.

Usage: agent.py. Environment: RAMPART_BIN, RAMPART_URL, RAMPART_API_KEY. Prints PASS/FAIL
lines and SUMMARY.
"""

import asyncio
import json
import os

from agents.mcp import MCPServerStdio, MCPServerStreamableHttp

failures = []


def check(name, ok, why=""):
    print(f"PASS {name}" if ok else f"FAIL {name}: {why}", flush=True)
    if not ok:
        failures.append(name)


async def drive(server, label):
    tools = await server.list_tools()
    check(f"{label}: the agent sees the tools", any(t.name == "run_command" for t in tools), [t.name for t in tools])
    r = await server.call_tool("create_sandbox", {"timeout_secs": 120})
    sid = json.loads(r.content[0].text)["id"]
    r = await server.call_tool("run_command", {"sandbox_id": sid, "command": "echo from-an-agent"})
    out = json.loads(r.content[0].text)
    check(f"{label}: run_command through the agent framework", out["stdout"] == "from-an-agent\n", out)
    await server.call_tool("kill_sandbox", {"sandbox_id": sid})


async def main():
    key = os.environ["RAMPART_API_KEY"]
    env = {"PATH": os.environ.get("PATH", ""), "RAMPART_HOST": os.environ["RAMPART_URL"], "RAMPART_API_KEY": key}
    async with MCPServerStdio(params={"command": os.environ["RAMPART_BIN"], "args": ["mcp"], "env": env}, name="rampart") as s:
        await drive(s, "stdio")
    async with MCPServerStreamableHttp(
        params={"url": os.environ["RAMPART_URL"] + "/mcp", "headers": {"Authorization": "Bearer " + key}},
        name="rampart-http",
    ) as s:
        await drive(s, "http")
    print(f"SUMMARY {len(failures)} failed", flush=True)


asyncio.run(main())
