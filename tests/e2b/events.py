"""E2B lifecycle events and webhooks against Rampart. The lifecycle is driven with the
unmodified `e2b` SDK (create, set_timeout, pause, connect, create_snapshot, kill); the
events API and the webhooks, which the SDKs have no calls for, are called over HTTP as E2B's
documentation shows. A receiver in this process (on 127.0.0.1, which the daemon under test
is configured to allow) records every delivery and checks both signatures.

E2B_API_KEY is a key of the node, E2B_TENANT_KEY one of tenant `acme`.
"""

import base64
import hashlib
import hmac
import http.server
import json
import os
import threading
import time

import httpx
from e2b import Sandbox

from harness import run, test, wait_for

API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
TENANT_KEY = os.environ["E2B_TENANT_KEY"]
SECRET = "whsec-test-secret"
ALL = [
    "sandbox.lifecycle.created",
    "sandbox.lifecycle.updated",
    "sandbox.lifecycle.paused",
    "sandbox.lifecycle.resumed",
    "sandbox.lifecycle.checkpointed",
    "sandbox.lifecycle.killed",
]

# Every delivery: (path, headers lower-cased, raw body).
DELIVERIES = []
_LOCK = threading.Lock()


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the stdlib's name
        n = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(n)
        with _LOCK:
            DELIVERIES.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        # /flaky answers 500 to its first delivery of each event: the daemon tries again.
        if self.path == "/flaky":
            with _LOCK:
                seen = [d for d in DELIVERIES if d[0] == "/flaky" and d[2] == body]
            if len(seen) == 1:
                self.send_response(500)
                self.end_headers()
                return
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


SERVER = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=SERVER.serve_forever, daemon=True).start()
HOOK_BASE = f"http://127.0.0.1:{SERVER.server_address[1]}"


def api(method, path, key=KEY, **kw):
    return httpx.request(method, API + path, headers={"X-API-Key": key}, timeout=30, **kw)


def e2b_signature(secret, body):
    return base64.b64encode(hashlib.sha256(secret.encode() + body).digest()).decode().rstrip("=")


def rampart_signature_ok(secret, header, body, now=None):
    parts = dict(p.split("=", 1) for p in header.split(","))
    t = int(parts["t"])
    mac = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    now = time.time() if now is None else now
    return hmac.compare_digest(mac, parts["v1"]) and abs(now - t) < 300


def received(path, sandbox_id):
    with _LOCK:
        out = []
        for p, h, b in DELIVERIES:
            v = json.loads(b)
            if p == path and v.get("sandboxId") == sandbox_id:
                out.append((h, b, v))
        return out


def types_of(events):
    return [e["type"] for e in events]


def subsequence(want, got):
    it = iter(got)
    return all(w in it for w in want)


def register(path, events=None, key=KEY, **extra):
    body = {
        "name": f"hook {path}",
        "url": HOOK_BASE + path,
        "enabled": True,
        "events": events or ALL,
        "signatureSecret": SECRET,
        **extra,
    }
    r = api("POST", "/events/webhooks", key=key, json=body)
    assert r.status_code == 201, (r.status_code, r.text)
    return r.json()


@test
def registering_a_webhook_checks_its_fields():
    bad = [
        ({"url": "http://169.254.169.254/latest/meta-data", "events": ALL, "signatureSecret": "s"}, "public"),
        ({"url": "http://10.1.2.3/hook", "events": ALL, "signatureSecret": "s"}, "public"),
        ({"url": "ftp://example.com/x", "events": ALL, "signatureSecret": "s"}, "http"),
        ({"url": HOOK_BASE + "/x", "events": ["sandbox.lifecycle.exploded"], "signatureSecret": "s"}, "unknown event type"),
        ({"url": HOOK_BASE + "/x", "events": ALL}, "signatureSecret"),
        ({"url": HOOK_BASE + "/x", "events": ALL, "signatureSecret": "s", "colour": "red"}, "colour"),
    ]
    for body, why in bad:
        r = api("POST", "/events/webhooks", json=body)
        assert r.status_code == 400, (body, r.status_code, r.text)
        assert why in r.text, (body, r.text)
    r = api("POST", "/events/webhooks", key="e2b_" + "0" * 40, json=bad[0][0])
    assert r.status_code == 401, r.status_code


