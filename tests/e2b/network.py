"""E2B network options with the unmodified `e2b` SDK (sync and async) against Rampart, checked
against the test internet that crates/rampart-cli/tests/e2b_network.rs makes in a network
namespace: host A (E2B_NET_HOST_A at E2B_NET_ADDR_A) and host B (E2B_NET_HOST_B at
E2B_NET_ADDR_B), each serving HTTP on 80 and HTTPS on 443 (a test CA the daemon trusts
upstream), logging every request's headers to E2B_NET_LOG (outside every sandbox).
"""

import json
import os
import time
import uuid

import httpx
from e2b import ALL_TRAFFIC, AsyncSandbox, Sandbox

from harness import run, test, wait_for

A = os.environ["E2B_NET_HOST_A"]
B = os.environ["E2B_NET_HOST_B"]
ADDR_A = os.environ["E2B_NET_ADDR_A"]
ADDR_B = os.environ["E2B_NET_ADDR_B"]
LOG = os.environ["E2B_NET_LOG"]
URL = os.environ["E2B_SANDBOX_URL"]


def reach(sbx, url):
    """The HTTP status curl gets inside the sandbox for url: 200 from the test hosts, 403
    from the egress proxy refusing a plain-HTTP request, 0 for a connection refused or cut.
    """
    r = sbx.commands.run(
        f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 5 {url} || true", timeout=30
    )
    out = r.stdout.strip()
    return int(out) if out.isdigit() else 0


def requests_to(path):
    out = []
    with open(LOG) as f:
        for line in f:
            v = json.loads(line)
            if v["path"] == path:
                out.append({k.lower(): val for k, val in v["headers"]})
    return out


@test
def deny_all_but_one_host():
    sbx = Sandbox.create(network={"allow_out": [A], "deny_out": [ALL_TRAFFIC]}, timeout=120)
    try:
        assert reach(sbx, f"http://{A}/ok") == 200
        assert reach(sbx, f"http://{B}/no") in (0, 403)
        assert reach(sbx, f"http://{ADDR_B}/no") in (0, 403)
        assert requests_to("/no") == [], "a refused request reached a test host"
        info = sbx.get_info()
        assert info.network["allow_out"] == [A], info.network
        assert info.network["deny_out"] == [ALL_TRAFFIC], info.network
    finally:
        sbx.kill()


@test
def selector_callables_and_no_internet():
    sbx = Sandbox.create(
        network={"allow_out": lambda ctx: [ADDR_B], "deny_out": lambda ctx: [ctx.all_traffic]},
        timeout=120,
    )
    try:
        assert reach(sbx, f"http://{ADDR_B}/ip") == 200
        assert reach(sbx, f"http://{ADDR_A}/ip") in (0, 403)
    finally:
        sbx.kill()
    sbx = Sandbox.create(allow_internet_access=False, timeout=120)
    try:
        assert reach(sbx, f"http://{A}/") in (0, 403)
        assert sbx.get_info().allow_internet_access is False
    finally:
        sbx.kill()


@test
def allow_out_wins_over_deny_out():
    # A denied range with an allowed host and an allowed address in it: the allowed ones
    # stay reachable, the rest of the range does not (E2B: allowOut takes precedence).
    net = {"allow_out": [A], "deny_out": [ADDR_A.rsplit(".", 1)[0] + ".0/24"]}
    sbx = Sandbox.create(network=net, timeout=120)
    try:
        assert reach(sbx, f"http://{A}/by-name") == 200
        assert reach(sbx, f"http://{ADDR_B}/by-ip") in (0, 403)
        assert reach(sbx, f"http://{B}/by-name") in (0, 403)
    finally:
        sbx.kill()


