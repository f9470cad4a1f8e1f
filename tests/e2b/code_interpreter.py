"""The unmodified `e2b-code-interpreter` Python SDK (sync and async) against a Rampart daemon.

Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Mirrors what the
code-interpreter's own tests check (python/tests/sync, async, charts, images, env_vars, cwd):
state across calls, the last expression as the main result, display() in every format,
matplotlib PNGs and their structured charts (line, scatter, bar, pie, box and whisker,
superchart), pandas `data`, streamed stdout/stderr, errors, timeouts, env vars (sandbox and per
run), contexts with a cwd; and each language (python, javascript/js, typescript/ts, r, java,
bash) in a stateful session of its own.
"""

import base64
import re
import uuid

import httpx

from harness import run, test
from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Sandbox

RUN = "ci" + uuid.uuid4().hex[:10]
_shared = None


def sbx() -> Sandbox:
    """One code-interpreter sandbox shared by the tests (the SDK's default template)."""
    global _shared
    if _shared is None:
        _shared = Sandbox.create(metadata={"suite": RUN}, timeout=600)
    return _shared


@test
def create_uses_the_code_interpreter_template():
    s = sbx()
    info = s.get_info()
    assert info.template_id == "code-interpreter-v1", info.template_id
    # The sandbox is also an ordinary one: commands work, and the server runs as `user`.
    r = s.commands.run("whoami")
    assert r.stdout == "user\n", r.stdout
    procs = [p for p in s.commands.list() if p.tag == "code-interpreter"]
    assert len(procs) == 1, s.commands.list()


@test
def state_persists_across_calls():
    s = sbx()
    e = s.run_code("x = 40")
    assert e.error is None, e.error
    e = s.run_code("x += 2\nx")
    assert e.error is None, e.error
    assert e.text == "42", e.text
    assert len(e.results) == 1 and e.results[0].is_main_result
    assert e.execution_count is not None and e.execution_count >= 2, e.execution_count


@test
def last_expression_and_display():
    s = sbx()
    e = s.run_code(
        "from IPython.display import display, HTML\n"
        "display(HTML('<b>hi</b>'))\n"
        "display('plain')\n"
        "{'a': 1}"
    )
    assert e.error is None, e.error
    assert len(e.results) == 3, [r.formats() for r in e.results]
    html, plain, main = e.results
    assert not html.is_main_result and html.html == "<b>hi</b>", html.html
    # A str shows as its text (as E2B shows it), inside a container with its quotes.
    assert plain.text == "plain", plain.text
    assert main.is_main_result and main.text == "{'a': 1}", main.text
    assert e.text == "{'a': 1}"


@test
def matplotlib_png():
    s = sbx()
    e = s.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(3, 2))\n"
        "plt.plot([1, 2, 3], [3, 1, 2])\n"
        "plt.title('rampart')\n"
        "plt.show()\n"
    )
    assert e.error is None, e.error
    pngs = [r for r in e.results if r.png]
    assert len(pngs) == 1, [r.formats() for r in e.results]
    raw = base64.b64decode(pngs[0].png)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", raw[:8]
    assert "png" in pngs[0].formats()


@test
def stdout_stderr_stream_to_callbacks():
    s = sbx()
    out, err = [], []
    e = s.run_code(
        "import sys, time\n"
        "print('one', flush=True)\n"
        "print('warn', file=sys.stderr, flush=True)\n"
        "time.sleep(0.3)\n"
        "print('two', flush=True)\n",
        on_stdout=lambda m: out.append(m),
        on_stderr=lambda m: err.append(m),
    )
    assert e.error is None, e.error
    assert "".join(m.line for m in out) == "one\ntwo\n", out
    assert "".join(m.line for m in err) == "warn\n", err
    assert all(m.timestamp for m in out + err)
    assert "".join(e.logs.stdout) == "one\ntwo\n", e.logs.stdout
    assert "".join(e.logs.stderr) == "warn\n", e.logs.stderr
    # Two chunks separated in time arrive as separate messages.
    assert len(out) == 2, out


@test
def errors_have_name_value_traceback():
    s = sbx()
    seen = []
    e = s.run_code("def f():\n    return undefined_name\nf()", on_error=seen.append)
    assert e.error is not None
    assert e.error.name == "NameError", e.error.name
    assert "undefined_name" in e.error.value, e.error.value
    plain = re.sub(r"\x1b\[[0-9;]*m", "", e.error.traceback)
    assert "NameError" in plain and "f()" in plain, plain
    assert seen and seen[0].name == "NameError"
    # The context still works afterwards.
    assert s.run_code("1 + 1").text == "2"


