"""Host-form URLs over HTTPS with the unmodified `e2b` SDK (`crates/rampart-cli/tests/e2b_tls.rs`).

The daemon serves HTTPS on 127.0.0.1:RAMPART_TLS_PORT with a wildcard certificate for
`*.test.example` from a test CA (SSL_CERT_FILE, which the SDK trusts), and `--domain
test.example`. Names under test.example are this script's to resolve: a CONNECT proxy here
(HTTPS_PROXY, which the SDK's transport follows) sends every `<name>.test.example:443` to the
daemon and refuses every other destination, so nothing leaves the machine. The SDK is
configured by E2B_API_KEY and E2B_API_URL=https://api.test.example only: no E2B_SANDBOX_URL
and no E2B_DOMAIN, so it reaches envd at `https://49983-<id>.<domain>` with the domain the
daemon's create answered.
"""

import os
import select
import socket
import socketserver
import ssl
import threading

import httpx
from e2b import AsyncSandbox, Sandbox

from harness import run, test, wait_for

DOMAIN = "test.example"
DAEMON = ("127.0.0.1", int(os.environ["RAMPART_TLS_PORT"]))
CA = os.environ["SSL_CERT_FILE"]

# Every CONNECT the proxy saw: (host, port, allowed).
SEEN = []


class Connect(socketserver.StreamRequestHandler):
    def handle(self):
        line = self.rfile.readline().decode("latin-1").split()
        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
            pass
        if len(line) < 2 or line[0] != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            return
        host, _, port = line[1].rpartition(":")
        ok = port == "443" and (host == DOMAIN or host.endswith("." + DOMAIN))
        SEEN.append((host, port, ok))
        if not ok:
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        up = socket.create_connection(DAEMON)
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        down = self.connection
        try:
            while True:
                r, _, _ = select.select([down, up], [], [])
                for s in r:
                    b = s.recv(65536)
                    if not b:
                        return
                    (up if s is down else down).sendall(b)
        finally:
            up.close()


class Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


PROXY = Proxy(("127.0.0.1", 0), Connect)
threading.Thread(target=PROXY.serve_forever, daemon=True).start()
PROXY_URL = f"http://127.0.0.1:{PROXY.server_address[1]}"
os.environ["HTTPS_PROXY"] = PROXY_URL
os.environ.pop("NO_PROXY", None)

# A connection per request: a kept-alive one to a port whose sandbox was just killed can be
# cut as it is reused, which would be the client's race, not the daemon's answer.
WEB = httpx.Client(
    proxy=PROXY_URL,
    verify=ssl.create_default_context(cafile=CA),
    timeout=30,
    limits=httpx.Limits(max_keepalive_connections=0),
)


def serve_port(sbx, port=8000):
    """A web server in the sandbox on `port`, answering `hello <Host>` (wait until it does)."""
    sbx.files.write(
        "/tmp/web.py",
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        b = ('hello ' + self.headers.get('Host', '')).encode()\n"
        "        self.send_response(200)\n"
        "        self.send_header('Content-Length', str(len(b)))\n"
        "        self.end_headers()\n"
        "        self.wfile.write(b)\n"
        f"http.server.ThreadingHTTPServer(('127.0.0.1', {port}), H).serve_forever()\n",
    )
    sbx.commands.run("python3 /tmp/web.py", background=True)
    wait_for(
        lambda: sbx.commands.run(f"curl -s localhost:{port}/ || true").stdout.startswith("hello"),
        what="the server inside",
    )


@test
def envd_is_reached_at_the_host_form_over_https():
    before = len(SEEN)
    sbx = Sandbox.create(timeout=120)
    try:
        assert sbx.sandbox_domain == DOMAIN, sbx.sandbox_domain
        assert sbx.envd_api_url == f"https://49983-{sbx.sandbox_id}.{DOMAIN}", sbx.envd_api_url
        r = sbx.commands.run("echo hello over tls; id -un")
        assert r.stdout == "hello over tls\nuser\n", r.stdout
        sbx.files.write("/home/user/tls/a.txt", "written over https")
        assert sbx.files.read("/home/user/tls/a.txt") == "written over https"
        assert sbx.files.list("/home/user/tls")[0].name == "a.txt"
        assert sbx.is_running()
        envd = f"49983-{sbx.sandbox_id}.{DOMAIN}"
        hosts = {h for h, _, ok in SEEN[before:] if ok}
        assert envd in hosts and f"api.{DOMAIN}" in hosts, SEEN[before:]
        assert all(ok for _, _, ok in SEEN[before:]), SEEN[before:]
    finally:
        sbx.kill()


@test
async def the_async_sdk_too():
    sbx = await AsyncSandbox.create(timeout=120)
    try:
        assert sbx.envd_api_url == f"https://49983-{sbx.sandbox_id}.{DOMAIN}"
        r = await sbx.commands.run("echo async")
        assert r.stdout == "async\n", r.stdout
        await sbx.files.write("/tmp/b.txt", b"\x00\x01bytes")
        assert await sbx.files.read("/tmp/b.txt", format="bytes") == b"\x00\x01bytes"
    finally:
        await sbx.kill()


