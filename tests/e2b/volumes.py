"""E2B volumes and secrets with the unmodified `e2b` SDK against Rampart
(crates/rampart-cli/tests/e2b_volumes.rs runs it).

Volumes: `Volume.create/list/get_info/connect/destroy`, the file API (`E2B_VOLUME_API_URL`
is the daemon), `Sandbox.create(volume_mounts=...)`. Secrets: `Secret.create/list/get_info/
update/destroy`, used by a sandbox through `Secret.fill` in a `network.rules` header, checked
on the test host E2B_NET_HOST (HTTP on port 80 in a network namespace the test made; it logs
each request's headers to E2B_NET_LOG, outside every sandbox). E2B_HOST_FILE is a file of
the host (outside every volume) that no volume call may reach.
"""

import json
import os
import uuid

import httpx
from e2b import (
    ALL_TRAFFIC,
    Sandbox,
    Secret,
    Volume,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)
from e2b.exceptions import SecretNotFoundException

from harness import run, test

HOST = os.environ["E2B_NET_HOST"]
LOG = os.environ["E2B_NET_LOG"]
HOST_FILE = os.environ["E2B_HOST_FILE"]
API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def raises(fn, *types):
    try:
        fn()
    except types or Exception as e:  # noqa: B030 - the tuple of expected types
        return e
    raise AssertionError(f"{fn} did not raise")


def sh(sbx, cmd, user=None):
    kw = {"user": user} if user else {}
    r = sbx.commands.run(cmd, timeout=60, **kw)
    return r.stdout


@test
def volume_lifecycle_and_names():
    n = name("vol")
    vol = Volume.create(n)
    try:
        assert vol.name == n and vol.volume_id == n, (vol.name, vol.volume_id)
        assert vol.token and vol.token.startswith("vol."), vol.token
        listed = {v.name: v.volume_id for v in Volume.list()}
        assert listed.get(n) == n, listed
        info = Volume.get_info(vol.volume_id)
        assert (info.name, info.token) == (n, vol.token), info
        again = Volume.connect(vol.volume_id)
        assert again.token == vol.token
        # The same name twice: refused.
        e = raises(lambda: Volume.create(n))
        assert "exists" in str(e), e
        for bad in ["", "../x", "a/b", "a b", ".hidden", "x" * 65]:
            raises(lambda: Volume.create(bad))
        raises(lambda: Volume.get_info(name("missing")), VolumeNotFoundException)
    finally:
        assert Volume.destroy(vol.volume_id) is True
    assert Volume.destroy(vol.volume_id) is False
    assert n not in {v.name for v in Volume.list()}


@test
def file_api_without_a_sandbox():
    vol = Volume.create(name("files"))
    try:
        d = vol.make_dir("/data")
        assert (d.type.value, d.path, d.uid, d.gid) == ("directory", "/data", 1000, 1000), d
        raises(lambda: vol.make_dir("/data"))
        assert vol.make_dir("/deep/er/dir", force=True).path == "/deep/er/dir"
        raises(lambda: vol.make_dir("/nope/child"), VolumePathNotFoundException)
        st = vol.write_file("/data/hello.txt", "hello volume")
        assert (st.type.value, st.size, st.mode, st.uid) == ("file", 12, 0o644, 1000), st
        assert vol.read_file("/data/hello.txt") == "hello volume"
        blob = bytes(range(256)) * 4096
        vol.write_file("/data/blob.bin", blob)
        assert vol.read_file("/data/blob.bin", format="bytes") == blob
        assert b"".join(vol.read_file("/data/blob.bin", format="stream")) == blob
        # Overwrite replaces the whole file.
        vol.write_file("/data/hello.txt", "v2")
        assert vol.read_file("/data/hello.txt") == "v2"
        # A missing parent: 404 unless force makes it.
        raises(lambda: vol.write_file("/x/y.txt", "z"), VolumePathNotFoundException)
        assert vol.write_file("/x/y.txt", "z", force=True).path == "/x/y.txt"
        names = sorted(e.path for e in vol.list("/"))
        assert names == ["/data", "/deep", "/lost+found", "/x"], names
        deep = sorted(e.path for e in vol.list("/", depth=3))
        assert "/deep/er/dir" in deep and "/data/blob.bin" in deep, deep
        assert vol.exists("/data/hello.txt") and not vol.exists("/data/none")
        info = vol.get_info("/data/hello.txt")
        assert info.name == "hello.txt" and info.size == 2, info
        m = vol.update_metadata("/data/hello.txt", mode=0o600, uid=1234, gid=4321)
        assert (m.mode, m.uid, m.gid) == (0o600, 1234, 4321), m
        vol.remove("/deep")
        assert not vol.exists("/deep/er")
        raises(lambda: vol.remove("/deep"), VolumePathNotFoundException)
        raises(lambda: vol.read_file("/data"), Exception)
    finally:
        Volume.destroy(vol.volume_id)


