"""Snapshots and fork through the unmodified E2B Python SDK (`e2b==2.63.0`): create_snapshot,
list_snapshots (paged), delete_snapshot, Sandbox.create from a snapshot, fork, against a
Rampart daemon. Configured only by E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL.

This server keeps a snapshot's filesystem, not its memory (docs/e2b.md): mode="full" is
refused, the default and mode="filesystem" keep the disk.
"""

import os
import secrets

import httpx

from e2b import AsyncSandbox, Sandbox
from e2b.exceptions import (
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
)

from harness import run, test

API = os.environ["E2B_API_URL"].rstrip("/")
KEY = os.environ["E2B_API_KEY"]


def raw(method, path, **kw):
    """A request straight to the control plane (what the SDK refuses to send itself)."""
    return httpx.request(method, API + path, headers={"X-API-KEY": KEY}, timeout=60, **kw)


def uniq(prefix):
    return f"{prefix}-{secrets.token_hex(4)}"


def cat(sbx, path):
    r = sbx.commands.run(f"cat {path} 2>/dev/null || echo MISSING")
    return r.stdout.strip()


def snapshot_ids(**kw):
    """Every snapshot id the list gives, following every page."""
    p = Sandbox.list_snapshots(**kw)
    out = []
    while p.has_next:
        out.extend(s.snapshot_id for s in p.next_items())
    return out


@test
def snapshot_keeps_files_written_before_it_only():
    src = Sandbox.create(timeout=300)
    made = []
    try:
        src.files.write("/home/user/before.txt", "kept by the snapshot")
        src.commands.run("mkdir -p ~/dir && echo deep > ~/dir/f && sudo sh -c 'echo r > /root/rf'")
        name = uniq("py-snap")
        info = src.create_snapshot(name=name)
        assert info.snapshot_id == name, info
        assert info.names == [name], info
        # Written after the snapshot: not in sandboxes made from it.
        src.files.write("/home/user/after.txt", "not in the snapshot")
        # By the snapshot's id and by its name (here the same string), as E2B's docs do.
        for ref in (info.snapshot_id, info.names[0]):
            s = Sandbox.create(template=ref, timeout=120)
            made.append(s)
            assert cat(s, "~/before.txt") == "kept by the snapshot"
            assert cat(s, "~/dir/f") == "deep"
            assert s.commands.run("sudo cat /root/rf").stdout.strip() == "r"
            assert cat(s, "~/after.txt") == "MISSING", "a file written after the snapshot is there"
            assert s.sandbox_id != src.sandbox_id
            assert s.get_info().template_id == ref
        # The source goes on as before.
        assert src.is_running()
        assert cat(src, "~/after.txt") == "not in the snapshot"
        # A sandbox made from it diverges from its siblings.
        made[0].files.write("/home/user/mine.txt", "first")
        assert cat(made[1], "~/mine.txt") == "MISSING"
        assert Sandbox.delete_snapshot(name) is True
    finally:
        for s in made:
            s.kill()
        src.kill()


@test
def snapshot_modes_names_and_refusals():
    src = Sandbox.create(timeout=180)
    try:
        # The SDK's default (no mode): a filesystem snapshot, named after the sandbox.
        default = src.create_snapshot()
        assert default.snapshot_id.startswith(src.sandbox_id + "-"), default
        fs = src.create_snapshot(mode="filesystem")
        assert fs.snapshot_id != default.snapshot_id
        # Memory cannot be kept on this tier: refused, saying why, and nothing is made.
        before = set(snapshot_ids(sandbox_id=src.sandbox_id))
        try:
            src.create_snapshot(name=uniq("full"), mode="full")
            raise AssertionError("mode=full was accepted")
        except SandboxException as e:
            assert "filesystem" in str(e) and "memory" in str(e), e
        assert set(snapshot_ids(sandbox_id=src.sandbox_id)) == before
        # A name in use, a bad name, a template's name.
        name = uniq("dup")
        src.create_snapshot(name=name)
        for bad in (name, "no spaces", "base"):
            try:
                src.create_snapshot(name=bad)
                raise AssertionError(f"name {bad!r} was accepted")
            except SandboxException as e:
                assert "400" in str(e), e
        # Unknown sandboxes.
        try:
            Sandbox.create_snapshot("nosuchsandbox0000000")
            raise AssertionError("a snapshot of an unknown sandbox")
        except NotFoundException:
            pass
        for s in (default.snapshot_id, fs.snapshot_id, name):
            assert Sandbox.delete_snapshot(s) is True
    finally:
        src.kill()


