"""The unmodified `e2b` Python SDK (sync API) against a Rampart daemon.

Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL. Mirrors what the SDK's own
test suite checks (tests/sync/sandbox_sync/*, tests/sync/api_sync/*).
"""

import gzip as gz
import io
import os
import time
import uuid

import httpx

from harness import run, test, wait_for
from e2b import (
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    NotFoundException,
    PtySize,
    Sandbox,
    SandboxException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b.exceptions import SandboxNotFoundException, SandboxNotRunningException

RUN = "t" + uuid.uuid4().hex[:10]
_shared = None


def sbx() -> Sandbox:
    """One sandbox shared by the command/file/PTY tests."""
    global _shared
    if _shared is None:
        _shared = Sandbox.create(metadata={"suite": RUN, "kind": "shared"}, timeout=600)
    return _shared


# --- lifecycle -------------------------------------------------------------------------


@test
def create_with_metadata_env_and_timeout():
    s = Sandbox.create(
        "base", timeout=120, metadata={"suite": RUN, "who": "create"}, envs={"FOO": "bar baz"}
    )
    try:
        assert s.sandbox_id
        info = s.get_info()
        assert info.sandbox_id == s.sandbox_id
        assert info.metadata["who"] == "create", info.metadata
        assert info.state == SandboxState.RUNNING
        left = (info.end_at - info.started_at).total_seconds()
        assert 100 <= left <= 140, left
        r = s.commands.run("echo $FOO")
        assert r.stdout == "bar baz\n", r.stdout
        assert s.is_running()
    finally:
        assert s.kill() is True
    assert not s.is_running()
    assert Sandbox.kill(s.sandbox_id) is False


@test
def kill_unknown_returns_false():
    assert Sandbox.kill("nosuchsandbox0000000") is False


@test
def get_info_unknown_raises_not_found():
    try:
        Sandbox.get_info("nosuchsandbox0000000")
    except SandboxNotFoundException:
        return
    raise AssertionError("no SandboxNotFoundException")


@test
def list_filters_and_paging():
    tag = RUN + "-list"
    made = [Sandbox.create(metadata={"suite": tag, "n": str(i)}, timeout=120) for i in range(3)]
    try:
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}))
        items = p.next_items()
        assert not p.has_next
        ids = [i.sandbox_id for i in items]
        # Newest first by default.
        assert ids == [m.sandbox_id for m in reversed(made)], (ids, [m.sandbox_id for m in made])
        # Paging with limit=1.
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=1)
        seen = []
        while p.has_next:
            page = p.next_items()
            assert len(page) <= 1
            seen += [i.sandbox_id for i in page]
        assert sorted(seen) == sorted(ids), seen
        # State filter.
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING]))
        assert len(p.next_items()) == 3
        # Metadata with characters that need escaping.
        odd = Sandbox.create(metadata={"suite": tag, "a b": "c&d=e"}, timeout=60)
        made.append(odd)
        p = Sandbox.list(query=SandboxQuery(metadata={"a b": "c&d=e"}))
        assert [i.sandbox_id for i in p.next_items()] == [odd.sandbox_id]
        # A killed sandbox is not listed.
        made[0].kill()
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING]))
        got = [i.sandbox_id for i in p.next_items()]
        assert made[0].sandbox_id not in got and len(got) == 3, got
    finally:
        for m in made:
            m.kill()


@test
def set_timeout_then_expiry():
    s = Sandbox.create(metadata={"suite": RUN}, timeout=60)
    try:
        s.set_timeout(3)
        wait_for(lambda: not s.is_running(), timeout=30, what="the sandbox to expire")
        assert Sandbox.kill(s.sandbox_id) is False
    finally:
        s.kill()


@test
def connect_extends_never_shortens():
    s = Sandbox.create(metadata={"suite": RUN}, timeout=300)
    try:
        end = s.get_info().end_at
        c = Sandbox.connect(s.sandbox_id, timeout=10)
        assert c.sandbox_id == s.sandbox_id
        assert c.get_info().end_at >= end
        r = c.commands.run("echo hi")
        assert r.stdout == "hi\n"
        c2 = Sandbox.connect(s.sandbox_id, timeout=1200)
        assert c2.get_info().end_at > end
    finally:
        s.kill()
    try:
        Sandbox.connect(s.sandbox_id)
    except SandboxNotFoundException:
        pass
    else:
        raise AssertionError("connect to a killed sandbox succeeded")