@test
def rules_inject_headers_the_sandbox_never_sees():
    secret = "sk-" + uuid.uuid4().hex
    sbx = Sandbox.create(
        network={
            "allow_out": [A, B],
            "deny_out": [ALL_TRAFFIC],
            "rules": {A: [{"transform": {"headers": {"X-Api-Key": secret, "X-Team": "t1"}}}]},
        },
        timeout=120,
    )
    try:
        tag = uuid.uuid4().hex
        assert reach(sbx, f"https://{A}/tls-{tag}") == 200
        assert reach(sbx, f"http://{A}/plain-{tag}") == 200
        # Sent by the sandbox too: replaced, not added to.
        r = sbx.commands.run(
            # B's certificate is the test CA's, which the sandbox does not trust (its HTTPS
            # to B is not intercepted, so it sees B's own certificate).
            f"curl -sSk -H 'X-Api-Key: mine' https://{B}/other-{tag}; "
            f"curl -sS -H 'X-Api-Key: mine' https://{A}/own-{tag}",
            timeout=30,
        )
        assert secret not in r.stdout
        for path in (f"/tls-{tag}", f"/plain-{tag}", f"/own-{tag}"):
            seen = requests_to(path)
            assert seen and seen[0].get("x-api-key") == secret, (path, seen)
            assert seen[0].get("x-team") == "t1", seen
        other = requests_to(f"/other-{tag}")
        assert other and other[0].get("x-api-key") == "mine", other
        # Nowhere inside: not in the environment, not in the files the sandbox can read.
        r = sbx.commands.run(
            f"cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c {secret[:20]} || true",
            timeout=30,
        )
        assert r.stdout.strip() == "0", r.stdout
        info = sbx.get_info()
        assert secret not in json.dumps(info.network), info.network
        assert "X-Api-Key" in json.dumps(info.network["rules"]), info.network
    finally:
        sbx.kill()


@test
def update_network_replaces_the_rules():
    sbx = Sandbox.create(network={"allow_out": [A], "deny_out": [ALL_TRAFFIC]}, timeout=120)
    try:
        assert reach(sbx, f"http://{A}/before") == 200
        assert reach(sbx, f"http://{B}/before") in (0, 403)
        sbx.update_network({"allow_out": [B], "deny_out": [ALL_TRAFFIC],
                            "rules": {B: [{"transform": {"headers": {"X-Upd": "v2"}}}]}})
        assert reach(sbx, f"http://{B}/after-upd") == 200
        assert reach(sbx, f"http://{A}/after-upd") in (0, 403)
        assert requests_to("/after-upd")[0].get("x-upd") == "v2"
        # Fields left out are cleared: no deny list and no rules, so both hosts are
        # reachable (they are on a documentation range, which open mode opens only when
        # allowOut names them).
        sbx.update_network({"allow_out": [A, B]})
        assert reach(sbx, f"http://{A}/open-again") == 200
        assert reach(sbx, f"http://{B}/open-again-b") == 200
        assert requests_to("/open-again-b")[0].get("x-upd") is None
        sbx.update_network({"allow_internet_access": False})
        assert reach(sbx, f"http://{A}/closed") in (0, 403)
        info = sbx.get_info()
        assert "deny_out" not in (info.network or {}), info.network
        assert info.allow_internet_access is False
    finally:
        sbx.kill()
    try:
        Sandbox.update_network(sbx.sandbox_id, {"allow_out": [A]})
        raise AssertionError("update_network of a killed sandbox succeeded")
    except Exception as e:  # noqa: BLE001
        assert "not found" in str(e).lower(), e


def port_get(sbx, port, path="/", token=None):
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": str(port)}
    if token:
        headers["E2B-Traffic-Access-Token"] = token
    return httpx.get(URL + path, headers=headers, timeout=10)


SERVER = (
    "import http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        b = (self.headers.get('Host') or '').encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(b)))\n"
    "        self.end_headers(); self.wfile.write(b)\n"
    "http.server.HTTPServer(('127.0.0.1', 8000), H).serve_forever()\n"
)


def start_server(sbx):
    sbx.files.write("/tmp/host.py", SERVER)
    sbx.commands.run("python3 /tmp/host.py", background=True)
    wait_for(lambda: sbx.commands.run("curl -s localhost:8000/ || true").stdout != "",
             what="the server inside")