@test
def mounted_in_a_sandbox_both_ways():
    vol = Volume.create(name("mnt"))
    sbx = None
    try:
        vol.make_dir("/shared")
        vol.write_file("/shared/from-api.txt", "written through the file API")
        sbx = Sandbox.create(volume_mounts={"/mnt/vol": vol}, timeout=180)
        assert sh(sbx, "cat /mnt/vol/shared/from-api.txt") == "written through the file API"
        # The sandbox user (uid 1000) owns what the API made, and writes there.
        out = sh(sbx, "stat -c '%u %U' /mnt/vol/shared/from-api.txt")
        assert out.strip() == "1000 user", out
        sh(sbx, "echo -n 'written inside' > /mnt/vol/shared/from-sandbox.txt")
        assert vol.read_file("/shared/from-sandbox.txt") == "written inside"
        assert vol.get_info("/shared/from-sandbox.txt").uid == 1000
        # While mounted, both see each other's changes at once (one file system).
        vol.write_file("/shared/live.txt", "live")
        assert sh(sbx, "cat /mnt/vol/shared/live.txt") == "live"
        vol.remove("/shared/live.txt")
        assert sh(sbx, "test -e /mnt/vol/shared/live.txt && echo there || echo gone").strip() == "gone"
        # Info and list show the mount.
        assert sbx.get_info().volume_mounts == [{"name": vol.name, "path": "/mnt/vol"}]
        listed = [s for s in Sandbox.list().next_items() if s.sandbox_id == sbx.sandbox_id]
        assert listed and listed[0].volume_mounts == [{"name": vol.name, "path": "/mnt/vol"}]
        # A volume in use cannot be removed.
        e = raises(lambda: Volume.destroy(vol.volume_id))
        assert "mounted" in str(e), e
        assert vol.read_file("/shared/from-api.txt") == "written through the file API"
        sbx.kill()
        sbx = None
        # Once the sandbox is gone the data stays, and a new sandbox (by name) sees it.
        sbx = Sandbox.create(volume_mounts={"/data": vol.name}, timeout=120)
        assert sh(sbx, "cat /data/shared/from-sandbox.txt") == "written inside"
        sbx.kill()
        sbx = None
        raises(lambda: Sandbox.create(volume_mounts={"/data": name("nope")}, timeout=60))
        raises(lambda: Sandbox.create(volume_mounts={"relative": vol}, timeout=60))
    finally:
        if sbx is not None:
            sbx.kill()
    assert Volume.destroy(vol.volume_id) is True