@test
def metrics():
    s = sbx()
    m = wait_for(lambda: s.get_metrics(), what="metrics")
    assert m[0].mem_total > 0 and m[0].cpu_count >= 1 and m[0].mem_used > 0, m


@test
def metrics_are_kept_over_time_and_answer_their_range():
    import datetime

    s = Sandbox.create(metadata={"suite": RUN}, timeout=120)
    try:
        t0 = datetime.datetime.now(datetime.timezone.utc)
        first = s.get_metrics()
        assert len(first) == 1, first
        # The sampler adds one every 5 s; a request adds one too.
        many = wait_for(lambda: (lambda m: m if len(m) >= 3 else None)(s.get_metrics()),
                        timeout=30, what="samples over time")
        times = [x.timestamp for x in many]
        assert times == sorted(times) and len(set(times)) == len(times), times
        mid = times[1]
        after = s.get_metrics(start=mid)
        assert after and all(x.timestamp >= mid.replace(microsecond=0) for x in after), after
        assert len(after) < len(s.get_metrics()), (after, many)
        before = s.get_metrics(end=t0 - datetime.timedelta(seconds=60))
        assert before == [], before
        window = s.get_metrics(start=times[0], end=times[1])
        assert 1 <= len(window) <= 2, window
    finally:
        s.kill()


@test
def pause_then_connect_resumes():
    s = Sandbox.create(metadata={"suite": RUN, "kind": "pause"}, timeout=120)
    try:
        loop = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"
        # The file exists before the run returns (the loop writes it only once scheduled).
        s.commands.run(f"echo 0 > /tmp/count; nohup sh -c '{loop}' >/dev/null 2>&1 &")
        count = lambda sb: int(sb.files.read("/tmp/count").strip() or 0)  # noqa: E731
        wait_for(lambda: count(s) > 0, what="the counter to start")
        assert s.pause() is True
        # A paused sandbox is not running: its envd answers 502.
        assert not s.is_running()
        assert s.get_info().state == SandboxState.PAUSED
        # Pausing again: 409, which the SDK reports as False.
        assert Sandbox.pause(s.sandbox_id) is False
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": RUN, "kind": "pause"}, state=[SandboxState.PAUSED]))
        assert [i.sandbox_id for i in p.next_items()] == [s.sandbox_id]
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": RUN, "kind": "pause"}, state=[SandboxState.RUNNING]))
        assert p.next_items() == []
        # connect resumes it; its processes go on from where they were.
        c = Sandbox.connect(s.sandbox_id, on_resume="restore")
        assert c.is_running()
        assert c.get_info().state == SandboxState.RUNNING
        n = count(c)
        assert n > 0
        wait_for(lambda: count(c) > n, what="the counter to go on after resume")
        assert c.commands.run("echo back").stdout == "back\n"
    finally:
        s.kill()


def counter_running(sb) -> bool:
    """Whether the counter loop of the pause tests runs in `sb` (by its command line)."""
    r = sb.commands.run("pgrep -f 'echo [$]i > /tmp/count' || true")
    return r.stdout.strip() != ""