@test
def a_sandboxs_life_is_delivered_signed_and_listed():
    hook = register("/all")
    assert hook["url"] == HOOK_BASE + "/all" and hook["enabled"] is True
    assert "signatureSecret" not in hook and SECRET not in json.dumps(hook)
    sbx = Sandbox.create(metadata={"purpose": "events"}, timeout=120)
    sid = sbx.sandbox_id
    sbx.set_timeout(200)
    sbx.pause()
    Sandbox.connect(sid, timeout=150)
    snap = sbx.create_snapshot()
    sbx.kill()
    want = [
        "sandbox.lifecycle.created",
        "sandbox.lifecycle.updated",
        "sandbox.lifecycle.paused",
        "sandbox.lifecycle.resumed",
        "sandbox.lifecycle.checkpointed",
        "sandbox.lifecycle.killed",
    ]
    got = wait_for(
        lambda: (lambda d: d if "sandbox.lifecycle.killed" in [v["type"] for _, _, v in d] else None)(
            received("/all", sid)
        ),
        timeout=30,
        what="the killed event at the webhook",
    )
    order = [v["type"] for _, _, v in got]
    # Deliveries run concurrently: their arrival order is not promised, their set is.
    assert set(want) <= set(order), order
    for h, body, v in got:
        assert h["e2b-signature"] == e2b_signature(SECRET, body), "e2b-signature does not verify"
        assert rampart_signature_ok(SECRET, h["x-rampart-signature"], body)
        # A replay a day later is refused by the timestamped signature.
        assert not rampart_signature_ok(SECRET, h["x-rampart-signature"], body, now=time.time() + 86400)
        # A changed body does not verify.
        assert h["e2b-signature"] != e2b_signature(SECRET, body + b" ")
        assert h["e2b-webhook-id"] == hook["id"]
        assert h["e2b-signature-version"] == "v1" and h["e2b-delivery-id"]
        assert h["content-type"] == "application/json"
        assert v["version"] == "v2" and v["sandboxId"] == sid and v["id"]
        assert v["eventData"]["sandbox_metadata"] == {"purpose": "events"}, v
        assert v["sandboxTemplateId"] == "base", v
        assert v["timestamp"].endswith("Z"), v
    by_type = {v["type"]: v for _, _, v in got}
    killed = by_type["sandbox.lifecycle.killed"]["eventData"]["execution"]
    assert killed["vcpu_count"] >= 1 and killed["memory_mb"] > 0 and killed["execution_time"] > 0, killed
    assert "set_timeout" in by_type["sandbox.lifecycle.updated"]["eventData"]
    assert by_type["sandbox.lifecycle.checkpointed"]["eventData"]["snapshot_id"] == snap.snapshot_id
    assert len({v["id"] for _, _, v in got}) == len(got), "an event was delivered twice"

    # The same events through the API, oldest first, then newest first.
    r = api("GET", f"/events/sandboxes/{sid}", params={"orderAsc": "true", "limit": 100})
    assert r.status_code == 200, r.text
    listed = r.json()
    assert subsequence(want, types_of(listed)), types_of(listed)
    assert {e["id"] for e in listed} == {v["id"] for _, _, v in got}
    r = api("GET", f"/events/sandboxes/{sid}", params={"limit": 100})
    assert types_of(r.json()) == list(reversed(types_of(listed)))
    # Paging and the type filter.
    first = api("GET", f"/events/sandboxes/{sid}", params={"limit": 2, "orderAsc": "true"}).json()
    second = api("GET", f"/events/sandboxes/{sid}", params={"limit": 2, "offset": 2, "orderAsc": "true"}).json()
    assert [e["id"] for e in first + second] == [e["id"] for e in listed[:4]]
    only = api(
        "GET",
        f"/events/sandboxes/{sid}",
        params=[("types", "sandbox.lifecycle.created"), ("types", "sandbox.lifecycle.killed")],
    ).json()
    assert sorted(types_of(only)) == ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"], only
    # The team's latest events include this sandbox's end.
    team = api("GET", "/events/sandboxes", params={"limit": 10}).json()
    assert any(e["sandboxId"] == sid and e["type"] == "sandbox.lifecycle.killed" for e in team)
    for q in [{"limit": 0}, {"limit": 101}, {"orderAsc": "maybe"}, {"types": "sandbox.lifecycle.nope"}]:
        r = api("GET", "/events/sandboxes", params=q)
        assert r.status_code == 400, (q, r.status_code)
    api("DELETE", f"/templates/{snap.snapshot_id}")
    api("DELETE", f"/events/webhooks/{hook['id']}")


