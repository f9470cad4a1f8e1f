#!/usr/bin/env python3
"""Writes the seed inputs of the three fuzz targets into fuzz/corpus/<target>/ (seed-*).

Only needed to start a corpus from nothing; the committed corpus already holds what the
fuzzers grew from these, minimized. Input layouts: see fuzz/checks/<target>.rs.
"""
import json
import os
import ssl
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def env(flags, payload):
    return bytes([flags]) + struct.pack(">I", len(payload)) + payload


def j(v):
    return json.dumps(v, separators=(",", ":")).encode()


# ---------- agent_request ----------
messages = {
    0: [
        {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"},
                     "cwd": "/home/user"}, "pty": {"size": {"cols": 80, "rows": 24}},
         "tag": "t", "stdin": False},
        {"process": {"cmd": "ls", "args": None}, "stdin": None},
    ],
    1: [{"process": {"pid": 12}}, {"process": {"tag": "x"}}],
    2: [{"process": {"pid": "12"}, "input": {"stdin": "aGVsbG8="}},
        {"process": {"pid": 1}, "input": {"pty": "eA"}}],
    3: [{"process": {"pid": 1}, "signal": "SIGNAL_SIGKILL"}, {"process": {"pid": 1}, "signal": 15}],
    4: [{"process": {"pid": 1}, "pty": {"size": {"cols": "100", "rows": 30.0}}}],
    5: [{"start": {"process": {"pid": 1}}}, {"data": {"input": {"stdin": "YQ-_"}}}, {"keepalive": {}}],
    6: [{"path": "~/a/../b"}, {"path": None}],
    7: [{"source": "a", "destination": "/tmp/b"}],
    8: [{"path": "/home/user", "depth": 2}],
    9: [{"path": "/home/user", "recursive": True, "includeEntry": True, "allow_network_mounts": 1}],
    10: [{"watcherId": "w1"}, {"watcher_id": "w2"}],
    11: [{"event": {"start": {"pid": 1234}}}, {"event": {"data": {"stdout": "aGVsbG8K"}}},
         {"event": {"end": {"exitCode": -1, "status": "signal: killed", "error": ""}}},
         {"event": {"keepalive": {}}}],
    12: [{"processes": [{"config": {"cmd": "/bin/bash", "args": ["-c", "sleep 1"], "envs": {"A": "1"},
                                    "cwd": "/home/user"}, "pid": 7, "tag": "t"}]}],
    13: [{"entry": {"name": "a.txt", "type": "FILE_TYPE_FILE", "path": "/home/user/a.txt", "size": "2",
                    "mode": 420, "permissions": "-rw-r--r--", "owner": "user", "group": "user",
                    "modifiedTime": "2025-01-01T00:00:00.123Z", "metadata": {"k": "v"}}}],
    14: [{"entries": [{"name": "l", "type": "FILE_TYPE_DIRECTORY", "path": "/l", "size": "4",
                       "mode": 493, "symlinkTarget": "/d", "isSymlink": True}]}],
    15: [{"start": {}}, {"filesystem": {"name": "n/f", "type": "EVENT_TYPE_WRITE"}}],
    16: [{"events": [{"name": "a.txt", "type": "EVENT_TYPE_CREATE"}]}],
    17: [[{"name": "a", "type": "file", "path": "/a", "metadata": {"owner": "me"}}]],
    18: [{"version": "0.1.0", "protocol": 1}],
    19: [{}],
}
for ty, bodies in messages.items():
    for i, b in enumerate(bodies):
        put("agent_request", f"msg-{ty}-{i}", bytes([0, ty]) + j(b))
put("agent_request", "msg-empty-body", bytes([0, 6]) + b" \n")
start = j(messages[0][0])
put("agent_request", "stream-start", bytes([1]) + env(0, start))
put("agent_request", "stream-end-only", bytes([1]) + env(2, b"{}"))
stream = (env(0, j({"start": {"process": {"pid": 1}}})) + env(0, j({"data": {"input": {"stdin": "aGk="}}}))
          + env(0, j({"keepalive": {}})) + env(2, b"{}"))