@test
def public_traffic_and_request_host_mask():
    sbx = Sandbox.create(
        network={"allow_public_traffic": True, "mask_request_host": "${PORT}-myapp.example.com"},
        timeout=120,
    )
    try:
        start_server(sbx)
        r = port_get(sbx, 8000)
        assert r.status_code == 200, (r.status_code, r.text)
        assert r.text == "8000-myapp.example.com", r.text
        info = sbx.get_info()
        assert info.network["allow_public_traffic"] is True
        assert info.network["mask_request_host"] == "${PORT}-myapp.example.com"
        # envd itself still needs its token.
        h = httpx.post(URL + "/process.Process/List", json={},
                       headers={"E2b-Sandbox-Id": sbx.sandbox_id,
                                "Content-Type": "application/json"}, timeout=10)
        assert h.status_code == 401, h.status_code
    finally:
        sbx.kill()
    sbx = Sandbox.create(network={"allow_public_traffic": False}, timeout=120)
    try:
        start_server(sbx)
        assert port_get(sbx, 8000).status_code == 403
        r = port_get(sbx, 8000, token=sbx.traffic_access_token)
        assert r.status_code == 200 and r.text == "localhost:8000", (r.status_code, r.text)
    finally:
        sbx.kill()


TLS_SERVER = (
    "import http.server, ssl\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        b = ('tls:' + (self.headers.get('Host') or '')).encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(b)))\n"
    "        self.end_headers(); self.wfile.write(b)\n"
    "s = http.server.HTTPServer(('127.0.0.1', 8443), H)\n"
    "c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
    "c.load_cert_chain('/tmp/tls/cert.pem', '/tmp/tls/key.pem')\n"
    "s.socket = c.wrap_socket(s.socket, server_side=True)\n"
    "s.serve_forever()\n"
)


@test
def https_ports_reach_a_tls_server_inside():
    sbx = Sandbox.create(network={"https_ports": [8443]}, timeout=120)
    try:
        assert sbx.get_info().network["https_ports"] == [8443]
        # A self-signed certificate: the proxy encrypts the hop, it verifies nothing.
        sbx.commands.run("mkdir -p /tmp/tls && openssl req -x509 -newkey rsa:2048 -nodes "
                         "-keyout /tmp/tls/key.pem -out /tmp/tls/cert.pem -days 1 "
                         "-subj /CN=sandbox 2>/dev/null")
        sbx.files.write("/tmp/tls.py", TLS_SERVER)
        sbx.commands.run("python3 /tmp/tls.py", background=True)
        wait_for(lambda: sbx.commands.run("curl -sk https://localhost:8443/ || true").stdout != "",
                 what="the TLS server inside")
        r = port_get(sbx, 8443, token=sbx.traffic_access_token)
        assert r.status_code == 200, (r.status_code, r.text)
        assert r.text == "tls:localhost:8443", r.text
        # The same server is not plain HTTP: a port not listed is reached without TLS, so
        # the server refuses what it gets.
        start_server(sbx)
        r = port_get(sbx, 8000, token=sbx.traffic_access_token)
        assert r.status_code == 200 and r.text == "localhost:8000", (r.status_code, r.text)
    finally:
        sbx.kill()
    # A port listed as HTTPS whose server speaks plain HTTP: 502, saying why.
    sbx = Sandbox.create(network={"https_ports": [8000]}, timeout=120)
    try:
        start_server(sbx)
        r = port_get(sbx, 8000, token=sbx.traffic_access_token)
        assert r.status_code == 502 and "TLS" in r.text, (r.status_code, r.text)
    finally:
        sbx.kill()


def tunnels():
    return [(h["target"], h["user"], h["tls"]) for h in requests_to("<socks>")]


