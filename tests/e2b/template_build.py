"""E2B's template builds (`Template().build()`, tags, `Template.exists`, list, delete) with the
unmodified SDK (`e2b==2.63.0`) against Rampart.

Builds run on Rampart's builder; the default tests stack on the built-in `base` (no network
needed but the package registries' for nothing here), so they are fast. `debian_dockerfile`
(run only when named on the command line) builds `FROM debian:bookworm` through mmdebstrap
and needs deb.debian.org.

Each test prints PASS/FAIL (tests/e2b/harness.py).
"""

import os
import sys
import tempfile
import time

from harness import run, test

from e2b import (
    AsyncSandbox,
    AsyncTemplate,
    Sandbox,
    Template,
    wait_for_file,
    wait_for_port,
    wait_for_process,
    wait_for_timeout,
    wait_for_url,
)
from e2b.api.client.api.templates import delete_templates_template_id, get_templates
from e2b.api.client_sync import get_api_client
from e2b.connection_config import ConnectionConfig
from e2b.exceptions import BuildException

NAME = f"sdk-tpl-{os.getpid()}"
CHILD = f"{NAME}-child"
CTX = tempfile.mkdtemp(prefix="rampart-e2b-ctx-")
STATE = {}


def make_context():
    os.makedirs(os.path.join(CTX, "app", "lib"), exist_ok=True)
    with open(os.path.join(CTX, "app", "main.py"), "w") as f:
        f.write("print('hello from the template')\n")
    with open(os.path.join(CTX, "app", "lib", "util.txt"), "w") as f:
        f.write("util\n")
    # Unique per run: the first build is a cold one even on a daemon that built this before.
    with open(os.path.join(CTX, "app", "run-id.txt"), "w") as f:
        f.write(NAME + "\n")
    # A relative symlink: copied as a link (resolve_symlinks defaults to False).
    os.symlink("main.py", os.path.join(CTX, "app", "entry.py"))
    with open(os.path.join(CTX, "config.json"), "w") as f:
        f.write('{"mode": "sdk"}\n')
    with open(os.path.join(CTX, "data.txt"), "w") as f:
        f.write("data\n")
    # A symlink resolved at upload (resolve_symlinks=True): a regular file arrives.
    os.symlink("data.txt", os.path.join(CTX, "data-link.txt"))


def template():
    return (
        Template(file_context_path=CTX)
        .from_template("base")
        .set_envs({"APP_MODE": "sdk", "APP_PORT": "8123"})
        .copy("app", "/opt/app", user="root")
        .copy("config.json", "/etc/app/config.json", user="root", mode=0o644)
        .copy("data.txt", "/home/user/data/", mode=0o640)
        .copy("data-link.txt", "/home/user/resolved.txt", resolve_symlinks=True)
        .run_cmd("echo built > /opt/marker && id -un > /opt/who-root", user="root")
        .run_cmd(["id -un > /home/user/who", "echo $APP_MODE > /home/user/env"])
        .make_dir("/opt/made", user="root")
        .set_workdir("/srv/work")
        .run_cmd("pwd > /tmp/build-pwd && id -un >> /tmp/build-pwd", user="root")
        .set_user("user")
        .set_start_cmd(
            "python3 -m http.server 8123 --directory /opt/app", wait_for_port(8123)
        )
    )


def build(t, name, **kw):
    logs = []
    t0 = time.monotonic()
    info = Template.build(t, name, on_build_logs=logs.append, **kw)
    secs = time.monotonic() - t0
    messages = [e.message for e in logs]
    return info, messages, secs


@test
def build_from_base():
    make_context()
    assert not Template.exists(NAME), "the template exists before its build"
    info, logs, secs = build(template(), NAME)
    print(f"  first build: {secs:.2f} s", flush=True)
    assert info.template_id == NAME, info
    assert info.name == NAME
    assert info.tags == ["default"], info.tags
    assert len(info.build_id) == 36, info.build_id
    assert any(m.startswith("Uploaded 'app'") for m in logs), logs
    done = [m for m in logs if m.startswith("DONE [builder")]
    assert len(done) >= 6, logs  # the layer steps ran
    assert not any(m.startswith("CACHED [builder") and "run " in m for m in logs), logs
    assert any("Template is ready" in m for m in logs), logs
    STATE["first"] = info
    STATE["first_secs"] = secs