@test
def traversal_never_reaches_host_files():
    vol = Volume.create(name("trav"))
    sbx = None
    host_text = open(HOST_FILE).read()
    try:
        for p in ["../etc/passwd", "/a/../../etc/passwd", "..", "/x/.."]:
            e = raises(lambda: vol.read_file(p))
            assert host_text not in str(e)
            raises(lambda: vol.write_file(p + "/f", "x"))
            raises(lambda: vol.list(p))
        # Symlinks made inside the volume that point out of it.
        sbx = Sandbox.create(volume_mounts={"/mnt/vol": vol}, timeout=120)
        depth = "../" * 12
        sh(
            sbx,
            f"ln -s {HOST_FILE} /mnt/vol/abs && ln -s {depth} /mnt/vol/up "
            "&& mkdir /mnt/vol/d && ln -s ../abs /mnt/vol/d/rel "
            "&& echo -n inside > /mnt/vol/d/t && ln -s t /mnt/vol/d/ok",
        )
        sbx.kill()
        sbx = None
        host_dir = os.path.dirname(HOST_FILE)
        host_base = os.path.basename(HOST_FILE)
        up_path = f"/up{host_dir}/{host_base}"
        for p in ["/abs", "/d/rel", up_path]:
            e = raises(lambda: vol.read_file(p))
            assert host_text not in str(e), e
        raises(lambda: vol.list("/up"))
        raises(lambda: vol.list(f"/up{host_dir}"))
        raises(lambda: vol.write_file(f"/up{host_dir}/planted.txt", "x"))
        assert not os.path.exists(os.path.join(host_dir, "planted.txt"))
        raises(lambda: vol.make_dir(f"/up{host_dir}/planted-dir"))
        assert not os.path.exists(os.path.join(host_dir, "planted-dir"))
        raises(lambda: vol.update_metadata(up_path, mode=0o777))
        raises(lambda: vol.remove(up_path))
        assert os.stat(HOST_FILE).st_mode & 0o777 != 0o777
        # A symlink that stays inside is followed; the link itself is reported as one.
        assert vol.read_file("/d/ok") == "inside"
        st = vol.get_info("/abs")
        assert (st.type.value, st.target) == ("symlink", HOST_FILE), st
        # Writing over an outward symlink replaces the link, never the host file.
        vol.write_file("/abs", "replaced")
        assert vol.read_file("/abs") == "replaced"
        vol.remove("/up")
        assert open(HOST_FILE).read() == host_text
        assert os.path.isdir(host_dir)
    finally:
        if sbx is not None:
            sbx.kill()
        Volume.destroy(vol.volume_id)


@test
def tokens_open_only_their_volume():
    a = Volume.create(name("toka"))
    b = Volume.create(name("tokb"))
    try:
        b.write_file("/secret.txt", "b's")
        forged = Volume(b.volume_id, b.name, token=a.token)
        raises(lambda: forged.read_file("/secret.txt"))
        bad = Volume(b.volume_id, b.name, token="vol..00")
        raises(lambda: bad.read_file("/secret.txt"))
        r = httpx.get(
            f"{API}/volumecontent/{b.volume_id}/file", params={"path": "/secret.txt"}
        )
        assert r.status_code == 401, r.status_code
        # A volume made again under the same name gets a new token.
        old = b.token
        Volume.destroy(b.volume_id)
        b = Volume.create(b.name)
        assert b.token != old
        stale = Volume(b.volume_id, b.name, token=old)
        raises(lambda: stale.list("/"))
    finally:
        Volume.destroy(a.volume_id)
        Volume.destroy(b.volume_id)


def requests_to(path):
    out = []
    with open(LOG) as f:
        for line in f:
            v = json.loads(line)
            if v["path"] == path:
                out.append({k.lower(): val for k, val in v["headers"]})
    return out