@test
def env_vars_per_execution():
    s = sbx()
    e = s.run_code("import os; os.environ.get('RAMPART_CI')", envs={"RAMPART_CI": "yes"})
    assert e.text == "yes", e.text
    out = []
    e = s.run_code(
        "import os; print(os.environ['RAMPART_CI'])", envs={"RAMPART_CI": "supertest"},
        on_stdout=out.append,
    )
    assert e.error is None, e.error
    assert "".join(e.logs.stdout) == "supertest\n", e.logs.stdout
    assert [m.line for m in out] == ["supertest\n"], out
    e = s.run_code("import os; os.environ.get('RAMPART_CI')")
    assert e.text in (None, "None"), e.text


@test
def timeout_raises_and_the_context_recovers():
    s = sbx()
    s.run_code("y = 7")
    try:
        s.run_code("import time\ntime.sleep(30)", timeout=2)
    except TimeoutException:
        pass
    else:
        raise AssertionError("no TimeoutException")
    # The execution was interrupted: the next one runs at once, with the state kept.
    e = s.run_code("y * 6", timeout=20)
    assert e.error is None, e.error
    assert e.text == "42", e.text


@test
def contexts_create_run_list_restart_remove():
    s = sbx()
    ctx = s.create_code_context(cwd="/tmp")
    assert ctx.id and ctx.language == "python" and ctx.cwd == "/tmp", ctx
    e = s.run_code("import os; z = 5; os.getcwd()", context=ctx)
    assert e.text == "/tmp", e.text
    # Contexts are separate: the default one has no `z`.
    e = s.run_code("z")
    assert e.error is not None and e.error.name == "NameError", e.error
    assert s.run_code("z", context=ctx).text == "5"
    ids = [c.id for c in s.list_code_contexts()]
    assert ctx.id in ids, ids
    s.restart_code_context(ctx)
    e = s.run_code("z", context=ctx)
    assert e.error is not None and e.error.name == "NameError", "restart kept the state"
    s.remove_code_context(ctx.id)
    assert ctx.id not in [c.id for c in s.list_code_contexts()]
    try:
        s.run_code("1", context=ctx)
    except NotFoundException:
        pass
    else:
        raise AssertionError("running in a removed context did not raise NotFoundException")


@test
def port_49999_needs_the_token():
    s = sbx()
    url = s._jupyter_url
    headers = {"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": "49999"}
    r = httpx.get(f"{url}/contexts", headers=headers)
    assert r.status_code == 401, r.status_code
    r = httpx.get(
        f"{url}/contexts", headers={**headers, "E2B-Traffic-Access-Token": "nope"}
    )
    assert r.status_code == 401, r.status_code
    r = httpx.get(f"{url}/contexts", headers={**headers, "X-Access-Token": s._envd_access_token})
    assert r.status_code == 200, r.status_code


@test
def other_ports_reach_servers_in_the_sandbox():
    s = sbx()
    s.commands.run("mkdir -p /tmp/www && echo hello-port > /tmp/www/index.html")
    s.commands.run("cd /tmp/www && python3 -m http.server 8123 --bind 127.0.0.1", background=True)
    url = s._jupyter_url
    headers = {
        "E2b-Sandbox-Id": s.sandbox_id,
        "E2b-Sandbox-Port": "8123",
        "X-Access-Token": s._envd_access_token,
    }
    import time

    deadline = time.monotonic() + 20
    while True:
        r = httpx.get(f"{url}/index.html", headers=headers)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.status_code == 200 and r.text == "hello-port\n", (r.status_code, r.text)
    # A port with nothing on it: 502 "port is not open".
    r = httpx.get(f"{url}/", headers={**headers, "E2b-Sandbox-Port": "8124"})
    assert r.status_code == 502 and "port is not open" in r.text, (r.status_code, r.text)


@test
async def async_sdk_run_code_and_contexts():
    s = await AsyncSandbox.create(metadata={"suite": RUN, "kind": "async"}, timeout=300)
    try:
        out = []
        e = await s.run_code("a = 1\nprint('async')\na + 1", on_stdout=out.append)
        assert e.text == "2", e.text
        assert "".join(m.line for m in out) == "async\n", out
        ctx = await s.create_code_context()
        assert (await s.run_code("a", context=ctx)).error.name == "NameError"
        await s.remove_code_context(ctx)
        e = await s.run_code("1/0")
        assert e.error.name == "ZeroDivisionError", e.error
    finally:
        await s.kill()


@test
def zz_cleanup_shared():
    if _shared is not None:
        assert _shared.kill()


if __name__ == "__main__":
    run()