@test
def second_build_is_served_from_the_cache():
    info, logs, secs = build(template(), NAME)
    print(f"  second build: {secs:.2f} s", flush=True)
    # Every upload is known, every layer step comes from the cache.
    assert any(m.startswith("Skipping upload of 'app', already cached") for m in logs), logs
    assert not any(m.startswith("Uploaded ") for m in logs), logs
    assert not any(m.startswith("DONE [builder") for m in logs), [
        m for m in logs if m.startswith("DONE")
    ]
    cached = [m for m in logs if m.startswith("CACHED [builder")]
    assert len(cached) >= 10, cached
    assert any("steps from the cache" in m for m in logs), logs
    assert info.build_id != STATE["first"].build_id
    # skip_cache rebuilds every step.
    info2, logs2, _ = build(template(), NAME, skip_cache=True)
    assert not any(
        m.startswith("CACHED [builder") and "run " in m for m in logs2
    ), logs2
    assert any(m.startswith("DONE [builder") for m in logs2), logs2


@test
def exists_and_aliases():
    assert Template.exists(NAME)
    assert Template.alias_exists(NAME)
    assert not Template.exists(f"{NAME}-nope")


@test
def tags_assign_list_remove():
    r = Template.assign_tags(f"{NAME}:default", ["stable", "v1"])
    assert sorted(r.tags) == ["stable", "v1"], r
    tags = {t.tag: t for t in Template.get_tags(NAME)}
    assert set(tags) == {"default", "stable", "v1"}, tags
    assert str(tags["stable"].build_id) == str(tags["default"].build_id)
    Template.remove_tags(NAME, "v1")
    assert {t.tag for t in Template.get_tags(NAME)} == {"default", "stable"}
    # A build with a tag in its name and more tags.
    t = (
        Template()
        .from_template(f"{NAME}:stable")
        .run_cmd("echo child > /opt/child", user="root")
        .set_start_cmd("touch /tmp/started; exec sleep infinity", wait_for_file("/tmp/started"))
    )
    info, logs, _ = build(t, f"{CHILD}:v2", tags=["latest"])
    assert info.tags == ["v2", "latest"], info.tags
    assert {x.tag for x in Template.get_tags(CHILD)} == {"v2", "latest"}


@test
def sandbox_of_the_template_has_every_step():
    sbx = Sandbox.create(template=NAME, timeout=120)
    try:
        def sh(cmd, **kw):
            return sbx.commands.run(cmd, **kw).stdout.strip()

        assert sh("cat /opt/marker") == "built"
        assert sh("cat /opt/who-root") == "root"
        assert sh("cat /home/user/who") == "user"
        assert sh("cat /home/user/env") == "sdk"
        assert sh("echo $APP_MODE $APP_PORT") == "sdk 8123"
        assert sh("cat /opt/app/main.py") == "print('hello from the template')"
        assert sh("cat /opt/app/lib/util.txt") == "util"
        assert sh("cat /opt/app/run-id.txt") == NAME
        assert sh("readlink /opt/app/entry.py") == "main.py"
        assert sh("cat /etc/app/config.json") == '{"mode": "sdk"}'
        assert sh("stat -c '%U %a' /home/user/data/data.txt") == "user 640"
        assert sh("stat -c '%U %a' /etc/app/config.json") == "root 644"
        assert sh("test -L /home/user/resolved.txt || cat /home/user/resolved.txt") == "data"
        assert sh("test -d /opt/made && echo yes") == "yes"
        assert sh("cat /tmp/build-pwd") == "/srv/work\nroot"
        # The template's user and workdir.
        assert sh("whoami") == "user"
        assert sh("pwd") == "/srv/work"
        # The start command ran and was ready before the create returned.
        out = sh(
            "python3 -c \"import urllib.request;"
            "print(urllib.request.urlopen('http://127.0.0.1:8123/main.py').read().decode().strip())\""
        )
        assert out == "print('hello from the template')", out
        # The sandbox writes over the template's files (the layers stay read-only).
        sbx.files.write("/home/user/who", "changed")
        assert sbx.files.read("/home/user/who") == "changed"
    finally:
        sbx.kill()
    # A new sandbox of the template sees the template, not the last one's writes.
    sbx = Sandbox.create(template=f"{NAME}:stable", timeout=60)
    try:
        assert sbx.commands.run("cat /home/user/who").stdout.strip() == "user"
    finally:
        sbx.kill()


