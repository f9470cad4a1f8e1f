"""The SDK against a real daemon (RAMPART_HOST, RAMPART_API_KEY set by the Rust test)."""

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest

import rampart
from rampart import AsyncRampart, Rampart, errors


@pytest.fixture(scope="module")
def rp():
    with Rampart() as c:
        yield c


@pytest.fixture()
def sb(rp):
    with rp.create(timeout_secs=300, metadata={"suite": "python-sdk"}) as s:
        yield s


def test_create_exec_and_destroy_on_exit(rp):
    with rp.create(timeout_secs=120, cpus=0.5, memory_bytes=256 << 20, env={"A": "b"}) as s:
        assert s.info.state == "running"
        assert s.info.limits.cpus == 0.5 and s.info.limits.memory_bytes == 256 << 20
        assert "A" in s.info.env_names
        r = s.exec("echo $A; echo err >&2; exit 4")
        assert (r.stdout, r.stderr, r.exit_code, r.ok) == ("b\n", "err\n", 4, False)
        r = s.exec(["pwd"], cwd="/tmp", user="root")
        assert r.stdout == "/tmp\n"
        assert s.exec(["cat"], stdin=b"\x00\x01").stdout == "\x00\x01"
        assert s.exec("sleep 30", timeout_secs=1).timed_out
        sid = s.id
    assert rp.get(sid).info.state == "destroyed"


def test_stream_yields_events_as_they_happen(sb):
    events = list(sb.stream("for i in 1 2 3; do echo $i; done; exit 2"))
    assert events[0].type == "start" and events[0].pid
    out = b"".join(e.data for e in events if e.type == "stdout")
    assert out == b"1\n2\n3\n"
    assert events[-1].type == "exit" and events[-1].exit_code == 2


def test_files(sb):
    assert sb.write("/home/user/d/a.txt", "héllo") == "/home/user/d/a.txt"
    assert sb.read("/home/user/d/a.txt") == "héllo".encode()
    big = bytes(range(256)) * 4096
    sb.write("/tmp/big.bin", (big[i:i + 65536] for i in range(0, len(big), 65536)))
    assert b"".join(sb.download("/tmp/big.bin")) == big
    names = [e.name for e in sb.list("/home/user/d")]
    assert names == ["a.txt"]
    st = sb.stat("/tmp/big.bin")
    assert st.size == len(big) and st.type == "file"
    sb.mkdir("/home/user/e/f")
    sb.move("/home/user/d/a.txt", "/home/user/e/f/b.txt")
    assert sb.read("/home/user/e/f/b.txt") == "héllo".encode()
    sb.remove("/home/user/e")
    with pytest.raises(errors.NotFound):
        sb.read("/home/user/e/f/b.txt")


def test_errors_are_classes_per_code(rp, sb):
    with pytest.raises(errors.NotFound) as e:
        rp.get("z0000000000000000000")
    assert e.value.status == 404 and e.value.code == "not_found"
    with pytest.raises(errors.BadRequest) as e:
        rp.create(template="no-such-template")
    assert "template" in e.value.message
    with pytest.raises(errors.LimitExceeded):
        rp.create(cpus=10_000)
    with pytest.raises(errors.BadRequest):
        sb.set_network({"mode": "bogus"})
    with pytest.raises(errors.ConnectionFailed):
        Rampart("http://127.0.0.1:9").list()
    with pytest.raises(errors.Unauthorized):
        Rampart(rp.base_url, "rampart_" + "0" * 40).list()


def test_network_ports_pause_and_timeout(sb):
    assert "mode" in json.dumps(sb.network())
    assert isinstance(sb.ports(), list)
    assert sb.pause().state == "paused"
    with pytest.raises(errors.Conflict):
        sb.exec("true")
    assert sb.resume().state == "running"
    assert sb.exec("true").ok
    before = sb.info.expires_at
    assert sb.set_timeout(600).expires_at != before


def test_snapshot_fork_and_list(rp, sb):
    sb.write("/home/user/state.txt", "v1")
    snap = sb.snapshot(f"sdk-{os.getpid()}")
    assert snap.source == sb.id
    assert any(s.name == snap.name for s in rp.snapshots())
    forks = sb.fork(2)
    try:
        assert len(forks) == 2
        for f in forks:
            assert f.read("/home/user/state.txt") == b"v1"
    finally:
        for f in forks:
            f.destroy()
    with rp.create(snapshot=snap.name) as again:
        assert again.read("/home/user/state.txt") == b"v1"
    rp.delete_snapshot(snap.name)
    ids = [s.id for s in rp.list(metadata={"suite": "python-sdk"})]
    assert sb.id in ids


def test_the_record_verifies_offline_and_tampering_is_named(rp, sb):
    sb.exec("echo recorded")
    key = rp.audit_key()
    rep = sb.verify(trusted_key=key)
    assert rep.sandbox == sb.id and rep.records >= 3 and rep.key == key
    bundle = json.loads(sb.audit_bundle())
    for e in bundle["events"]:
        if e["body"]["type"] == "exec":
            e["body"]["argv"] = ["echo", "forged"]
            break
    with pytest.raises(rampart.VerificationError, match="does not match its hash"):
        rampart.verify_bundle(json.dumps(bundle).encode(), key)
    with pytest.raises(rampart.VerificationError, match="not signed by the trusted key"):
        sb.verify(trusted_key="ed25519:" + "11" * 32)