@test
def pause_to_the_filesystem_boots_from_the_disk():
    s = Sandbox.create(metadata={"suite": RUN, "kind": "fspause"}, timeout=120, envs={"KEEP": "env kept"})
    try:
        loop = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"
        s.commands.run(f"echo 0 > /tmp/count; nohup sh -c '{loop}' >/dev/null 2>&1 &")
        s.files.write("/home/user/notes.txt", "written before the pause")
        s.commands.run("mkdir -p /home/user/d && echo deep > /home/user/d/f && rm -f /etc/motd", user="root")
        wait_for(lambda: counter_running(s), what="the counter to start")
        assert s.pause(mode="filesystem") is True
        assert not s.is_running()
        assert s.get_info().state == SandboxState.PAUSED
        assert Sandbox.pause(s.sandbox_id, mode="filesystem") is False
        # connect boots it from its disk: the files are there, the processes are not.
        c = Sandbox.connect(s.sandbox_id)
        assert c.is_running()
        assert c.get_info().state == SandboxState.RUNNING
        assert c.files.read("/home/user/notes.txt") == "written before the pause"
        assert c.files.read("/home/user/d/f") == "deep\n"
        assert not c.files.exists("/etc/motd")
        assert not counter_running(c), "a process of before the pause runs after the boot"
        n = int(c.files.read("/tmp/count").strip())
        assert n > 0
        # The same sandbox: id, env, user, and its envd token still open it.
        assert c.sandbox_id == s.sandbox_id
        assert c.commands.run("echo $KEEP; whoami").stdout == "env kept\nuser\n"
        assert s.commands.run("echo same token").stdout == "same token\n"
        # A second pause to the filesystem, then the old resume route (SDK 2.45's).
        assert s.pause(mode="filesystem") is True
        r = httpx.post(os.environ["E2B_API_URL"] + f"/sandboxes/{s.sandbox_id}/resume", json={},
                       headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
        assert r.status_code == 201, r.text
        assert s.files.read("/home/user/notes.txt") == "written before the pause"
    finally:
        s.kill()


@test
def connect_with_reboot_drops_the_memory():
    s = Sandbox.create(metadata={"suite": RUN, "kind": "reboot"}, timeout=120)
    try:
        loop = "i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done"
        s.commands.run(f"echo 0 > /tmp/count; nohup sh -c '{loop}' >/dev/null 2>&1 &")
        wait_for(lambda: counter_running(s), what="the counter to start")
        s.files.write("/home/user/kept.txt", "on disk")
        # A reboot of a running sandbox changes nothing (as E2B documents).
        c = Sandbox.connect(s.sandbox_id, on_resume="reboot")
        assert counter_running(c)
        assert s.pause() is True
        c = Sandbox.connect(s.sandbox_id, on_resume="reboot")
        assert c.get_info().state == SandboxState.RUNNING
        assert not counter_running(c), "the frozen processes came back"
        assert c.files.read("/home/user/kept.txt") == "on disk"
    finally:
        s.kill()


@test
def on_timeout_pause_to_the_filesystem():
    s = Sandbox.create(metadata={"suite": RUN, "kind": "fstimeout"}, timeout=3,
                       lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    try:
        assert s.get_info().lifecycle["on_timeout"] == "pause", s.get_info().lifecycle
        s.files.write("/home/user/t.txt", "before the timeout")
        wait_for(lambda: s.get_info().state == SandboxState.PAUSED, timeout=30,
                 what="the timeout to pause the sandbox")
        assert not s.is_running()
        c = Sandbox.connect(s.sandbox_id, timeout=60)
        assert c.files.read("/home/user/t.txt") == "before the timeout"
        assert c.get_info().state == SandboxState.RUNNING
    finally:
        s.kill()
    # auto_resume cannot go with a filesystem-only auto-pause (the SDK refuses it; so does
    # the server, for a client that sends it).
    r = httpx.post(os.environ["E2B_API_URL"] + "/v2/sandboxes",
                   json={"templateID": "base", "autoPause": True, "autoPauseMemory": False,
                         "autoResume": {"enabled": True}},
                   headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    assert r.status_code == 400 and "filesystem" in r.json()["message"], r.text


@test
def auto_resume_on_the_first_request():
    s = Sandbox.create(metadata={"suite": RUN, "kind": "auto"}, timeout=120,
                       lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        info = s.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}, info.lifecycle
        s.commands.run("echo kept > /tmp/state")
        assert s.pause() is True
        assert s.get_info().state == SandboxState.PAUSED
        # The first request (a command through envd) resumes it and is answered.
        r = s.commands.run("cat /tmp/state")
        assert r.stdout == "kept\n", r.stdout
        assert s.get_info().state == SandboxState.RUNNING
        # A port's request too.
        s.commands.run("python3 -m http.server 8123 --bind 127.0.0.1 >/dev/null 2>&1 &")
        wait_for(lambda: s.commands.run("curl -s -o /dev/null -w '%{http_code}' localhost:8123 || true").stdout == "200",
                 what="the server inside")
        assert s.pause() is True
        r = httpx.get(os.environ["E2B_SANDBOX_URL"] + "/",
                      headers={"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": "8123",
                               "E2B-Traffic-Access-Token": s.traffic_access_token}, timeout=30)
        assert r.status_code == 200, (r.status_code, r.text)
        assert s.get_info().state == SandboxState.RUNNING
    finally:
        s.kill()
    # Without auto_resume a paused sandbox stays paused: envd answers 502.
    s = Sandbox.create(metadata={"suite": RUN}, timeout=60, lifecycle={"on_timeout": "pause"})
    try:
        assert s.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        s.pause()
        assert not s.is_running()
        assert s.get_info().state == SandboxState.PAUSED
    finally:
        s.kill()
    # The SDK refuses auto_resume with kill; the server refuses it without autoPause.
    r = httpx.post(os.environ["E2B_API_URL"] + "/v2/sandboxes",
                   json={"templateID": "base", "autoResume": {"enabled": True}},
                   headers={"X-API-KEY": os.environ["E2B_API_KEY"]})
    assert r.status_code == 400 and "autoPause" in r.json()["message"], r.text


@test
def mcp_gateway_is_refused_with_the_reason():
    # E2B's MCP gateway pulls servers from E2B's catalog; this host cannot. The SDK gets the
    # error it gives when the gateway fails to start, and no sandbox is left.
    try:
        Sandbox.create(mcp={"exa": {"apiKey": "k"}}, metadata={"suite": RUN, "kind": "mcp"})
    except SandboxException as e:
        assert "Failed to start MCP gateway" in str(e) and "catalog" in str(e), e
    else:
        raise AssertionError("a sandbox with mcp was made")
    p = Sandbox.list(query=SandboxQuery(metadata={"suite": RUN, "kind": "mcp"}))
    assert p.next_items() == []


@test
def iam_tokens_are_refused_with_the_reason():
    from e2b import Secret

    tokens = {"aws": Secret.iam_token(audience="sts.amazonaws.com", token_type="JWT-SVID")}
    try:
        Sandbox.create(iam={"tokens": tokens}, metadata={"suite": RUN, "kind": "iam"})
    except SandboxException as e:
        assert "iam" in str(e) and "Secret.create" in str(e), e
    else:
        raise AssertionError("a sandbox with workload identity tokens was made")
    assert Sandbox.list(query=SandboxQuery(metadata={"suite": RUN, "kind": "iam"})).next_items() == []


@test
def idempotency_key_makes_one_sandbox():
    key = "k-" + uuid.uuid4().hex
    a = Sandbox.create(metadata={"suite": RUN, "kind": "idem"}, timeout=60, idempotency_key=key)
    try:
        b = Sandbox.create(metadata={"suite": RUN, "kind": "idem"}, timeout=60, idempotency_key=key)
        assert a.sandbox_id == b.sandbox_id
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": RUN, "kind": "idem"}))
        assert [i.sandbox_id for i in p.next_items()] == [a.sandbox_id]
        # The same key for another request: refused (E2B's idempotency_request_mismatch).
        try:
            Sandbox.create(metadata={"suite": RUN, "kind": "other"}, timeout=60, idempotency_key=key)
        except SandboxException as e:
            assert "another request" in str(e), e
        else:
            raise AssertionError("a reused key made a sandbox")
        c = Sandbox.create(metadata={"suite": RUN, "kind": "idem"}, timeout=60,
                           idempotency_key=key + "-2")
        assert c.sandbox_id != a.sandbox_id
        c.kill()
    finally:
        a.kill()


@test
def list_pages_through_paused_and_running():
    tag = RUN + "-pp"
    made = [Sandbox.create(metadata={"suite": tag}, timeout=120) for _ in range(4)]
    try:
        made[1].pause()
        made[3].pause()
        seen = []
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": tag},
                                            state=[SandboxState.RUNNING, SandboxState.PAUSED]), limit=1)
        while p.has_next:
            seen += [(i.sandbox_id, i.state) for i in p.next_items()]
        assert sorted(seen) == sorted(
            (m.sandbox_id, SandboxState.PAUSED if k in (1, 3) else SandboxState.RUNNING)
            for k, m in enumerate(made)), seen
        p = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED]), limit=1)
        paused = []
        while p.has_next:
            paused += [i.sandbox_id for i in p.next_items()]
        assert paused == [made[3].sandbox_id, made[1].sandbox_id], paused
    finally:
        for m in made:
            m.kill()


