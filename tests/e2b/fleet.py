"""The unmodified `e2b` SDK against a fleet's gateway (`crates/rampart-cli/tests/fleet.rs`).

E2B_API_URL and E2B_SANDBOX_URL are the gateway's URL; E2B_API_KEY an E2B key made through
the gateway for tenant `acme`. FLEET_NODES is how many nodes the fleet has; FLEET_ADMIN the
native admin key (to ask the gateway which node each sandbox runs on).
"""

import os

import httpx
from e2b import Sandbox

from harness import run, test

GATEWAY = os.environ["E2B_API_URL"]
ADMIN = os.environ["FLEET_ADMIN"]
NODES = int(os.environ["FLEET_NODES"])


def node_of(sandbox_id):
    r = httpx.get(f"{GATEWAY}/v1/sandboxes/{sandbox_id}", headers={"Authorization": f"Bearer {ADMIN}"})
    r.raise_for_status()
    return r.json()["node"]


@test
def sandboxes_on_every_node_run_commands_and_files():
    boxes = [Sandbox.create(timeout=120) for _ in range(NODES)]
    try:
        nodes = {node_of(b.sandbox_id) for b in boxes}
        assert len(nodes) == NODES, f"creates were placed on {nodes}"
        for b in boxes:
            r = b.commands.run("echo $((6*7)); hostname")
            assert r.exit_code == 0, r
            assert r.stdout.split() == ["42", b.sandbox_id], r.stdout
            b.files.write("/tmp/fleet.txt", f"on {b.sandbox_id}")
            assert b.files.read("/tmp/fleet.txt") == f"on {b.sandbox_id}"
            assert b.is_running()
        listed = {s.sandbox_id for s in Sandbox.list().next_items()}
        assert {b.sandbox_id for b in boxes} <= listed, listed
    finally:
        for b in boxes:
            b.kill()
    listed = {s.sandbox_id for s in Sandbox.list().next_items()}
    assert not ({b.sandbox_id for b in boxes} & listed), listed


@test
def a_background_command_streams_through_the_gateway():
    b = Sandbox.create(timeout=120)
    try:
        seen = []
        h = b.commands.run("for i in 1 2 3; do echo line$i; sleep 0.1; done", background=True)
        r = h.wait(on_stdout=seen.append)
        assert r.exit_code == 0, r
        assert "".join(seen).split() == ["line1", "line2", "line3"], seen
    finally:
        b.kill()


@test
def another_tenants_key_does_not_find_it():
    b = Sandbox.create(timeout=120)
    try:
        other = os.environ["FLEET_OTHER_E2B_KEY"]
        r = httpx.get(f"{GATEWAY}/sandboxes/{b.sandbox_id}", headers={"X-API-Key": other})
        assert r.status_code == 404, (r.status_code, r.text)
        r = httpx.get(f"{GATEWAY}/sandboxes", headers={"X-API-Key": other})
        assert r.status_code == 200 and r.json() == [], (r.status_code, r.text)
    finally:
        b.kill()


@test
def lifecycle_events_cover_every_node():
    boxes = [Sandbox.create(timeout=120) for _ in range(NODES)]
    ids = {b.sandbox_id for b in boxes}
    assert len({node_of(i) for i in ids}) == NODES
    for b in boxes:
        b.kill()
    key = os.environ["E2B_API_KEY"]
    r = httpx.get(f"{GATEWAY}/events/sandboxes", params={"limit": 50}, headers={"X-API-Key": key})
    assert r.status_code == 200, (r.status_code, r.text)
    events = r.json()
    created = {e["sandboxId"] for e in events if e["type"].endswith("created")}
    killed = {e["sandboxId"] for e in events if e["type"].endswith("killed")}
    assert ids <= created and ids <= killed, events
    stamps = [e["timestamp"] for e in events]
    assert stamps == sorted(stamps, reverse=True), stamps
    one = next(iter(ids))
    r = httpx.get(f"{GATEWAY}/events/sandboxes/{one}", headers={"X-API-Key": key})
    assert r.status_code == 200 and {e["sandboxId"] for e in r.json()} == {one}, r.text


run()
