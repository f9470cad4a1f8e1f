"""An older release of the unmodified SDKs (`e2b==2.45.1`, `e2b-code-interpreter==2.9.1`,
pinned in scripts/e2b-sdks.sh) against Rampart: programs not yet moved to the current SDK
call the older routes (`POST /sandboxes`, `POST /sandboxes/{id}/connect`, the old resume)
and must keep working. Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL.
"""

import uuid

from e2b import Sandbox, SandboxQuery, SandboxState
from e2b_code_interpreter import Sandbox as CodeInterpreter

from harness import run, test, wait_for

RUN = "old" + uuid.uuid4().hex[:8]


@test
def old_create_commands_files_list_kill():
    s = Sandbox.create(timeout=120, metadata={"suite": RUN}, envs={"OLD": "sdk 2.45"})
    try:
        assert s.commands.run("echo $OLD; whoami").stdout == "sdk 2.45\nuser\n"
        s.files.write("/home/user/old.txt", "from the old sdk")
        assert s.files.read("/home/user/old.txt") == "from the old sdk"
        assert [e.name for e in s.files.list("/home/user") if e.name == "old.txt"] == ["old.txt"]
        info = s.get_info()
        assert info.metadata["suite"] == RUN and info.state == SandboxState.RUNNING, info
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": RUN})).next_items()
        assert [i.sandbox_id for i in listed] == [s.sandbox_id], listed
        s.set_timeout(200)
        h = s.commands.run("sleep 60", background=True)
        assert h.pid in [p.pid for p in s.commands.list()]
        h.kill()
    finally:
        assert s.kill() is True
    assert not s.is_running()


@test
def old_pause_and_connect():
    s = Sandbox.create(timeout=120, metadata={"suite": RUN, "kind": "pause"})
    try:
        s.files.write("/tmp/kept", "kept")
        assert s.beta_pause() is not False
        wait_for(lambda: s.get_info().state == SandboxState.PAUSED, what="paused")
        assert not s.is_running()
        c = Sandbox.connect(s.sandbox_id)
        assert c.is_running()
        assert c.files.read("/tmp/kept") == "kept"
    finally:
        s.kill()


@test
def old_code_interpreter():
    s = CodeInterpreter.create(timeout=180)
    try:
        ex = s.run_code("x = 20\nx + 1")
        assert ex.text == "21", ex
        ex = s.run_code("x * 2")
        assert ex.text == "40", ex
        ex = s.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        assert ex.results and ex.results[0].data == {"a": [1, 2]}, ex.results
        out = []
        s.run_code("print('streamed')", on_stdout=lambda m: out.append(m.line))
        assert out == ["streamed\n"], out
        ctx = s.create_code_context(language="bash")
        ex = s.run_code("echo from-bash", context=ctx)
        assert "from-bash" in "".join(ex.logs.stdout), ex
    finally:
        s.kill()


if __name__ == "__main__":
    run()