# --- commands --------------------------------------------------------------------------


@test
def commands_run():
    s = sbx()
    r = s.commands.run("echo hello; echo err >&2; exit 0")
    assert r.exit_code == 0 and r.stdout == "hello\n" and r.stderr == "err\n", r
    r = s.commands.run('echo "a\'b\\"c $((1+2))"')
    assert r.stdout == "a'b\"c 3\n", r.stdout
    r = s.commands.run("printf 'l1\\nl2\\nl3'")
    assert r.stdout == "l1\nl2\nl3"
    try:
        s.commands.run("exit 3")
    except CommandExitException as e:
        assert e.exit_code == 3
    else:
        raise AssertionError("no CommandExitException")
    r = s.commands.run("pwd; whoami")
    assert r.stdout == "/home/user\nuser\n", r.stdout
    r = s.commands.run("whoami", user="root")
    assert r.stdout == "root\n"
    r = s.commands.run("pwd", cwd="/tmp")
    assert r.stdout == "/tmp\n"


@test
def base_has_python_on_path():
    r = sbx().commands.run("python -c 'import sys; print(sys.version_info[0])' && command -v python")
    assert r.stdout.splitlines()[0] == "3", r.stdout


@test
def commands_broken_utf8():
    r = sbx().commands.run(r"printf '\xff\xfeok\xe2\x82'")
    assert "\ufffd" in r.stdout and "ok" in r.stdout, repr(r.stdout)