@test
def sandbox_of_a_tagged_child_template():
    sbx = Sandbox.create(template=f"{CHILD}:v2", timeout=60)
    try:
        assert sbx.commands.run("cat /opt/child").stdout.strip() == "child"
        assert sbx.commands.run("cat /opt/marker").stdout.strip() == "built"
        assert sbx.commands.run("test -f /tmp/started && echo ok").stdout.strip() == "ok"
    finally:
        sbx.kill()
    sbx = Sandbox.create(template=f"{CHILD}:latest", timeout=60)
    sbx.kill()


@test
def ready_checks_of_the_sdk():
    # wait_for_process / wait_for_url / wait_for_timeout, each as a template's ready check.
    for i, ready in enumerate(
        [
            wait_for_process("sleep"),
            wait_for_url("http://127.0.0.1:8124/", 200),
            wait_for_timeout(1000),
        ]
    ):
        start = (
            "python3 -m http.server 8124"
            if i == 1
            else "exec sleep infinity"
        )
        t = Template().from_template("base").set_start_cmd(start, ready)
        name = f"{NAME}-ready{i}"
        build(t, name)
        sbx = Sandbox.create(template=name, timeout=60)
        try:
            procs = sbx.commands.run("ps -eo args").stdout
            assert ("http.server" if i == 1 else "sleep infinity") in procs, procs
        finally:
            sbx.kill()
        Template_delete(name)


@test
async def async_build_exists_and_sandbox():
    name = f"{NAME}-async"
    t = (
        AsyncTemplate()
        .from_template("base")
        .run_cmd("echo async > /opt/async", user="root")
        .set_envs({"ASYNC_BUILD": "1"})
    )
    logs = []
    info = await AsyncTemplate.build(t, name, on_build_logs=logs.append)
    assert info.template_id == name
    assert any(e.message.startswith("DONE [builder") for e in logs), [e.message for e in logs]
    assert await AsyncTemplate.exists(name)
    tags = await AsyncTemplate.get_tags(name)
    assert [x.tag for x in tags] == ["default"], tags
    sbx = await AsyncSandbox.create(template=name, timeout=60)
    try:
        r = await sbx.commands.run("cat /opt/async; echo $ASYNC_BUILD")
        assert r.stdout.split() == ["async", "1"], r.stdout
    finally:
        await sbx.kill()
    assert Template_delete(name) == 204
    assert not await AsyncTemplate.exists(name)


@test
def code_interpreter_template_of_your_own():
    # E2B's way to customize the code interpreter: a template built on code-interpreter-v1.
    # Its sandboxes run the interpreter's server, with what the build added.
    from e2b_code_interpreter import Sandbox as CodeInterpreter

    name = f"{NAME}-ci"
    t = (
        Template()
        .from_template("code-interpreter-v1")
        .run_cmd("mkdir -p /home/user/lib && printf 'ANSWER = 42\\n' > /home/user/lib/mymod.py")
        .set_envs({"PYTHONPATH": "/home/user/lib", "CI_BUILD": "custom"})
    )
    info, logs, _ = build(t, name)
    assert info.template_id == name
    sbx = CodeInterpreter.create(template=name, timeout=120)
    try:
        ex = sbx.run_code("import mymod, os; mymod.ANSWER * 2")
        assert ex.error is None, ex.error
        assert ex.text == "84", ex.text
        ex = sbx.run_code("os.environ['CI_BUILD']")
        assert ex.text == "custom", ex.text
        # A context of another language works as in code-interpreter-v1.
        ex = sbx.run_code("echo from-bash", language="bash")
        assert "from-bash" in "".join(ex.logs.stdout), ex
        # The interpreter's server is one of its listed processes.
        assert any(p.tag == "code-interpreter" for p in sbx.commands.list()), sbx.commands.list()
    finally:
        sbx.kill()
    assert Template_delete(name) == 204