@test
def egress_proxy_tunnels_allowed_connections():
    proxy = {"address": f"{ADDR_A}:1080", "username": "u", "password": "p"}
    sbx = Sandbox.create(network={"allow_out": [B], "deny_out": [ALL_TRAFFIC], "egress_proxy": proxy},
                         timeout=120)
    try:
        shown = sbx.get_info().network["egress_proxy"]
        assert shown == {"address": f"{ADDR_A}:1080", "username": "u"}, shown
        before = len(tunnels())
        path = "/via-socks-" + uuid.uuid4().hex[:8]
        assert reach(sbx, f"http://{B}{path}") == 200
        assert len(requests_to(path)) == 1
        # Through the proxy, by the address the policy judged, with its credentials.
        assert tunnels()[before:] == [(f"{ADDR_B}:80", "u", "0")], tunnels()[before:]
        # HTTPS is tunneled as it is (the sandbox does not trust the test CA: -k).
        r = sbx.commands.run(f"curl -sk -o /dev/null -w '%{{http_code}}' --max-time 5 https://{B}/tls-socks || true")
        assert r.stdout.strip() == "200", r.stdout
        assert tunnels()[-1] == (f"{ADDR_B}:443", "u", "0"), tunnels()[-1]
        # What the policy denies never reaches the proxy.
        n = len(tunnels())
        assert reach(sbx, f"http://{A}/denied-not-tunneled") != 200
        assert len(tunnels()) == n
        # A wrong password: the connection fails; it never goes out directly instead.
        sbx.update_network({"allow_out": [B], "deny_out": [ALL_TRAFFIC],
                            "egress_proxy": dict(proxy, password="wrong")})
        path = "/wrong-password-" + uuid.uuid4().hex[:8]
        assert reach(sbx, f"http://{B}{path}") == 0
        assert requests_to(path) == []
        # Cleared by an update that leaves it out: straight out again.
        sbx.update_network({"allow_out": [B], "deny_out": [ALL_TRAFFIC]})
        n = len(tunnels())
        assert reach(sbx, f"http://{B}/direct") == 200
        assert len(tunnels()) == n
        assert "egress_proxy" not in (sbx.get_info().network or {})
    finally:
        sbx.kill()
    # TLS to the proxy: its certificate is checked (the test CA the daemon trusts) against
    # server_name; the SOCKS5 exchange runs inside the TLS session.
    sbx = Sandbox.create(network={"allow_out": [B], "deny_out": [ALL_TRAFFIC],
                                  "egress_proxy": {"address": f"{ADDR_A}:1443", "username": "u",
                                                   "password": "p", "tls": {"server_name": A}}},
                         timeout=120)
    try:
        assert sbx.get_info().network["egress_proxy"]["tls"] == {"server_name": A}
        assert reach(sbx, f"http://{B}/over-tls-proxy") == 200
        assert tunnels()[-1] == (f"{ADDR_B}:80", "u", "1"), tunnels()[-1]
    finally:
        sbx.kill()
    # The daemon dials a caller's proxy only on a public address (or a range the operator
    # allows): loopback, the metadata address, private ranges are refused at create.
    for bad in ["127.0.0.1:1080", "169.254.169.254:80", "10.0.0.1:1080", "localhost:1080"]:
        try:
            Sandbox.create(network={"egress_proxy": {"address": bad}}, timeout=30).kill()
            raise AssertionError(f"egress_proxy {bad} was accepted")
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001
            assert "not a public address" in str(e), (bad, e)


@test
def bad_network_options_are_refused():
    for net, word in [
        ({"https_ports": [49983]}, "httpsPorts"),
        ({"allow_out": ["foo*.com"], "deny_out": [ALL_TRAFFIC]}, "foo*.com"),
        ({"rules": {ADDR_A: [{"transform": {"headers": {"a": "b"}}}]}}, "addresses"),
    ]:
        try:
            Sandbox.create(network=net, timeout=30).kill()
            raise AssertionError(f"{net} was accepted")
        except AssertionError:
            raise
        except Exception as e:  # noqa: BLE001
            assert word in str(e), (net, e)


@test
async def async_network_options_and_update():
    sbx = await AsyncSandbox.create(
        network={"allow_out": [A], "deny_out": [ALL_TRAFFIC],
                 "rules": {A: [{"transform": {"headers": {"X-Async": "yes"}}}]}},
        timeout=120,
    )
    try:
        tag = uuid.uuid4().hex
        r = await sbx.commands.run(f"curl -sS -o /dev/null -w '%{{http_code}}' https://{A}/async-{tag}")
        assert r.stdout == "200", r.stdout
        assert requests_to(f"/async-{tag}")[0].get("x-async") == "yes"
        await sbx.update_network({"allow_out": [B], "deny_out": [ALL_TRAFFIC]})
        r = await sbx.commands.run(
            f"curl -sS -o /dev/null -w '%{{http_code}}' --max-time 5 http://{A}/x || true")
        assert r.stdout.strip() in ("000", "403", ""), r.stdout
        r = await sbx.commands.run(f"curl -sS -o /dev/null -w '%{{http_code}}' http://{B}/async-b-{tag}")
        assert r.stdout == "200", r.stdout
        assert requests_to(f"/async-b-{tag}")[0].get("x-async") is None
        info = await sbx.get_info()
        assert info.network["allow_out"] == [B]
    finally:
        await sbx.kill()


if __name__ == "__main__":
    run()