put("agent_request", "client-stream", bytes([2, 7]) + stream)
put("agent_request", "client-stream-compressed", bytes([2, 0]) + env(1, b"x"))
put("agent_request", "headers", bytes([3]) + b"Basic dXNlcjo=\n5000\n30")
put("agent_request", "headers-bad", bytes([3]) + b"Bearer x\n-1\n")
put("agent_request", "query", bytes([4]) + b"path=%2Fhome%2Fuser%2Fa+b.txt&username=root&x=%zz&y")
tcp = (b"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
       b"   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 1 1\n"
       b"   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n")
put("agent_request", "tunnel", bytes([5]) + b"8080\n" + tcp)

# ---------- agent_path ----------
FF = b"\xff"
for i, (home, path) in enumerate([
    ("/home/user", "a/../b"), ("/home/user", "~/x"), ("/home/user", "/../../etc/passwd"),
    ("/home/user", "~"), ("/home/user", "./a/./b//c/"), ("/root", "~//etc"), ("", "../x"),
    ("/a/../b", "c"), ("/home/user", "~user/x"),
]):
    put("agent_path", f"path-{i}", b"\x00" + home.encode() + FF + path.encode())
passwd = b"root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n#c\nbad\n"
group = b"root:x:0:\nuser:x:1000:\nsudo:x:27:user,other\n"
put("agent_path", "passwd-user", b"\x01" + passwd + FF + group + FF + b"user" + FF + b"docs/../a.txt")
put("agent_path", "passwd-uid", b"\x01" + passwd + FF + group + FF + b"1000" + FF + b"~/x")
put("agent_path", "passwd-root", b"\x01" + FF + FF + b"root" + FF + b"x")
put("agent_path", "query", b"\x02path=%2E%2E%2F%2E%2E%2Fetc%2Fshadow&username=user")

# ---------- egress_peek ----------
def client_hello(sni):
    name = sni.encode()
    sni_ext = struct.pack(">HBH", len(name) + 3, 0, len(name)) + name
    exts = b"\x00\x0b\x00\x02\x01\x00" + b"\x00\x00" + struct.pack(">H", len(sni_ext)) + sni_ext
    body = b"\x03\x03" + b"\x07" * 32 + b"\x00" + b"\x00\x02\x13\x01" + b"\x01\x00"
    body += struct.pack(">H", len(exts)) + exts
    hs = b"\x01" + struct.pack(">I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs


def real_client_hello(sni, **kw):
    """The ClientHello of this machine's OpenSSL, as a real client sends it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for k, v in kw.items():
        setattr(ctx, k, v)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = ctx.wrap_bio(inc, out, server_hostname=sni)
    try:
        s.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


ch = client_hello("Api.Example.com")
put("egress_peek", "tls-min", ch)
hs = ch[5:]
put("egress_peek", "tls-two-records",
    b"\x16\x03\x01\x00\x10" + hs[:16] + b"\x16\x03\x01" + struct.pack(">H", len(hs) - 16) + hs[16:])
put("egress_peek", "tls-openssl", real_client_hello("api.example.com"))
put("egress_peek", "tls-openssl-tls12", real_client_hello("www.example.org",
                                                        maximum_version=ssl.TLSVersion.TLSv1_2))
put("egress_peek", "tls-openssl-nosni", real_client_hello(None))
for i, r in enumerate([
    b"GET / HTTP/1.1\r\nHost: Example.com:8080\r\n\r\n",
    b"POST /v1/x HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 2\r\n\r\n{}",
    b"GET http://a.example/ HTTP/1.1\r\nHost: b.example\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
    b"CONNECT b.example:443 HTTP/1.1\r\nHost: b.example:443\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
    b"SSH-2.0-OpenSSH_9.6\r\n",
]):
    put("egress_peek", f"http-{i}", r)

print("seeds written under", os.path.join(HERE, "corpus"), file=sys.stderr)