@test
def list_snapshots_pages_and_filters():
    src = Sandbox.create(timeout=180)
    other = Sandbox.create(timeout=180)
    try:
        names = [uniq("page") for _ in range(3)]
        for n in names:
            src.create_snapshot(name=n)
        theirs = other.create_snapshot(name=uniq("other"))
        # limit=1: one per page, each with the next token, newest first, none twice.
        p = Sandbox.list_snapshots(sandbox_id=src.sandbox_id, limit=1)
        pages = []
        while p.has_next:
            page = p.next_items()
            assert len(page) == 1, page
            pages.append(page[0].snapshot_id)
            if len(pages) < 3:
                assert p.has_next and p.next_token, "no next token after page %d" % len(pages)
        assert pages == list(reversed(names)), pages
        assert not p.has_next
        # Resuming from a token given by hand.
        first = Sandbox.list_snapshots(sandbox_id=src.sandbox_id, limit=2)
        assert [s.snapshot_id for s in first.next_items()] == list(reversed(names))[:2]
        rest = Sandbox.list_snapshots(
            sandbox_id=src.sandbox_id, limit=2, next_token=first.next_token
        )
        assert [s.snapshot_id for s in rest.next_items()] == [names[0]]
        assert not rest.has_next
        # The instance method lists its own sandbox's; a name filter; every one.
        mine = src.list_snapshots().next_items()
        assert sorted(s.snapshot_id for s in mine) == sorted(names)
        assert all(s.names == [s.snapshot_id] for s in mine)
        assert [s.snapshot_id for s in other.list_snapshots().next_items()] == [theirs.snapshot_id]
        by_name = Sandbox.list_snapshots(name=names[1]).next_items()
        assert [s.snapshot_id for s in by_name] == [names[1]]
        everything = snapshot_ids()
        assert set(names) | {theirs.snapshot_id} <= set(everything)
        assert Sandbox.list_snapshots(sandbox_id="nosuchsandbox").next_items() == []
        # A token this server did not make.
        r = raw("GET", "/snapshots", params={"nextToken": "not-a-token"})
        assert r.status_code == 400 and r.json()["code"] == 400, r.text
        for n in names + [theirs.snapshot_id]:
            assert Sandbox.delete_snapshot(n) is True
    finally:
        src.kill()
        other.kill()


@test
def delete_snapshot_then_list_and_create():
    src = Sandbox.create(timeout=180)
    child = None
    try:
        src.files.write("/home/user/f.txt", "v1")
        name = uniq("del")
        src.create_snapshot(name=name)
        child = Sandbox.create(template=name, timeout=120)
        assert Sandbox.delete_snapshot(name) is True
        assert name not in snapshot_ids()
        # Gone: a second delete is False, a create from it is refused.
        assert Sandbox.delete_snapshot(name) is False
        try:
            Sandbox.create(template=name, timeout=60)
            raise AssertionError("created from a deleted snapshot")
        except SandboxException as e:
            assert "not found" in str(e).lower(), e
        # A sandbox made from it keeps its own copy.
        assert cat(child, "~/f.txt") == "v1"
        # Names that are neither a snapshot nor a template, URL-encoded by the SDK.
        assert Sandbox.delete_snapshot("no-such-snapshot") is False
        assert Sandbox.delete_snapshot("team/odd name:tag") is False
        # The same route still removes templates, and refuses the built-in ones.
        r = raw("DELETE", "/templates/base")
        assert r.status_code == 403, r.text
    finally:
        if child:
            child.kill()
        src.kill()


@test
def fork_copies_the_files_and_the_forks_diverge():
    src = Sandbox.create(timeout=300, metadata={"role": "parent"}, envs={"FROM": "parent"})
    forks = []
    try:
        src.files.write("/home/user/state.txt", "at the fork")
        forks = src.fork(count=2, timeout=150)
        assert len(forks) == 2, forks
        for f in forks:
            assert isinstance(f, Sandbox), f
        ids = {f.sandbox_id for f in forks}
        assert len(ids) == 2 and src.sandbox_id not in ids, ids
        src.files.write("/home/user/later.txt", "after the fork")
        for i, f in enumerate(forks):
            assert cat(f, "~/state.txt") == "at the fork"
            assert cat(f, "~/later.txt") == "MISSING"
            # The source's create request: its env and metadata.
            assert f.commands.run("echo $FROM").stdout.strip() == "parent"
            info = f.get_info()
            assert info.metadata.get("role") == "parent", info.metadata
            assert info.template_id == "base"
            span = (info.end_at - info.started_at).total_seconds()
            assert 145 <= span <= 160, span
            f.files.write("/home/user/own.txt", f"fork {i}")
        assert cat(forks[0], "~/own.txt") == "fork 0"
        assert cat(forks[1], "~/own.txt") == "fork 1"
        assert cat(src, "~/own.txt") == "MISSING"
        # Each has its own identity and envd token.
        hosts = {f.commands.run("hostname").stdout.strip() for f in forks}
        assert len(hosts) == 2, hosts
        tokens = {f._envd_access_token for f in forks} | {src._envd_access_token}
        assert len(tokens) == 3
        listed = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert ids <= listed
        # One fork by default.
        one = Sandbox.fork(src.sandbox_id)
        forks.extend(one)
        assert len(one) == 1 and cat(one[0], "~/later.txt") == "after the fork"
    finally:
        for f in forks:
            if isinstance(f, Sandbox):
                f.kill()
        src.kill()