def test_artifacts_are_kept_and_verified(rp):
    s = rp.create(timeout_secs=300, artifacts=["/home/user/out"])
    s.exec("mkdir -p /home/user/out && printf kept > /home/user/out/a.txt")
    s.destroy()
    kept = s.artifacts()["artifacts"]
    assert [f["path"] for f in kept["files"]] == ["/home/user/out/a.txt"]
    assert s.download_artifact("/home/user/out/a.txt") == b"kept"
    bundle = s.audit_bundle()
    rampart.verify_bundle(bundle, rp.audit_key())
    b = json.loads(bundle)
    b["blobs"][kept["files"][0]["digest"]] = "Zm9yZ2Vk"
    with pytest.raises(rampart.VerificationError, match="does not match its digest"):
        rampart.verify_bundle(json.dumps(b).encode(), rp.audit_key())


def test_usage_report_verifies(rp):
    key = rp.audit_key()
    report = rp.usage(verify_with=key)
    assert report["version"] == 1
    rampart.verify_usage(json.dumps(report).encode(), key)
    if report["sandboxes"]:
        report["sandboxes"][0]["exec_count"] += 1
        with pytest.raises(rampart.VerificationError, match="record 0"):
            rampart.verify_usage(json.dumps(report).encode(), key)


def test_async_client():
    async def main():
        async with AsyncRampart() as rp:
            async with await rp.create(timeout_secs=120) as sb:
                r = await sb.exec("echo async")
                assert r.stdout == "async\n"
                seen = [ev.type async for ev in sb.stream("echo a; echo b")]
                assert seen[0] == "start" and seen[-1] == "exit"
                await sb.write("/tmp/x", b"y")
                assert await sb.read("/tmp/x") == b"y"
                chunks = [c async for c in sb.download("/tmp/x")]
                assert b"".join(chunks) == b"y"
                rep = await sb.verify(trusted_key=await rp.audit_key())
                assert rep.records >= 2
                sid = sb.id
            assert (await rp.get(sid)).info.state == "destroyed"
            with pytest.raises(errors.NotFound):
                await rp.get("z0000000000000000000")
    asyncio.run(main())


def test_the_readme_example_works_as_written():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    first = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert len(first.strip().splitlines()) == 5
    out = subprocess.run([sys.executable, "-c", first], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("42\n") and "BundleReport" in out.stdout


def test_interactive_sessions(sb):
    with sb.session(["cat"]) as s:
        assert s.pid
        s.send("one\n")
        s.send(b"two\n")
        s.close_stdin()
        r = s.wait()
    assert (r.stdout, r.exit_code) == ("one\ntwo\n", 0)
    with sb.session("sleep 30") as s:
        s.signal(kill=True)
        r = s.wait()
    assert r.exit_code is None and r.signal == 9
    with sb.session("tty", pty=True) as s:
        s.resize(100, 30)
        out = "".join(ev.data.decode() for ev in s if ev.type == "pty")
    assert "/dev/pts/" in out
    ghost = rampart.Sandbox(sb._client, sb.info)
    ghost.info = rampart.SandboxInfo.from_dict({**sb.info.__dict__, "id": "z0000000000000000000",
                                                "limits": sb.info.limits.__dict__})
    with pytest.raises(errors.NotFound):
        ghost.session("true")


def test_async_sessions():
    async def main():
        async with AsyncRampart() as rp:
            async with await rp.create(timeout_secs=120) as sb:
                s = await sb.session(["cat"])
                await s.send("hi\n")
                await s.close_stdin()
                r = await s.wait()
                assert r.stdout == "hi\n" and r.exit_code == 0
                await s.close()
    asyncio.run(main())


def test_watch_sees_changes(sb):
    sb.mkdir("/tmp/w")
    events = sb.watch("/tmp/w", recursive=True)
    sb.write("/tmp/w/new.txt", "x")
    first = next(events)
    events.close()
    assert first["name"] == "new.txt" and first["type"] in ("create", "write"), first


def test_background_processes_and_reattach(rp, sb):
    p = sb.start("echo started; while read l; do echo got:$l; done; echo bye")
    assert p.info.running and p.pid
    # Another client (another program) finds it by pid and attaches.
    with Rampart() as other:
        again = other.get(sb.id).process(p.pid)
        assert again.info.cmd == p.info.cmd
        events = again.events()
        first = next(events)
        assert first.type == "stdout" and first.data == b"started\n", first
        again.send("hello\n")
        assert next(events).data == b"got:hello\n"
        events.close()  # detaching leaves it running
    assert p.refresh().running
    assert [q.pid for q in sb.processes()] == [p.pid]
    p.send(b"world\n")
    p.close_stdin()
    r = p.wait()  # replays what was kept, then waits for the end
    assert r.stdout == "started\ngot:hello\ngot:world\nbye\n" and r.exit_code == 0, r
    assert not p.refresh().running and p.info.exit_code == 0 and p.info.ended_at
    # Killed by pid; a process that is not there is NotFound.
    q = sb.start(["sleep", "300"])
    assert not q.kill().running or q.wait().signal == 9
    assert q.refresh().signal == 9
    with pytest.raises(errors.NotFound):
        sb.process(999999)
    with pytest.raises(errors.Conflict):
        p.send("too late\n")
    # On the record like any command: the exec and its exit.
    kinds = [(e["body"]["type"], e["body"].get("argv")) for e in sb.audit_events()]
    assert ("exec", ["sleep", "300"]) in kinds


def test_async_background_process():
    async def main():
        async with AsyncRampart() as rp:
            async with await rp.create(timeout_secs=120) as sb:
                p = await sb.start(["cat"])
                await p.send("async bg\n")
                await p.close_stdin()
                r = await p.wait()
                assert r.stdout == "async bg\n" and r.exit_code == 0
                assert [e.type async for e in p.events()][-1] == "exit"
    asyncio.run(main())