@test
def commands_env_vars():
    s = sbx()
    r = s.commands.run("echo $A-$B", envs={"A": "1", "B": "two"})
    assert r.stdout == "1-two\n"
    r = s.commands.run("echo ${A:-unset}")
    assert r.stdout == "unset\n", "per-command envs leaked"
    r = s.commands.run("python3 -c 'import os; print(os.environ[\"X\"])'", envs={"X": "py"})
    assert r.stdout == "py\n"


@test
def commands_timeout_raises():
    try:
        sbx().commands.run("sleep 10", timeout=2)
    except TimeoutException:
        return
    raise AssertionError("no TimeoutException")


@test
def commands_background_list_kill():
    s = sbx()
    h1 = s.commands.run("sleep 30", background=True)
    h2 = s.commands.run("sleep 31", background=True)
    pids = [p.pid for p in s.commands.list()]
    assert h1.pid in pids and h2.pid in pids, pids
    assert s.commands.kill(h1.pid) is True
    h2.kill()
    r = s.commands.run(f"kill -0 {h1.pid} 2>/dev/null && echo alive || echo gone")
    assert r.stdout == "gone\n", r.stdout
    assert s.commands.kill(999999) is False


@test
def commands_stdin_and_close():
    s = sbx()
    h = s.commands.run("cat", background=True, stdin=True)
    s.commands.send_stdin(h.pid, "hello stdin\n")
    s.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.exit_code == 0 and r.stdout == "hello stdin\n", r


@test
def commands_connect():
    s = sbx()
    h = s.commands.run("for i in 1 2 3; do echo $i; sleep 0.3; done", background=True)
    h.disconnect()
    c = s.commands.connect(h.pid)
    r = c.wait()
    assert r.exit_code == 0
    assert "3" in r.stdout, r.stdout
    try:
        s.commands.connect(999999)
    except NotFoundException:
        return
    raise AssertionError("connect to an unknown pid succeeded")


@test
def commands_streaming_callbacks():
    out = []
    r = sbx().commands.run("for i in 1 2 3; do echo $i; done", on_stdout=out.append)
    assert "".join(out) == "1\n2\n3\n" and r.stdout == "1\n2\n3\n"


@test
def commands_sandbox_killed_during_run():
    import threading

    s = Sandbox.create(metadata={"suite": RUN}, timeout=60)
    started = threading.Event()

    def killer():
        started.wait(20)
        Sandbox.kill(s.sandbox_id)

    threading.Thread(target=killer, daemon=True).start()
    try:
        s.commands.run("echo up; sleep 30", on_stdout=lambda _: started.set())
    except SandboxNotRunningException as e:
        # The stream is cut, as an E2B sandbox's is when its VM goes away; the SDK probes the
        # sandbox's health (gone) and says so.
        assert "sandbox was killed or reached its end of life" in str(e), e
    else:
        raise AssertionError("the command outlived its sandbox")
    # Silent until killed, and waited on in the background.
    s = Sandbox.create(metadata={"suite": RUN}, timeout=60)
    h = s.commands.run("sleep 30", background=True)
    threading.Thread(target=lambda: (time.sleep(1), s.kill()), daemon=True).start()
    try:
        h.wait()
    except SandboxNotRunningException as e:
        assert "killed or reached its end of life" in str(e), e
    else:
        raise AssertionError("the command outlived its sandbox")


# --- PTY -------------------------------------------------------------------------------


