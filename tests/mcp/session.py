"""An MCP session against Rampart, with the official MCP Python SDK (PyPI `mcp`).

Usage: session.py stdio|http. Environment: RAMPART_BIN (for stdio), RAMPART_URL,
RAMPART_API_KEY. Prints `PASS <name>` / `FAIL <name>: <why>` lines and `SUMMARY`; the
sandbox id it made as `SANDBOX <id>` (the Rust test reads the record of it).
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

EXPECTED_TOOLS = {
    "create_sandbox", "list_sandboxes", "kill_sandbox", "run_command", "read_file",
    "write_file", "list_files", "snapshot_sandbox", "fork_sandbox", "get_network_policy",
    "set_network_policy", "get_port_url", "export_audit", "run_code",
}

failures = []


def check(name, ok, why=""):
    if ok:
        print(f"PASS {name}", flush=True)
    else:
        print(f"FAIL {name}: {why}", flush=True)
        failures.append(name)


def text(r):
    return "\n".join(c.text for c in r.content if getattr(c, "type", "") == "text")


async def run(s, transport):
    await s.initialize()
    tools = (await s.list_tools()).tools
    names = {t.name for t in tools}
    check("tools are listed", EXPECTED_TOOLS <= names, f"missing {EXPECTED_TOOLS - names}")
    run_tool = next(t for t in tools if t.name == "run_command")
    props = run_tool.input_schema.get("properties", {}) if hasattr(run_tool, "input_schema") else run_tool.inputSchema.get("properties", {})
    check("run_command has a schema", {"sandbox_id", "command", "cwd", "env", "user", "timeout_secs"} <= set(props), props)
    check("tools are described", all(t.description and len(t.description) > 20 for t in tools))

    r = await s.call_tool("create_sandbox", {"timeout_secs": 300, "metadata": {"via": transport}})
    check("create_sandbox", not r.is_error, text(r))
    sid = json.loads(text(r))["id"]
    print(f"SANDBOX {sid}", flush=True)
    check("create_sandbox hides the port token", "access_token" not in text(r))

    progress = []

    async def on_progress(p, total, message):
        progress.append((p, message))

    r = await s.call_tool(
        "run_command",
        # Output spread over a second: progress is sent at most four times a second.
        {"sandbox_id": sid, "command": "for i in 1 2 3; do echo line $i; sleep 0.4; done; echo oops >&2; exit 3"},
        progress_callback=on_progress,
    )
    out = json.loads(text(r))
    check("run_command runs with bash -lc", not r.is_error and out["stdout"] == "line 1\nline 2\nline 3\n", out)
    check("run_command returns stderr and the exit code", out["stderr"] == "oops\n" and out["exit_code"] == 3, out)
    check("run_command sends progress", len(progress) >= 2, progress)

    r = await s.call_tool("run_command", {"sandbox_id": sid, "command": "head -c 200000 /dev/zero | tr '\\0' x"})
    out = json.loads(text(r))
    check("long output is cut with a note", len(out["stdout"]) < 70000 and "more bytes not shown" in out["stdout"], len(out["stdout"]))

    r = await s.call_tool("run_command", {"sandbox_id": sid, "command": "pwd; whoami", "cwd": "/tmp", "user": "root", "env": {"X": "1"}})
    out = json.loads(text(r))
    check("run_command takes cwd and user", out["stdout"] == "/tmp\nroot\n", out)

    r = await s.call_tool("run_command", {"sandbox_id": sid, "command": "sleep 30", "timeout_secs": 1})
    out = json.loads(text(r))
    check("run_command times out", out.get("timed_out") is True, out)

    r = await s.call_tool("write_file", {"sandbox_id": sid, "path": "/home/user/notes/a.txt", "content": "héllo\n"})
    check("write_file", not r.is_error and json.loads(text(r))["size"] == 7, text(r))
    r = await s.call_tool("read_file", {"sandbox_id": sid, "path": "/home/user/notes/a.txt"})
    check("read_file", not r.is_error and text(r) == "héllo\n", text(r))
    r = await s.call_tool("write_file", {"sandbox_id": sid, "path": "/tmp/b.bin", "content": "AAEC/w==", "base64": True})
    r = await s.call_tool("read_file", {"sandbox_id": sid, "path": "/tmp/b.bin"})
    check("binary files come back as base64", json.loads(text(r))["base64"] == "AAEC/w==", text(r))
    r = await s.call_tool("list_files", {"sandbox_id": sid, "path": "/home/user/notes"})
    check("list_files", not r.is_error and "a.txt" in text(r), text(r))

    r = await s.call_tool("get_network_policy", {"sandbox_id": sid})
    check("get_network_policy", not r.is_error and "mode" in text(r), text(r))
    r = await s.call_tool("set_network_policy", {"sandbox_id": sid, "policy": {"mode": "bogus"}})
    check("a refused policy is a tool error with the reason", r.is_error and "mode" in text(r), text(r))

    r = await s.call_tool("get_port_url", {"sandbox_id": sid, "port": 8080})
    check("get_port_url says nothing listens", r.is_error and "nothing listens on port 8080" in text(r), text(r))
    await s.call_tool("run_command", {"sandbox_id": sid, "command": "nohup python3 -m http.server 8080 >/dev/null 2>&1 & for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/8080) 2>/dev/null && break; sleep 0.1; done"})
    r = await s.call_tool("get_port_url", {"sandbox_id": sid, "port": 8080})
    check("get_port_url", not r.is_error and "/ports/8080" in text(r), text(r))

    r = await s.call_tool("snapshot_sandbox", {"sandbox_id": sid, "name": f"mcp-{transport}-{os.getpid()}"})
    check("snapshot_sandbox", not r.is_error and f"mcp-{transport}-{os.getpid()}" in text(r), text(r))
    r = await s.call_tool("fork_sandbox", {"sandbox_id": sid, "count": 1})
    forks = json.loads(text(r)).get("ids", []) if not r.is_error else []
    check("fork_sandbox", len(forks) == 1, text(r))
    if forks:
        r = await s.call_tool("read_file", {"sandbox_id": forks[0], "path": "/home/user/notes/a.txt"})
        check("the fork has the file", text(r) == "héllo\n", text(r))
        await s.call_tool("kill_sandbox", {"sandbox_id": forks[0]})

    r = await s.call_tool("list_sandboxes", {"metadata": {"via": transport}})
    check("list_sandboxes filters by label", not r.is_error and sid in text(r), text(r))

    r = await s.call_tool("export_audit", {"sandbox_id": sid})
    summary = json.loads(r.content[0].text)
    check("export_audit verifies", not r.is_error and summary["verified"] is True, summary)
    check("export_audit gives the bundle", '"format"' in r.content[1].text)

    # Failing calls are tool errors with the reason, never protocol errors or hangs.
    r = await s.call_tool("run_command", {"sandbox_id": "z0000000000000000000", "command": "true"})
    check("an unknown id is a tool error", r.is_error and "not found" in text(r), text(r))
    r = await s.call_tool("run_command", {"sandbox_id": "../../v1/tenants", "command": "true"})
    check("a malformed id is a tool error", r.is_error and "not a sandbox id" in text(r), text(r))
    r = await s.call_tool("read_file", {"sandbox_id": sid, "path": "/nonexistent/file"})
    check("a missing file is a tool error", r.is_error and "404" in text(r), text(r))
    r = await s.call_tool("run_command", {"sandbox_id": sid, "command": "/does/not/exist"})
    out = json.loads(text(r))
    check("a command that cannot start says so", out["exit_code"] == 127 and "No such file" in out["stderr"], out)
    try:
        r = await s.call_tool("run_command", {"sandbox_id": sid, "command": 42})
        check("wrong argument types are refused", r.is_error, text(r))
    except Exception as e:  # an invalid-params error names the argument
        check("wrong argument types are refused", "command" in str(e) or "invalid" in str(e).lower(), repr(e))
    try:
        r = await s.call_tool("kill_sandbox", {})
        check("missing arguments are refused", r.is_error, text(r))
    except Exception as e:
        check("missing arguments are refused", "sandbox_id" in str(e) or "missing" in str(e).lower(), repr(e))

    # The code interpreter: a stateful kernel, charts as images.
    r = await s.call_tool("run_code", {"sandbox_id": sid, "code": "1 + 1"})
    check("run_code needs the interpreter's template", r.is_error and "code-interpreter-v1" in text(r), text(r))
    if os.environ.get("RAMPART_NO_INTERPRETER"):
        print("SKIP run_code: " + os.environ["RAMPART_NO_INTERPRETER"], flush=True)
    else:
        r = await s.call_tool("create_sandbox", {"template": "code-interpreter-v1", "timeout_secs": 300})
        check("a code-interpreter sandbox", not r.is_error, text(r))
        ci = json.loads(text(r))["id"]
        r = await s.call_tool("run_code", {"sandbox_id": ci, "code": "x = 6 * 7\nprint(x)"})
        check("run_code", not r.is_error and json.loads(text(r))["stdout"] == "42\n", text(r))
        r = await s.call_tool("run_code", {"sandbox_id": ci, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()\nx + 1"})
        images = [c for c in r.content if getattr(c, "type", "") == "image"]
        check("run_code keeps state and returns the chart as an image",
              not r.is_error and json.loads(text(r))["results"][-1] == "43" and images and images[0].mime_type == "image/png",
              [getattr(c, "type", "") for c in r.content])
        r = await s.call_tool("run_code", {"sandbox_id": ci, "code": "1 / 0"})
        check("run_code's exception is a tool error with the traceback", r.is_error and "ZeroDivisionError" in text(r), text(r))
        await s.call_tool("kill_sandbox", {"sandbox_id": ci})

    # Still answering after the errors.
    r = await s.call_tool("run_command", {"sandbox_id": sid, "command": "echo alive"})
    check("the session survives errors", json.loads(text(r))["stdout"] == "alive\n", text(r))
    r = await s.call_tool("kill_sandbox", {"sandbox_id": sid})
    check("kill_sandbox", not r.is_error and "destroyed" in text(r), text(r))


async def main():
    transport = sys.argv[1]
    key = os.environ.get("RAMPART_API_KEY", "")
    if transport == "stdio":
        env = {"PATH": os.environ.get("PATH", "")}
        for k in ("RAMPART_HOST", "RAMPART_API_KEY", "RAMPART_SOCKET"):
            if os.environ.get(k):
                env[k] = os.environ[k]
        p = StdioServerParameters(command=os.environ["RAMPART_BIN"], args=["mcp"], env=env)
        async with stdio_client(p) as (r, w):
            async with ClientSession(r, w) as s:
                await run(s, transport)
    else:
        http = create_mcp_http_client(headers={"Authorization": "Bearer " + key})
        url = os.environ["RAMPART_URL"] + "/mcp"
        async with streamable_http_client(url, http_client=http) as (r, w, *_):
            async with ClientSession(r, w) as s:
                await run(s, transport)
    print(f"SUMMARY {len(failures)} failed", flush=True)


asyncio.run(main())