@test
def a_port_is_public_by_default_and_envd_is_not():
    sbx = Sandbox.create(timeout=120)
    try:
        serve_port(sbx)
        host = sbx.get_host(8000)
        assert host == f"8000-{sbx.sandbox_id}.{DOMAIN}", host
        r = WEB.get(f"https://{host}/")
        assert r.status_code == 200, (r.status_code, r.text)
        # The server sees the Host it listens at, as behind E2B's proxy without a mask.
        assert r.text == "hello localhost:8000", r.text
        # envd's port and the code interpreter's still need the token.
        r = WEB.get(f"https://{sbx.get_host(49983)}/files", params={"path": "/etc/hostname"})
        assert r.status_code == 401, (r.status_code, r.text)
        r = WEB.get(f"https://{sbx.get_host(49999)}/contexts")
        assert r.status_code == 403, (r.status_code, r.text)
        # A port nothing listens on: the sandbox is there, the port is not open.
        r = WEB.get(f"https://{sbx.get_host(8001)}/")
        assert r.status_code == 502, (r.status_code, r.text)
    finally:
        sbx.kill()


@test
def a_private_sandbox_needs_the_traffic_token():
    sbx = Sandbox.create(network={"allow_public_traffic": False}, timeout=120)
    try:
        serve_port(sbx)
        url = f"https://{sbx.get_host(8000)}/"
        r = WEB.get(url)
        assert r.status_code == 403, (r.status_code, r.text)
        r = WEB.get(url, headers={"e2b-traffic-access-token": "not-the-token"})
        assert r.status_code == 403, (r.status_code, r.text)
        token = sbx.traffic_access_token
        assert token
        r = WEB.get(url, headers={"e2b-traffic-access-token": token})
        assert r.status_code == 200 and r.text == "hello localhost:8000", (r.status_code, r.text)
    finally:
        sbx.kill()


@test
def other_names_reach_no_sandbox():
    sbx = Sandbox.create(timeout=120)
    try:
        serve_port(sbx)
        good = f"https://{sbx.get_host(8000)}/"
        assert WEB.get(good).status_code == 200
        # A Host under another domain (sent to the daemon over a connection named for this
        # one) is not the daemon's to route: nothing answers that path.
        for other in (f"8000-{sbx.sandbox_id}.other.example", f"8000-{sbx.sandbox_id}.test.example.evil"):
            r = WEB.get(good + "probe.txt", headers={"Host": other})
            assert r.status_code == 404, (other, r.status_code, r.text)
            assert not r.text.startswith("hello"), (other, r.text)
            envd = other.replace("8000-", "49983-")
            r = WEB.post(
                good + "process.Process/List",
                json={},
                headers={"Host": envd, "X-Access-Token": sbx._envd_access_token},
            )
            assert r.status_code == 404, (envd, r.status_code, r.text)
        # An id no sandbox has: refused, never a server's answer.
        r = WEB.get(f"https://8000-zzzzzzzzzzzzzzzzzzzzzzzzzz.{DOMAIN}/")
        assert r.status_code in (401, 404, 502), (r.status_code, r.text)
        assert not r.text.startswith("hello"), r.text
        # The proxy here refuses what is not under the test domain; the SDK never asked.
        assert all(ok for _, _, ok in SEEN), [s for s in SEEN if not s[2]]
    finally:
        sbx.kill()
    # A killed sandbox's port is gone.
    r = WEB.get(good)
    assert r.status_code in (401, 404, 502), (r.status_code, r.text)
    assert not r.text.startswith("hello"), r.text


# A server that answers with the header names of the request as they came on the wire.
RAW_SERVER = r"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8002))
s.listen(8)
while True:
    c, _ = s.accept()
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    lines = head.split(b"\r\n")[1:]
    names = b",".join(l.split(b":")[0] for l in lines if b":" in l)
    c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(names) + names)
    c.close()
"""


@test
def the_host_form_is_e2b_s_proxy():
    # maskRequestHost: the server inside sees the masked Host, written as clients write it.
    sbx = Sandbox.create(network={"mask_request_host": "${PORT}-myapp.example.com"}, timeout=120)
    try:
        serve_port(sbx)
        r = WEB.get(f"https://{sbx.get_host(8000)}/")
        assert r.status_code == 200 and r.text == "hello 8000-myapp.example.com", (
            r.status_code,
            r.text,
        )
        sbx.files.write("/tmp/raw.py", RAW_SERVER)
        sbx.commands.run("python3 /tmp/raw.py", background=True)
        wait_for(
            lambda: sbx.commands.run("curl -s localhost:8002/ || true").stdout != "",
            what="the raw server inside",
        )
        r = WEB.get(f"https://{sbx.get_host(8002)}/")
        assert r.status_code == 200 and "Host" in r.text.split(","), (r.status_code, r.text)
    finally:
        sbx.kill()
    # A killed sandbox's port: E2B's 502 with its body.
    r = WEB.get(f"https://{sbx.get_host(8000)}/")
    assert r.status_code == 502, (r.status_code, r.text)
    assert r.json()["sandboxId"] == sbx.sandbox_id, r.text
    # A paused autoResume sandbox is woken by a request to its port.
    sbx = Sandbox.create(
        lifecycle={"on_timeout": "pause", "auto_resume": True}, timeout=120
    )
    try:
        serve_port(sbx)
        sbx.pause()
        assert sbx.get_info().state.value == "paused", sbx.get_info().state
        r = WEB.get(f"https://{sbx.get_host(8000)}/")
        assert r.status_code == 200 and r.text.startswith("hello"), (r.status_code, r.text)
        assert sbx.get_info().state.value == "running", sbx.get_info().state
    finally:
        sbx.kill()


if __name__ == "__main__":
    run()