@test
def pty_input_resize_exit():
    s = sbx()
    data = bytearray()
    h = s.pty.create(PtySize(rows=24, cols=80), envs={"ABC": "xyz"}, timeout=60)
    s.pty.send_stdin(h.pid, b"echo val=$ABC; tput cols\n")
    for _, _, pty in h:
        if pty:
            data.extend(pty)
        if b"val=xyz" in data and b"80" in data.split(b"val=xyz", 1)[1]:
            break
    s.pty.resize(h.pid, PtySize(rows=30, cols=100))
    later = bytearray()
    s.pty.send_stdin(h.pid, b"tput cols; exit\n")
    r = h.wait(on_pty=lambda d: later.extend(d))
    assert r.exit_code == 0, r
    assert b"100" in later, bytes(later)


@test
def pty_kill():
    s = sbx()
    h = s.pty.create(PtySize(rows=24, cols=80))
    assert s.pty.kill(h.pid) is True
    try:
        h.wait()
    except CommandExitException:
        pass


# --- files -----------------------------------------------------------------------------


@test
def files_read_write_text_bytes():
    s = sbx()
    info = s.files.write("rw/a.txt", "hello text")
    assert info.path == "/home/user/rw/a.txt", info
    assert s.files.read("rw/a.txt") == "hello text"
    blob = bytes(range(256)) * 10
    s.files.write("/home/user/rw/b.bin", blob)
    assert s.files.read("/home/user/rw/b.bin", format="bytes") == blob
    s.files.write("rw/a.txt", "over")
    assert s.files.read("rw/a.txt") == "over"
    s.files.write("rw/io.txt", io.StringIO("from io"))
    assert s.files.read("rw/io.txt") == "from io"
    s.files.write("rw/empty.txt", "")
    assert s.files.read("rw/empty.txt") == ""
    stream = s.files.read("rw/b.bin", format="stream")
    assert b"".join(stream) == blob
    try:
        s.files.read("rw/missing.txt")
    except FileNotFoundException:
        pass
    else:
        raise AssertionError("no FileNotFoundException")
    infos = s.files.write_files(
        [{"path": "rw/m1.txt", "data": "one"}, {"path": "rw/m2.txt", "data": b"two"}]
    )
    assert [i.path for i in infos] == ["/home/user/rw/m1.txt", "/home/user/rw/m2.txt"], infos


@test
def files_gzip_octet_and_metadata():
    s = sbx()
    s.files.write("gz/a.txt", "zipped " * 100, gzip=True)
    assert s.files.read("gz/a.txt") == "zipped " * 100
    assert s.files.read("gz/a.txt", gzip=True) == "zipped " * 100
    s.files.write("gz/o.bin", b"octets", use_octet_stream=True)
    assert s.files.read("gz/o.bin", format="bytes") == b"octets"
    s.files.write("gz/meta.txt", "m", metadata={"owner": "me"})
    info = s.files.get_info("gz/meta.txt")
    assert info.metadata.get("owner") == "me", info
    # Written again: only the new write's metadata (none, then another key).
    s.files.write("gz/meta.txt", "m2")
    assert not s.files.get_info("gz/meta.txt").metadata, s.files.get_info("gz/meta.txt")
    s.files.write("gz/meta.txt", "m3", metadata={"k": "v"})
    assert s.files.get_info("gz/meta.txt").metadata == {"k": "v"}


@test
def files_list_depth_and_order():
    s = sbx()
    s.files.make_dir("ls/b/c")
    s.files.write("ls/a.txt", "a")
    s.files.write("ls/b/x.txt", "x")
    s.files.write("ls/b/c/y.txt", "y")
    one = [e.path for e in s.files.list("ls")]
    assert one == ["/home/user/ls/a.txt", "/home/user/ls/b"], one
    three = [e.path for e in s.files.list("ls", depth=3)]
    assert three == [
        "/home/user/ls/a.txt",
        "/home/user/ls/b",
        "/home/user/ls/b/c",
        "/home/user/ls/b/c/y.txt",
        "/home/user/ls/b/x.txt",
    ], three
    e = {x.name: x for x in s.files.list("ls")}
    assert e["a.txt"].type == FileType.FILE and e["a.txt"].mode == 0o644
    assert e["b"].type == FileType.DIR and e["b"].mode == 0o755
    assert e["a.txt"].owner == "user" and e["a.txt"].group == "user"
    assert e["a.txt"].permissions == "-rw-r--r--", e["a.txt"].permissions


