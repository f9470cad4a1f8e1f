"""The unmodified `e2b` Python SDK (async API, AsyncSandbox) against a Rampart daemon.

Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL.
"""

import asyncio
import uuid

import httpx

from harness import await_for, run, test
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    NotFoundException,
    PtySize,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

from e2b.exceptions import SandboxNotRunningException

RUN = "a" + uuid.uuid4().hex[:10]


@test
async def async_lifecycle():
    s = await AsyncSandbox.create(timeout=120, metadata={"suite": RUN}, envs={"E": "v"})
    try:
        info = await s.get_info()
        assert info.metadata["suite"] == RUN
        assert (await s.commands.run("echo $E")).stdout == "v\n"
        p = AsyncSandbox.list(query=SandboxQuery(metadata={"suite": RUN}, state=[SandboxState.RUNNING]))
        items = await p.next_items()
        assert [i.sandbox_id for i in items] == [s.sandbox_id]
        await s.set_timeout(300)
        c = await AsyncSandbox.connect(s.sandbox_id)
        assert await c.is_running()
        m = await await_for(s.get_metrics, what="metrics")
        assert m[0].mem_total > 0
    finally:
        assert await s.kill() is True
    assert not await s.is_running()
    assert await AsyncSandbox.kill(s.sandbox_id) is False


@test
async def async_auto_resume_idempotency_and_kill():
    key = "ak-" + uuid.uuid4().hex
    s = await AsyncSandbox.create(timeout=120, metadata={"suite": RUN, "kind": "auto"},
                                  lifecycle={"on_timeout": "pause", "auto_resume": True},
                                  idempotency_key=key)
    try:
        again = await AsyncSandbox.create(timeout=120, metadata={"suite": RUN, "kind": "auto"},
                                          lifecycle={"on_timeout": "pause", "auto_resume": True},
                                          idempotency_key=key)
        assert again.sandbox_id == s.sandbox_id
        await s.files.write("/tmp/x", "before pause")
        assert await s.pause() is True
        assert (await s.get_info()).state == SandboxState.PAUSED
        assert await s.files.read("/tmp/x") == "before pause"
        assert (await s.get_info()).state == SandboxState.RUNNING
        # A command of a sandbox killed while it runs: envd's "killed" exception.
        h = await s.commands.run("sleep 30", background=True)
        await AsyncSandbox.kill(s.sandbox_id)
        try:
            await h.wait()
        except SandboxNotRunningException as e:
            assert "killed or reached its end of life" in str(e), e
        else:
            raise AssertionError("the command outlived its sandbox")
    finally:
        await s.kill()


@test
async def async_pause_to_the_filesystem_and_reboot():
    s = await AsyncSandbox.create(timeout=120, metadata={"suite": RUN, "kind": "fs"})
    try:
        await s.files.write("/home/user/fs.txt", "on disk")
        await s.commands.run("sleep 4343", background=True)
        running = "pgrep -f '^sleep 4343$' || true"

        # A background command runs in `bash -l -c` until bash execs it: wait for the sleep.
        async def started(sbx):
            return (await sbx.commands.run(running)).stdout.strip() != ""

        await await_for(lambda: started(s), what="the background sleep")
        assert await s.pause(mode="filesystem") is True
        assert (await s.get_info()).state == SandboxState.PAUSED
        c = await AsyncSandbox.connect(s.sandbox_id)
        assert await c.files.read("/home/user/fs.txt") == "on disk"
        assert (await c.commands.run(running)).stdout.strip() == ""
        await c.commands.run("sleep 4343", background=True)
        await await_for(lambda: started(c), what="the background sleep again")
        assert await c.pause() is True
        r = await AsyncSandbox.connect(s.sandbox_id, on_resume="reboot")
        assert (await r.commands.run(running)).stdout.strip() == ""
        assert await r.files.read("/home/user/fs.txt") == "on disk"
    finally:
        await s.kill()


@test
async def async_commands():
    s = await AsyncSandbox.create(metadata={"suite": RUN}, timeout=120)
    try:
        r = await s.commands.run("echo out; echo err >&2")
        assert r.stdout == "out\n" and r.stderr == "err\n"
        try:
            await s.commands.run("exit 7")
        except CommandExitException as e:
            assert e.exit_code == 7
        else:
            raise AssertionError("no CommandExitException")
        try:
            await s.commands.run("sleep 10", timeout=2)
        except TimeoutException:
            pass
        else:
            raise AssertionError("no TimeoutException")
        r = await s.commands.run(r"printf '\xff\xfeok'")
        assert "\ufffd" in r.stdout
        chunks = []
        h = await s.commands.run("cat", background=True, stdin=True, on_stdout=chunks.append)
        await s.commands.send_stdin(h.pid, "ping\n")
        await await_for(lambda: _true("".join(chunks) == "ping\n"), what="stdin echo")
        await s.commands.close_stdin(h.pid)
        r = await h.wait()
        assert r.exit_code == 0 and r.stdout == "ping\n"
        bg = await s.commands.run("sleep 30", background=True)
        assert bg.pid in [p.pid for p in await s.commands.list()]
        assert await s.commands.kill(bg.pid) is True
        assert await s.commands.kill(999999) is False
        try:
            await s.commands.connect(999999)
        except NotFoundException:
            pass
        else:
            raise AssertionError("connect to an unknown pid succeeded")
    finally:
        await s.kill()


async def _true(v):
    return v


@test
async def async_pty():
    s = await AsyncSandbox.create(metadata={"suite": RUN}, timeout=120)
    try:
        data = bytearray()
        h = await s.pty.create(PtySize(rows=24, cols=80), on_data=data.extend)
        await s.pty.send_stdin(h.pid, b"tput cols\n")
        await await_for(lambda: _true(b"80" in data), what="tput cols = 80")
        await s.pty.resize(h.pid, PtySize(rows=24, cols=120))
        await s.pty.send_stdin(h.pid, b"tput cols; exit\n")
        r = await h.wait()
        assert r.exit_code == 0
        assert b"120" in data, bytes(data)
    finally:
        await s.kill()


@test
async def async_files_and_watch():
    s = await AsyncSandbox.create(metadata={"suite": RUN}, timeout=120)
    try:
        await s.files.make_dir("aw")
        events = []
        h = await s.files.watch_dir("aw", on_event=events.append, recursive=True)
        await s.files.write("aw/f.txt", "content")
        await await_for(
            lambda: _true(any(e.name == "f.txt" and e.type == FilesystemEventType.WRITE for e in events)),
            what=f"watch events (have {events})",
        )
        await h.stop()
        assert await s.files.read("aw/f.txt") == "content"
        await s.files.write("aw/g.bin", b"\x00\x01", gzip=True)
        assert await s.files.read("aw/g.bin", format="bytes") == b"\x00\x01"
        ents = [e.name for e in await s.files.list("aw")]
        assert ents == ["f.txt", "g.bin"], ents
        assert await s.files.exists("aw/f.txt")
        await s.files.rename("aw/f.txt", "aw/h.txt")
        await s.files.remove("aw/g.bin")
        assert [e.name for e in await s.files.list("aw")] == ["h.txt"]
        try:
            await s.files.read("aw/none")
        except FileNotFoundException:
            pass
        else:
            raise AssertionError("no FileNotFoundException")
        async with httpx.AsyncClient() as c:
            r = await c.get(s.download_url("aw/h.txt"))
            assert r.status_code == 200 and r.text == "content"
    finally:
        await s.kill()


if __name__ == "__main__":
    run()