@test
def failures_are_reported():
    # An image from a registry this host cannot reach: a clear error naming it.
    try:
        Template.build(Template().from_image("registry.invalid/app:1"), f"{NAME}-py")
        raise AssertionError("a registry.invalid build succeeded")
    except BuildException as e:
        assert "cannot reach registry.invalid" in str(e), e
    # A failing step: the error names it; nothing is tagged.
    t = Template().from_template("base").run_cmd("echo about to fail; exit 3")
    try:
        Template.build(t, f"{NAME}-fail")
        raise AssertionError("a failing build succeeded")
    except BuildException as e:
        assert "exited with status 3" in str(e), e
    assert not Template.exists(f"{NAME}-fail")


def Template_delete(name):
    client = get_api_client(ConnectionConfig())
    r = delete_templates_template_id.sync_detailed(name, client=client)
    return r.status_code


@test
def list_and_delete():
    client = get_api_client(ConnectionConfig())
    r = get_templates.sync_detailed(client=client)
    assert r.status_code == 200, r.content
    names = {t.template_id for t in r.parsed}
    assert {NAME, CHILD} <= names, names
    assert Template_delete(CHILD) == 204
    assert Template_delete(NAME) == 204
    assert Template_delete(NAME) == 404
    assert not Template.exists(NAME)
    assert not Template.exists(CHILD)
    r = get_templates.sync_detailed(client=client)
    names = {t.template_id for t in r.parsed}
    assert NAME not in names and CHILD not in names, names


def debian_dockerfile():
    """FROM debian:bookworm through mmdebstrap, from a Dockerfile."""
    with open(os.path.join(CTX, "hello.txt"), "w") as f:
        f.write("hello from debian\n")
    dockerfile = (
        "FROM debian:bookworm\n"
        "ENV GREETING=moin\n"
        "RUN echo \"$GREETING\" > /etc/greeting\n"
        "WORKDIR /app\n"
        "COPY hello.txt /app/\n"
        "RUN chmod 0644 /app/hello.txt\n"
        "USER user\n"
        "CMD [\"sleep\", \"infinity\"]\n"
    )
    name = f"{NAME}-debian"
    t = Template(file_context_path=CTX).from_dockerfile(dockerfile)
    info, logs, secs = build(t, name)
    print(f"  debian:bookworm build: {secs:.1f} s", flush=True)
    _, logs2, secs2 = build(t, name)
    print(f"  debian:bookworm rebuild: {secs2:.2f} s", flush=True)
    assert not any(m.startswith("DONE [builder") for m in logs2), logs2
    sbx = Sandbox.create(template=name, timeout=120)
    try:
        def sh(cmd):
            return sbx.commands.run(cmd).stdout.strip()

        assert "bookworm" in sh("cat /etc/os-release"), sh("cat /etc/os-release")
        assert sh("cat /etc/greeting") == "moin"
        assert sh("cat /app/hello.txt") == "hello from debian"
        assert sh("whoami") == "user"
        assert sh("pwd") == "/app"
        assert sh("sudo -n id -un") == "root"
    finally:
        sbx.kill()
    assert Template_delete(name) == 204



# Images from a registry: a registry served by this script (HTTPS with a test CA, Docker
# Hub's token flow, blobs redirected elsewhere, an index of two platforms), which the daemon
# knows as its mirror of docker.io (RAMPART_REGISTRY_MIRRORS, RAMPART_REGISTRY_CA); the
# image is the sample OCI layout at REGISTRY_LAYOUT. Run when "registry" is named.
REGISTRY = {"log": [], "server": None}