@test
def fork_refusals():
    src = Sandbox.create(timeout=120)
    before = {s.sandbox_id for s in Sandbox.list().next_items()}
    try:
        # The SDK refuses counts out of 1..20 itself; the server does too, in E2B's shape.
        for n in (0, 21):
            try:
                src.fork(count=n)
                raise AssertionError(f"the SDK sent count={n}")
            except InvalidArgumentException:
                pass
            r = raw("POST", f"/sandboxes/{src.sandbox_id}/fork", json={"count": n})
            assert r.status_code == 400, r.text
            body = r.json()
            assert body["code"] == 400 and "between 1 and 20" in body["message"], body
        r = raw("POST", f"/sandboxes/{src.sandbox_id}/fork", json={"count": "2"})
        assert r.status_code == 400 and r.json()["code"] == 400, r.text
        try:
            Sandbox.fork("nosuchsandbox0000000")
            raise AssertionError("forked an unknown sandbox")
        except NotFoundException as e:
            assert "doesn't exist" in str(e), e
        r = raw("POST", "/sandboxes/nosuchsandbox0000000/fork", json={})
        assert r.status_code == 404 and r.json()["code"] == 404, r.text
        # No fork was left behind by the refusals.
        assert {s.sandbox_id for s in Sandbox.list().next_items()} == before
    finally:
        src.kill()
    # A killed sandbox can be neither forked nor snapshotted.
    try:
        Sandbox.fork(src.sandbox_id)
        raise AssertionError("forked a killed sandbox")
    except NotFoundException:
        pass


@test
def fork_and_snapshot_of_a_paused_sandbox():
    src = Sandbox.create(timeout=300)
    made = []
    try:
        src.files.write("/home/user/p.txt", "paused state")
        src.pause()
        assert src.get_info().state.value == "paused"
        forks = src.fork(count=1, timeout=120)
        made.extend(forks)
        assert cat(forks[0], "~/p.txt") == "paused state"
        snap = src.create_snapshot(name=uniq("paused"))
        s = Sandbox.create(template=snap.snapshot_id, timeout=120)
        made.append(s)
        assert cat(s, "~/p.txt") == "paused state"
        # The source stays paused, then resumes with its memory as before.
        assert src.get_info().state.value == "paused"
        src.connect()
        assert cat(src, "~/p.txt") == "paused state"
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    finally:
        for f in made:
            f.kill()
        src.kill()


@test
async def async_snapshot_list_fork_delete():
    src = await AsyncSandbox.create(timeout=240)
    made = []
    try:
        await src.files.write("/home/user/a.txt", "async")
        name = uniq("async")
        info = await src.create_snapshot(name=name)
        assert info.snapshot_id == name
        page = await AsyncSandbox.list_snapshots(sandbox_id=src.sandbox_id).next_items()
        assert [s.snapshot_id for s in page] == [name]
        s = await AsyncSandbox.create(template=name, timeout=120)
        made.append(s)
        r = await s.commands.run("cat ~/a.txt")
        assert r.stdout.strip() == "async"
        forks = await src.fork(count=2)
        made.extend(forks)
        assert len(forks) == 2 and all(isinstance(f, AsyncSandbox) for f in forks)
        for f in forks:
            r = await f.commands.run("cat ~/a.txt")
            assert r.stdout.strip() == "async"
        try:
            await src.fork(count=21)
            raise AssertionError("the SDK sent count=21")
        except InvalidArgumentException:
            pass
        assert await AsyncSandbox.delete_snapshot(name) is True
        assert await AsyncSandbox.delete_snapshot(name) is False
    finally:
        for f in made:
            await f.kill()
        await src.kill()


if __name__ == "__main__":
    run()