@test
def secrets_are_write_only_and_injected_by_the_proxy():
    n = name("svc-token")
    value = "s3cr3t-" + uuid.uuid4().hex
    info = Secret.create(n, value, metadata={"team": "qa"})
    try:
        assert (info.name, info.version, info.metadata) == (n, 1, {"team": "qa"}), info
        assert info.secret_id.startswith("sec_"), info
        raises(lambda: Secret.create(n, "other"))
        raises(lambda: Secret.create("bad{name}", "x"))
        raises(lambda: Secret.create(name("nl"), "a\nb"))
        pages, seen = Secret.list(limit=1), []
        while pages.has_next:
            seen.extend(pages.next_items())
        assert n in [s.name for s in seen], seen
        # No read surface carries the value.
        for path in ["/secrets", f"/secrets/{info.secret_id}", f"/secrets/{n}"]:
            r = httpx.get(API + path, headers={"X-API-KEY": KEY})
            assert r.status_code == 200, (path, r.status_code, r.text)
            assert value not in r.text, path
        assert Secret.get_info(n).secret_id == info.secret_id
        assert Secret.exists(info.secret_id)
        header = "Bearer " + Secret.fill(n)
        sbx = Sandbox.create(
            network={
                "allow_out": [HOST],
                "deny_out": [ALL_TRAFFIC],
                "rules": {HOST: [{"transform": {"headers": {"Authorization": header}}}]},
            },
            timeout=180,
        )
        try:
            marker = "/e2b-secret-" + uuid.uuid4().hex
            out = sh(sbx, f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 10 http://{HOST}{marker}")
            assert out.strip() == "200", out
            got = requests_to(marker)
            assert len(got) == 1 and got[0].get("authorization") == f"Bearer {value}", got
            # Never inside: not in the environment nor in files the sandbox can read.
            env = sh(sbx, "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'", user="root")
            assert value not in env and "e2b.secrets" not in env
            found = sh(
                sbx,
                f"grep -rsl -- '{value}' /etc /home /tmp /root /run /var /mnt 2>/dev/null; true",
                user="root",
            )
            assert found.strip() == "", found
            shown = json.dumps(sbx.get_info().network)
            assert value not in shown, shown
            # A new version reaches new sandboxes, not this one (it keeps its copy).
            v2 = "v2-" + uuid.uuid4().hex
            up = Secret.update(info.secret_id, v2)
            assert up.version == 2 and up.metadata == {"team": "qa"}, up
        finally:
            sbx.kill()
        # A placeholder naming no stored secret: refused at create.
        raises(
            lambda: Sandbox.create(
                network={
                    "allow_out": [HOST],
                    "rules": {HOST: [{"transform": {"headers": {"X-K": Secret.fill(name("none"))}}}]},
                },
                timeout=60,
            )
        )
    finally:
        assert Secret.destroy(info.secret_id) is True
    assert Secret.destroy(info.secret_id) is False
    assert not Secret.exists(n)
    raises(lambda: Secret.get_info(n), SecretNotFoundException)


@test
def update_network_binds_a_stored_secret():
    n = name("upd-token")
    value = "upd-" + uuid.uuid4().hex
    Secret.create(n, value)
    try:
        sbx = Sandbox.create(network={"allow_out": [HOST], "deny_out": [ALL_TRAFFIC]}, timeout=180)
        try:
            marker = "/before-" + uuid.uuid4().hex
            sh(sbx, f"curl -sS -o /dev/null --max-time 10 http://{HOST}{marker}")
            assert "authorization" not in requests_to(marker)[0]
            sbx.update_network({
                "allow_out": [HOST],
                "deny_out": [ALL_TRAFFIC],
                "rules": {HOST: [{"transform": {"headers": {"Authorization": "Token " + Secret.fill(n)}}}]},
            })
            marker = "/after-" + uuid.uuid4().hex
            out = sh(sbx, f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 10 http://{HOST}{marker}")
            assert out.strip() == "200", out
            got = requests_to(marker)
            assert len(got) == 1 and got[0].get("authorization") == f"Token {value}", got
            assert value not in json.dumps(sbx.get_info().network)
        finally:
            sbx.kill()
    finally:
        Secret.destroy(n)


@test
def tenants_see_only_their_own_volumes_and_secrets():
    a, b = os.environ["E2B_KEY_A"], os.environ["E2B_KEY_B"]
    vn, sn = name("acme-vol"), name("acme-secret")
    vol = Volume.create(vn, api_key=a)
    sec = Secret.create(sn, "acme-" + uuid.uuid4().hex, api_key=a)
    try:
        # The rival: not listed, not found, not removable, not mountable, not usable.
        assert vn not in [v.name for v in Volume.list(api_key=b)]
        raises(lambda: Volume.get_info(vn, api_key=b), VolumeNotFoundException)
        assert Volume.destroy(vn, api_key=b) is False
        raises(lambda: Sandbox.create(volume_mounts={"/data": vn}, timeout=60, api_key=b))
        seen = []
        pages = Secret.list(api_key=b)
        while pages.has_next:
            seen.extend(pages.next_items())
        assert sn not in [s.name for s in seen], seen
        raises(lambda: Secret.get_info(sn, api_key=b), SecretNotFoundException)
        raises(lambda: Secret.get_info(sec.secret_id, api_key=b), SecretNotFoundException)
        assert Secret.destroy(sec.secret_id, api_key=b) is False
        raises(lambda: Sandbox.create(
            network={"allow_out": [HOST],
                     "rules": {HOST: [{"transform": {"headers": {"X-K": Secret.fill(sn)}}}]}},
            timeout=60, api_key=b))
        # The owner still has both, untouched.
        assert Volume.get_info(vn, api_key=a).name == vn
        assert Secret.get_info(sn, api_key=a).secret_id == sec.secret_id
        # The node's own key sees every tenant's, under its qualified name (docs/tenants.md).
        assert f"acme:{vn}" in [v.name for v in Volume.list()], [v.name for v in Volume.list()]
    finally:
        assert Volume.destroy(vn, api_key=a) is True
        assert Secret.destroy(sec.secret_id, api_key=a) is True


if __name__ == "__main__":
    run()