def start_registry():
    import base64
    import hashlib
    import http.server
    import json
    import platform
    import ssl
    import threading
    import urllib.parse

    layout = os.environ["REGISTRY_LAYOUT"]
    port = int(os.environ["REGISTRY_PORT"])
    blobs = os.path.join(layout, "blobs", "sha256")
    index = json.load(open(os.path.join(layout, "index.json")))
    manifest_desc = index["manifests"][0]
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    other = "arm64" if arch != "arm64" else "amd64"
    # The tag of library/python: an index naming this host's platform and another one
    # whose manifest does not exist (a client that picks it fails).
    top = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": "sha256:" + "0" * 64, "size": 100,
             "platform": {"os": "linux", "architecture": other}},
            dict(manifest_desc, platform={"os": "linux", "architecture": arch}),
        ],
    }).encode()
    top_digest = "sha256:" + hashlib.sha256(top).hexdigest()
    # liar/app:1: a manifest whose new layer is longer than its descriptor says.
    import io as _io
    import tarfile

    buf = _io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        data = os.urandom(4096)
        ti = tarfile.TarInfo("extra.bin")
        ti.size = len(data)
        tf.addfile(ti, _io.BytesIO(data))
    extra_layer = buf.getvalue()
    extra_digest = "sha256:" + hashlib.sha256(extra_layer).hexdigest()
    real = json.loads(open(os.path.join(blobs, manifest_desc["digest"].split(":", 1)[1]), "rb").read())
    real["layers"].append({"mediaType": "application/vnd.oci.image.layer.v1.tar",
                           "digest": extra_digest, "size": 100})
    liar = json.dumps(real).encode()
    extra_blobs = {extra_digest: extra_layer}
    base = f"https://127.0.0.1:{port}"
    private = {"private/app"}
    login = ("puller", "s3cret")
    ecr_login = "Basic " + base64.b64encode(b"AWS:ecr-pass").decode()

    def blob(d):
        if d in extra_blobs:
            return extra_blobs[d]
        p = os.path.join(blobs, d.split(":", 1)[1])
        return open(p, "rb").read() if os.path.isfile(p) else None

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send(self, code, body=b"", ctype="application/json", headers=()):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def error(self, code, err, msg, headers=()):
            body = json.dumps({"errors": [{"code": err, "message": msg}]}).encode()
            self.send(code, body, headers=headers)

        def do_POST(self):
            # ECR's GetAuthorizationToken, its Signature Version 4 checked as AWS checks it.
            u = urllib.parse.urlparse(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            REGISTRY["log"].append((u.path, self.headers.get("Authorization", "")))
            if not ecr_signature_ok(self, u.path, body):
                return self.send(400, json.dumps({
                    "__type": "com.amazon.coral.service#UnrecognizedClientException",
                    "message": "The security token included in the request is invalid."}).encode())
            token = base64.b64encode(b"AWS:ecr-pass").decode()
            return self.send(200, json.dumps({"authorizationData": [
                {"authorizationToken": token, "expiresAt": 0, "proxyEndpoint": base}]}).encode())

        def do_GET(self):
            u = urllib.parse.urlparse(self.path)
            REGISTRY["log"].append((u.path, self.headers.get("Authorization", "")))
            if u.path == "/token":
                q = urllib.parse.parse_qs(u.query)
                repo = q.get("scope", [""])[0].split(":")[1]
                auth = self.headers.get("Authorization", "")
                user = None
                if auth.startswith("Basic "):
                    u_, _, p_ = base64.b64decode(auth[6:]).decode().partition(":")
                    if (u_, p_) != login:
                        return self.error(401, "UNAUTHORIZED", "bad user or password")
                    user = u_
                if repo in private and user is None:
                    return self.error(401, "UNAUTHORIZED", "log in to pull")
                return self.send(200, json.dumps({"token": f"t:{repo}:{user or ''}"}).encode())
            if u.path.startswith("/cdn/"):
                b = blob(u.path[5:])
                return self.send(200, b, "application/octet-stream") if b else self.send(404)
            parts = u.path.split("/")
            if len(parts) < 5 or parts[1] != "v2":
                return self.send(404)
            repo, kind, ref = "/".join(parts[2:-2]), parts[-2], parts[-1]
            tok = self.headers.get("Authorization", "")
            if repo == "ecr/app":
                # As ECR does: Basic auth with the login GetAuthorizationToken gave.
                if tok != ecr_login:
                    return self.error(401, "DENIED", "Your authorization token has expired.",
                                      [("WWW-Authenticate", f'Basic realm="{base}/",service="ecr.amazonaws.com"')])
                tok = f"Bearer t:{repo}:AWS"
            want = f"Bearer t:{repo}:"
            if not tok.startswith(want) or (repo in private and tok == want):
                realm = f'Bearer realm="{base}/token",service="test-registry",scope="repository:{repo}:pull"'
                return self.error(401, "UNAUTHORIZED", "authentication required",
                                  [("WWW-Authenticate", realm)])
            if repo == "liar/app" and kind == "manifests":
                return self.send(200, liar, "application/vnd.oci.image.manifest.v1+json")
            if repo == "loop/app":
                # A redirect to itself, for ever.
                return self.send(307, headers=[("Location", f"{base}{u.path}")])
            if repo == "old/app" and kind == "manifests":
                old = json.dumps({"schemaVersion": 1, "name": repo, "tag": ref,
                                  "fsLayers": [{"blobSum": manifest_desc["digest"]}]}).encode()
                return self.send(200, old, "application/vnd.docker.distribution.manifest.v1+prettyjws")
            if repo not in ("library/python", "private/app", "ecr/app", "liar/app"):
                return self.error(404, "NAME_UNKNOWN", "repository name not known to registry")
            if kind == "manifests":
                if ref in ("3", "1"):
                    return self.send(200, top, "application/vnd.oci.image.index.v1+json")
                if ref == top_digest:
                    return self.send(200, top, "application/vnd.oci.image.index.v1+json")
                b = blob(ref) if ref.startswith("sha256:") else None
                if b is None:
                    return self.error(404, "MANIFEST_UNKNOWN", "manifest unknown")
                return self.send(200, b, "application/vnd.oci.image.manifest.v1+json")
            if kind == "blobs":
                if blob(ref) is None:
                    return self.error(404, "BLOB_UNKNOWN", "blob unknown to registry")
                # As Docker Hub does: the blob is served elsewhere.
                return self.send(307, headers=[("Location", f"{base}/cdn/{ref}")])
            return self.send(404)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.environ["REGISTRY_CERT"], os.environ["REGISTRY_KEY"])
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    REGISTRY["server"] = srv
    REGISTRY["layers"] = [
        l["digest"]
        for l in json.loads(blob(manifest_desc["digest"]))["layers"]
    ]