@test
def webhooks_are_listed_changed_disabled_and_removed():
    a = register("/a", events=["sandbox.lifecycle.created", "sandbox.lifecycle.killed"])
    b = register("/b", events=["sandbox.lifecycle.killed"])
    listed = api("GET", "/events/webhooks").json()
    assert {a["id"], b["id"]} <= {w["id"] for w in listed}
    got = api("GET", f"/events/webhooks/{a['id']}").json()
    assert got["events"] == ["sandbox.lifecycle.created", "sandbox.lifecycle.killed"] and got["name"] == "hook /a"
    # PATCH replaces the fields given; a bad change is refused and changes nothing.
    r = api("PATCH", f"/events/webhooks/{a['id']}", json={"enabled": False, "name": "off"})
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["name"] == "off", r.text
    r = api("PATCH", f"/events/webhooks/{a['id']}", json={"url": "http://169.254.169.254/"})
    assert r.status_code == 400, r.text
    assert api("GET", f"/events/webhooks/{a['id']}").json()["url"] == HOOK_BASE + "/a"
    # A disabled webhook gets nothing; b gets only what it asked for.
    sbx = Sandbox.create(timeout=60)
    sid = sbx.sandbox_id
    sbx.kill()
    wait_for(lambda: received("/b", sid), timeout=30, what="b's killed event")
    assert [v["type"] for _, _, v in received("/b", sid)] == ["sandbox.lifecycle.killed"]
    assert received("/a", sid) == [], "a disabled webhook was posted to"
    # Removed: 404 after, and nothing more is posted to it.
    assert api("DELETE", f"/events/webhooks/{a['id']}").status_code == 200
    assert api("GET", f"/events/webhooks/{a['id']}").status_code == 404
    assert api("DELETE", f"/events/webhooks/{a['id']}").status_code == 404
    assert api("PATCH", "/events/webhooks/nosuch", json={"enabled": True}).status_code == 404
    api("DELETE", f"/events/webhooks/{b['id']}")


@test
def a_failed_delivery_is_tried_again():
    hook = register("/flaky", events=["sandbox.lifecycle.created"])
    sbx = Sandbox.create(timeout=60)
    try:
        got = wait_for(lambda: (lambda d: d if len(d) >= 2 else None)(received("/flaky", sbx.sandbox_id)),
                       timeout=30, what="the second attempt")
        # The same event, a new delivery id.
        assert got[0][1] == got[1][1]
        assert got[0][0]["e2b-delivery-id"] != got[1][0]["e2b-delivery-id"]
    finally:
        sbx.kill()
        api("DELETE", f"/events/webhooks/{hook['id']}")


@test
def a_tenant_sees_and_gets_only_its_own():
    node_hook = register("/node", events=["sandbox.lifecycle.created"])
    t_hook = register("/tenant", events=["sandbox.lifecycle.created"], key=TENANT_KEY)
    # Each sees its own webhook only.
    t_list = api("GET", "/events/webhooks", key=TENANT_KEY).json()
    assert [w["id"] for w in t_list] == [t_hook["id"]], t_list
    assert api("GET", f"/events/webhooks/{node_hook['id']}", key=TENANT_KEY).status_code == 404
    assert api("DELETE", f"/events/webhooks/{node_hook['id']}", key=TENANT_KEY).status_code == 404
    assert t_hook["teamID"] == "acme"
    node_sbx = Sandbox.create(timeout=60)
    t_sbx = Sandbox.create(timeout=60, api_key=TENANT_KEY)
    try:
        wait_for(lambda: received("/tenant", t_sbx.sandbox_id), timeout=30, what="the tenant's event")
        # The node's webhook gets every sandbox's events; the tenant's only its own.
        wait_for(lambda: received("/node", t_sbx.sandbox_id) and received("/node", node_sbx.sandbox_id),
                 timeout=30, what="the node's events")
        ev = received("/tenant", t_sbx.sandbox_id)[0][2]
        assert ev["sandboxTeamId"] == "acme", ev
        # Listing: the tenant's events name only its sandboxes.
        mine = api("GET", "/events/sandboxes", key=TENANT_KEY, params={"limit": 100}).json()
        assert any(e["sandboxId"] == t_sbx.sandbox_id for e in mine), mine
        assert all(e["sandboxTeamId"] == "acme" for e in mine), mine
        other = api("GET", f"/events/sandboxes/{node_sbx.sandbox_id}", key=TENANT_KEY).json()
        assert other == [], other
        assert received("/tenant", node_sbx.sandbox_id) == [], "a tenant got another's event"
    finally:
        node_sbx.kill()
        t_sbx.kill()
        api("DELETE", f"/events/webhooks/{node_hook['id']}")
        api("DELETE", f"/events/webhooks/{t_hook['id']}", key=TENANT_KEY)


if __name__ == "__main__":
    run()