@test
def files_stat_symlink_exists_mkdir_remove_rename():
    s = sbx()
    s.files.write("st/f.txt", "12345")
    i = s.files.get_info("st/f.txt")
    assert i.type == FileType.FILE and i.size == 5 and i.symlink_target is None, i
    s.commands.run("ln -sf /home/user/st/f.txt /home/user/st/link")
    i = s.files.get_info("st/link")
    # envd >= 0.6 reports the link with is_symlink, which SDK 2.63 maps to SYMLINK.
    assert i.type == FileType.SYMLINK and i.symlink_target == "/home/user/st/f.txt", i
    assert s.files.exists("st/f.txt") and not s.files.exists("st/none")
    assert s.files.make_dir("st/d") is True
    assert s.files.make_dir("st/d") is False
    moved = s.files.rename("st/f.txt", "st/g.txt")
    assert moved.path == "/home/user/st/g.txt"
    assert not s.files.exists("st/f.txt") and s.files.read("st/g.txt") == "12345"
    s.files.remove("st/d")
    assert not s.files.exists("st/d")
    try:
        s.files.get_info("st/nothing")
    except FileNotFoundException:
        pass
    else:
        raise AssertionError("no FileNotFoundException")


@test
def files_watch():
    s = sbx()
    s.files.make_dir("w/sub")
    h = s.files.watch_dir("w", recursive=True)
    s.files.write("w/new.txt", "data")
    s.files.write("w/sub/deep.txt", "deep")
    events = []

    def got():
        events.extend(h.get_new_events())
        names = {(e.name, e.type) for e in events}
        return ("new.txt", FilesystemEventType.WRITE) in names and (
            "sub/deep.txt",
            FilesystemEventType.WRITE,
        ) in names

    wait_for(got, what=f"watch events (have {events})")
    h.stop()
    # A new directory tree and a file written in it at once (before the watch of the new
    # directories can be in place): create, create, create and the write, every time.
    for i in range(5):
        h = s.files.watch_dir("w", recursive=True)
        s.commands.run(f"mkdir -p w/n{i}/m && echo x > w/n{i}/m/f.txt")
        want = [(f"n{i}", FilesystemEventType.CREATE), (f"n{i}/m", FilesystemEventType.CREATE),
                (f"n{i}/m/f.txt", FilesystemEventType.CREATE), (f"n{i}/m/f.txt", FilesystemEventType.WRITE)]
        seen = []

        def all_seen():
            seen.extend((e.name, e.type) for e in h.get_new_events())
            return all(w in seen for w in want)

        wait_for(all_seen, what=f"the events of n{i} (have {seen})")
        h.stop()
    try:
        s.files.watch_dir("w/nothing-here")
    except FileNotFoundException:
        pass
    else:
        raise AssertionError("watching a missing dir succeeded")


@test
def files_signed_urls():
    s = sbx()
    s.files.write("url/down.txt", "signed content")
    url = s.download_url("url/down.txt")
    assert "signature=" in url, url
    r = httpx.get(url)
    assert r.status_code == 200 and r.text == "signed content", (r.status_code, r.text)
    up = s.upload_url("url/up.txt")
    r = httpx.post(up, files={"file": ("up.txt", b"uploaded")})
    assert r.status_code == 200, (r.status_code, r.text)
    assert s.files.read("url/up.txt") == "uploaded"
    # Expired signature: exact payload.
    url = s.download_url("url/down.txt", use_signature_expiration=-120)
    r = httpx.get(url)
    assert r.status_code == 401, r.status_code
    assert r.json() == {"code": 401, "message": "signature is already expired"}, r.text
    # Tampered signature.
    r = httpx.get(s.download_url("url/down.txt").replace("down.txt", "other.txt"))
    assert r.status_code == 401


@test
def envd_requires_the_access_token():
    s = sbx()
    base = os.environ["E2B_SANDBOX_URL"]
    h = {"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": "49983"}
    r = httpx.get(f"{base}/files", params={"path": "/etc/hostname"}, headers=h)
    assert r.status_code == 401, r.status_code
    assert r.json()["code"] == 401
    r = httpx.get(f"{base}/health", headers=h)
    assert r.status_code == 204, r.status_code
    r = httpx.get(f"{base}/health", headers={"E2b-Sandbox-Id": "nosuchsandbox0000000"})
    assert r.status_code == 502 and "was not found" in r.json()["message"], r.text


@test
def zz_cleanup_shared():
    if _shared is not None:
        assert _shared.kill() is True


if __name__ == "__main__":
    run()