ECR_KEY = ("AKIDTEST", "ecr-test-secret")


def ecr_signature_ok(req, path, body):
    """Checks a request's AWS Signature Version 4 (service ecr) with ECR_KEY."""
    import hashlib
    import hmac
    import re

    auth = req.headers.get("Authorization", "")
    m = re.fullmatch(
        r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([a-z0-9-]+)/ecr/aws4_request, "
        r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})", auth)
    if not m or m.group(1) != ECR_KEY[0]:
        return False
    date, region, signed, sig = m.group(2), m.group(3), m.group(4).split(";"), m.group(5)
    if not {"host", "x-amz-date", "x-amz-target"} <= set(signed):
        return False
    if req.headers.get("X-Amz-Target") != "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken":
        return False
    amz_date = req.headers.get("X-Amz-Date", "")
    canonical = "\n".join([
        "POST", path, "",
        "".join(f"{h}:{req.headers.get(h, '').strip()}\n" for h in signed),
        ";".join(signed), hashlib.sha256(body).hexdigest()])
    scope = f"{date}/{region}/ecr/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + ECR_KEY[1]).encode()
    for part in (date, region, "ecr", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return hmac.compare_digest(hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest(), sig)


ECR_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/ecr/app:1"


def registry_ecr_image_with_an_access_key():
    """from_aws_registry: the key is exchanged for an ECR login (SigV4), which pulls."""
    try:
        Template.build(
            Template().from_aws_registry(ECR_IMAGE, ECR_KEY[0], "wrong-secret", "us-east-1"),
            f"{NAME}-ecr",
        )
        raise AssertionError("a wrong secret pulled")
    except BuildException as e:
        assert "ECR refused the access key" in str(e), e
        assert "UnrecognizedClientException" in str(e), e
    info, logs, _ = build(
        Template().from_aws_registry(ECR_IMAGE, ECR_KEY[0], ECR_KEY[1], "us-east-1"),
        f"{NAME}-ecr",
    )
    assert any("logged in to ECR (us-east-1) as AKIDTEST" in m for m in logs), logs
    assert any(f"pulled {ECR_IMAGE}" in m for m in logs), logs
    assert not any(ECR_KEY[1] in m or "ecr-pass" in m for m in logs), logs
    assert Template_delete(f"{NAME}-ecr") == 204


def layer_fetches():
    return [p for p, _ in REGISTRY["log"] if p.startswith("/cdn/") and p[5:] in REGISTRY["layers"]]


def registry_image_builds_and_runs():
    """FROM python:3 through the daemon's mirror of docker.io: pulled, layered, run."""
    t = Template().from_image("python:3").run_cmd("echo pulled > /home/user/marker")
    info, logs, _ = build(t, f"{NAME}-reg")
    assert any("pulling docker.io/library/python:3" in m for m in logs), logs
    assert any(": pulled, " in m for m in logs), logs
    # The layer blobs came through the redirect.
    fetched = layer_fetches()
    for layer in REGISTRY["layers"]:
        assert f"/cdn/{layer}" in fetched, (layer, fetched)
    # The other platform's manifest was never asked for.
    assert not any(p.endswith("0" * 64) for p, _ in REGISTRY["log"]), REGISTRY["log"]
    sbx = Sandbox.create(template=f"{NAME}-reg", timeout=120)
    try:
        r = sbx.commands.run("id -un; cat /home/user/marker; pwd")
        assert r.stdout.split() == ["user", "pulled", "/home/user"], r
        assert sbx.commands.run("ls /usr/bin/dash").exit_code == 0
    finally:
        sbx.kill()


def registry_second_pull_is_cached():
    before = len(layer_fetches())
    t = Template().from_image("python:3").run_cmd("echo again > /home/user/marker2")
    info, logs, _ = build(t, f"{NAME}-reg2")
    assert any(": cached" in m for m in logs), logs
    assert len(layer_fetches()) == before, "a layer the store has was fetched again"


def registry_private_image_needs_its_login():
    try:
        Template.build(
            Template().from_image("private/app:1", username="puller", password="wrong"),
            f"{NAME}-priv",
        )
        raise AssertionError("a wrong password pulled")
    except BuildException as e:
        assert "refused the user and password" in str(e), e
    try:
        Template.build(Template().from_image("private/app:1"), f"{NAME}-priv")
        raise AssertionError("an anonymous pull of a private repository succeeded")
    except BuildException as e:
        assert "refused an anonymous pull" in str(e), e
    info, logs, _ = build(
        Template().from_image("private/app:1", username="puller", password="s3cret"),
        f"{NAME}-priv",
    )
    assert any("pulled docker.io/private/app:1" in m for m in logs), logs
    # The password is in no log line.
    assert not any("s3cret" in m for m in logs), logs
    assert Template_delete(f"{NAME}-priv") == 204


def registry_failures_are_reported():
    cases = [
        (Template().from_image("python:nope"), "not found"),
        (Template().from_image("missing/app:1"), "not found"),
        # A registry at a loopback address named by the build (not the operator's mirror).
        (
            Template().from_image(f"127.0.0.1:{os.environ['REGISTRY_PORT']}/library/python:3"),
            "not public",
        ),
        (Template().from_aws_registry(ECR_IMAGE, "AKIA", "s", "us/east"), "not an AWS region"),
        (Template().from_image("liar/app:1"), "longer than its descriptor's 100 bytes"),
        (Template().from_image("loop/app:1"), "more than 5 redirects"),
        (Template().from_image("old/app:1"), "a schema 1 manifest"),
    ]
    for t, want in cases:
        try:
            Template.build(t, f"{NAME}-regfail")
            raise AssertionError(f"a build that should fail with {want!r} succeeded")
        except BuildException as e:
            assert want in str(e), (want, str(e))
    assert not Template.exists(f"{NAME}-regfail")
    for n in (f"{NAME}-reg", f"{NAME}-reg2"):
        assert Template_delete(n) == 204


if "serve-registry" in sys.argv[1:]:
    # Only the registry, for a build outside this script (`rampart template build`): READY
    # once it listens; it serves until stdin closes.
    start_registry()
    print("READY", flush=True)
    sys.stdin.read()
    sys.exit(0)

if "registry" in sys.argv[1:]:
    sys.argv.remove("registry")
    start_registry()
    for fn in (
        registry_image_builds_and_runs,
        registry_second_pull_is_cached,
        registry_private_image_needs_its_login,
        registry_ecr_image_with_an_access_key,
        registry_failures_are_reported,
    ):
        test(fn)
        sys.argv.append(fn.__name__)

if "debian_dockerfile" in sys.argv[1:]:
    make_context()
    test(debian_dockerfile)

if __name__ == "__main__":
    run()
