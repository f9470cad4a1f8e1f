"""The clients. Every operation is written once, as a `_Call` (what to send and how to read
the answer); `Rampart` runs calls with httpx's blocking client and `AsyncRampart` with its
async one, so `Sandbox` serves both: its methods return results on a `Rampart` and
awaitables (or async iterators) on an `AsyncRampart`."""

import json
import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Union
from urllib.parse import quote

import httpx

from . import _session, errors
from .types import (ExecEvent, ExecResult, FileEntry, ProcessInfo, SandboxInfo, SnapshotInfo,
                    VolumeInfo)
from .verify import BundleReport, UsageCheck, verify_bundle, verify_usage

DEFAULT_HOST = "http://127.0.0.1:3000"
#: Where the daemon's Unix socket is looked for when neither a host nor a socket is given.
DEFAULT_SOCKETS = ("/var/lib/rampart/rampart.sock", "/run/rampart/rampart.sock")


class _Call:
    """One API call: the request, and how to make the answer into a result."""

    __slots__ = ("method", "path", "params", "json", "content", "headers", "parse", "timeout")

    def __init__(self, method: str, path: str, *, params=None, json=None, content=None,
                 headers=None, parse: Optional[Callable[[httpx.Response], Any]] = None,
                 timeout: Optional[httpx.Timeout] = None):
        self.method = method
        self.path = path
        self.params = params
        self.json = json
        self.content = content
        self.headers = headers or {}
        self.parse = parse or (lambda r: r.json() if r.content else None)
        #: Overrides the client's timeout (a watch waits for changes as long as it takes).
        self.timeout = timeout


def _q(path: str) -> str:
    return quote(path, safe="")


def _check(r: httpx.Response) -> None:
    if r.status_code >= 400:
        raise errors.from_answer(r.status_code, r.content)


def _exec_body(cmd, *, cwd=None, env=None, user=None, timeout_secs=None, stdin=None,
               pty=None, max_output_bytes=None) -> Dict[str, Any]:
    if isinstance(cmd, str):
        cmd = ["bash", "-lc", cmd]
    body: Dict[str, Any] = {"cmd": list(cmd)}
    for k, v in (("cwd", cwd), ("env", env), ("user", user), ("timeout_secs", timeout_secs),
                 ("max_output_bytes", max_output_bytes)):
        if v is not None:
            body[k] = v
    if stdin is not None:
        if isinstance(stdin, bytes):
            import base64
            body["stdin_base64"] = base64.b64encode(stdin).decode()
        else:
            body["stdin"] = stdin
    if pty:
        # A pseudo-terminal of this size (`True`: 80x24); output arrives as `pty` events.
        body["tty"] = [80, 24] if pty is True else list(pty)
    return body


class Sandbox:
    """A sandbox. On a `Rampart` its methods return results; on an `AsyncRampart`,
    awaitables (and `stream` an async iterator). As a context manager (`with` or
    `async with`) it is destroyed on exit."""

    def __init__(self, client: "_Base", info: SandboxInfo):
        self._client = client
        self.info = info

    @property
    def id(self) -> str:
        return self.info.id

    def __repr__(self) -> str:
        return f"Sandbox({self.info.id!r}, state={self.info.state!r})"

    def _path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{self.info.id}{rest}"

    def _info_call(self, method: str, rest: str, json_body=None) -> _Call:
        def parse(r):
            self.info = SandboxInfo.from_dict(r.json())
            return self.info
        return _Call(method, self._path(rest), json=json_body, parse=parse)

    # Lifecycle
    def refresh(self):
        """Reads its state again."""
        return self._client._run(self._info_call("GET", ""))

    def destroy(self):
        """Destroys it (its record stays)."""
        return self._client._run(self._info_call("DELETE", ""))

    def set_timeout(self, secs: int):
        """Sets its deadline to `secs` seconds from now."""
        return self._client._run(self._info_call("POST", "/timeout", {"timeout_secs": secs}))

    def pause(self, *, disk: bool = False):
        """Freezes every process (memory kept, no CPU used). `disk=True` saves every process
        with its memory beside the sandbox's disk instead, so nothing stays in RAM; the resume
        restores them where they were (the gvisor tier)."""
        body = {"disk": True} if disk else None
        return self._client._run(self._info_call("POST", "/pause", body))

    def resume(self):
        """Continues every process where it was."""
        return self._client._run(self._info_call("POST", "/resume"))

    # Commands
    def exec(self, cmd: Union[str, List[str]], **kw):
        """Runs a command and waits for it; a string runs with `bash -lc`. Keywords: cwd,
        env, user, timeout_secs, stdin (str or bytes), pty (True, or (cols, rows)),
        max_output_bytes."""
        return self._client._run(_Call("POST", self._path("/exec"), json=_exec_body(cmd, **kw),
                                       parse=lambda r: ExecResult.from_dict(r.json())))

    def stream(self, cmd: Union[str, List[str]], **kw):
        """Runs a command and yields its events (`ExecEvent`) as they happen: start,
        stdout/stderr chunks, then exit."""
        call = _Call("POST", self._path("/exec"), json=_exec_body(cmd, **kw),
                     headers={"accept": "application/x-ndjson"})
        return self._client._lines(call, lambda line: ExecEvent.from_dict(json.loads(line)))

    def session(self, cmd: Union[str, List[str]], **kw):
        """Starts a command over the exec WebSocket and returns its session: `send` stdin
        as it comes, `close_stdin`, `resize` (with `pty=True`), `signal(kill=)`, iterate its
        events, `wait()` for its result. Keywords as `exec`."""
        return self._client._session(self._path("/exec/ws"), _exec_body(cmd, **kw))

    def start(self, cmd: Union[str, List[str]], **kw):
        """Starts a command in the background and returns its `Process`: it runs on with no
        client attached (recorded like any command); attach to its output any time
        (`events`, `wait`), send it input and signals. Keywords as `exec`."""
        return self._client._run(_Call("POST", self._path("/processes"), json=_exec_body(cmd, **kw),
                                       parse=lambda r: Process(self, ProcessInfo.from_dict(r.json()))))

    def processes(self):
        """Its background processes (running, and those that ended in the last minutes)."""
        return self._client._run(_Call(
            "GET", self._path("/processes"),
            parse=lambda r: [Process(self, ProcessInfo.from_dict(d)) for d in r.json()]))

    def process(self, pid: int):
        """Background process `pid`, to attach to again (from this or another program)."""
        return self._client._run(_Call(
            "GET", self._path(f"/processes/{int(pid)}"),
            parse=lambda r: Process(self, ProcessInfo.from_dict(r.json()))))

    # Files
    def write(self, path: str, data: Union[bytes, str, Iterable[bytes]]):
        """Writes a file (parents made); `data` may be bytes, text, or an iterator of bytes
        (streamed). Returns the absolute path written."""
        if isinstance(data, str):
            data = data.encode()
        return self._client._run(_Call("PUT", self._path(f"/files?path={_q(path)}"), content=data,
                                       parse=lambda r: r.json().get("path", path)))

    def read(self, path: str):
        """A file's bytes."""
        return self._client._run(_Call("GET", self._path(f"/files?path={_q(path)}"),
                                       parse=lambda r: r.content))

    def download(self, path: str):
        """A file's bytes as they come (an iterator of chunks)."""
        return self._client._chunks(_Call("GET", self._path(f"/files?path={_q(path)}")))

    def list(self, path: str = "/home/user", depth: int = 1):
        """A directory's entries."""
        return self._client._run(_Call(
            "GET", self._path(f"/files/list?path={_q(path)}&depth={depth}"),
            parse=lambda r: [FileEntry.from_dict(e) for e in r.json()["entries"]]))

    def stat(self, path: str):
        """One entry."""
        return self._client._run(_Call("GET", self._path(f"/files/stat?path={_q(path)}"),
                                       parse=lambda r: FileEntry.from_dict(r.json())))

    def mkdir(self, path: str):
        """Makes a directory and its parents."""
        return self._client._run(_Call("POST", self._path("/files/mkdir"), json={"path": path},
                                       parse=lambda r: FileEntry.from_dict(r.json())))

    def move(self, src: str, dst: str):
        """Moves or renames."""
        return self._client._run(_Call("POST", self._path("/files/move"),
                                       json={"from": src, "to": dst},
                                       parse=lambda r: FileEntry.from_dict(r.json())))

    def remove(self, path: str):
        """Removes a file or a directory tree."""
        return self._client._run(_Call("DELETE", self._path(f"/files?path={_q(path)}"),
                                       parse=lambda r: None))

    def watch(self, path: str, recursive: bool = False):
        """Changes under a directory as they happen (dicts `{"name", "type"}`: create,
        write, remove, rename, chmod), until the iterator is closed."""
        q = f"/files/watch?path={_q(path)}" + ("&recursive=true" if recursive else "")
        call = _Call("GET", self._path(q), timeout=httpx.Timeout(None, connect=10.0))
        return self._client._lines(call, json.loads)

    # Network and ports
    def network(self):
        """Its network policy and addresses."""
        return self._client._run(_Call("GET", self._path("/network")))

    def set_network(self, policy: Dict[str, Any]):
        """Replaces its network policy (new connections obey it at once)."""
        return self._client._run(_Call("PUT", self._path("/network"), json=policy))

    def network_log(self, after: int = 0, limit: int = 1000):
        """Its network log entries after `after`."""
        return self._client._run(_Call("GET", self._path(f"/network/log?after={after}&limit={limit}"),
                                       parse=lambda r: r.json()["entries"]))

    def ports(self):
        """The ports servers inside listen on, with their URLs."""
        return self._client._run(_Call("GET", self._path("/ports"), parse=lambda r: r.json()["ports"]))

    # Persistence
    def snapshot(self, name: Optional[str] = None, *, memory: bool = False):
        """Takes a snapshot of its filesystem; with `memory=True` (the gvisor tier) of its
        processes and memory too: a sandbox made from it continues them."""
        body: Dict[str, Any] = {"name": name} if name else {}
        if memory:
            body["memory"] = True
        return self._client._run(_Call("POST", self._path("/snapshots"), json=body,
                                       parse=lambda r: SnapshotInfo.from_dict(r.json())))

    def fork(self, count: int = 1):
        """Makes `count` sandboxes from one consistent point of this one."""
        client = self._client
        return client._run(_Call(
            "POST", self._path("/fork"), json={"count": count},
            parse=lambda r: [Sandbox(client, SandboxInfo.from_dict(s)) for s in r.json()["sandboxes"]]))

    # The record
    def audit_events(self, after: Optional[int] = None, limit: int = 1000):
        """Its audit events (after seq `after`)."""
        q = f"?limit={limit}" + (f"&after={after}" if after is not None else "")
        return self._client._run(_Call("GET", self._path(f"/audit{q}"), parse=lambda r: r.json()["events"]))

    def packages(self):
        """The packages it fetched (or was refused) through its network, from its audit
        record: dicts with ecosystem, name, version, registry, path, sha256, size, verdict,
        rule (docs/network.md, "Packages")."""
        return self._client._run(_Call("GET", self._path("/packages")))

    def audit_bundle(self):
        """Its signed record as a bundle (bytes of JSON; `rampart.verify_bundle` checks it)."""
        return self._client._run(_Call("GET", self._path("/audit/bundle"), parse=lambda r: r.content))

    def verify(self, trusted_key: Optional[str] = None):
        """Downloads its bundle and verifies it here (offline, pure Python) against
        `trusted_key` (`ed25519:<hex>`; pin the node's key), returning a `BundleReport`;
        raises `VerificationError` if it does not verify."""
        return self._client._run(_Call("GET", self._path("/audit/bundle"),
                                       parse=lambda r: verify_bundle(r.content, trusted_key)))

    # Artifacts
    def artifacts(self):
        """What it kept when it ended (`artifacts` at create): `{"sandbox_id", "kept_at",
        "expires_at", "artifacts": {"paths", "files": [{"path", "size", "digest", "mode"}],
        "skipped", "truncated"}}`. Works after it is gone, while the node keeps them."""
        return self._client._run(_Call("GET", self._path("/artifacts"), parse=lambda r: r.json()))

    def download_artifact(self, path: str) -> bytes:
        """The bytes of one kept file (its path inside the sandbox, as listed)."""
        return self._client._run(_Call("GET", self._path(f"/artifacts?path={_q(path)}"),
                                       parse=lambda r: r.content))

    # Context managers
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.destroy()
        except errors.NotFound:
            pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        try:
            await self.destroy()
        except errors.NotFound:
            pass


def _resolve(host, api_key, socket):
    """(base URL, transport arguments, key) from the arguments, then RAMPART_HOST /
    RAMPART_SOCKET / RAMPART_API_KEY, then the daemon's default socket, then DEFAULT_HOST."""
    api_key = api_key or os.environ.get("RAMPART_API_KEY") or None
    if socket:
        return "http://localhost", {"uds": str(socket)}, api_key
    if host:
        return host.rstrip("/"), {}, api_key
    if os.environ.get("RAMPART_SOCKET"):
        return "http://localhost", {"uds": os.environ["RAMPART_SOCKET"]}, api_key
    if os.environ.get("RAMPART_HOST"):
        return os.environ["RAMPART_HOST"].rstrip("/"), {}, api_key
    for s in DEFAULT_SOCKETS:
        if os.path.exists(s) and os.access(s, os.W_OK):
            return "http://localhost", {"uds": s}, api_key
    return DEFAULT_HOST, {}, api_key


class Process:
    """A background process of a sandbox (`Sandbox.start`, `Sandbox.process(pid)`). Its
    methods return results on a `Rampart` and awaitables on an `AsyncRampart` (`events` an
    async iterator)."""

    def __init__(self, sandbox: Sandbox, info: ProcessInfo):
        self.sandbox = sandbox
        self.info = info

    @property
    def pid(self) -> int:
        return self.info.pid

    def __repr__(self) -> str:
        return f"Process({self.info.pid}, running={self.info.running!r})"

    def _path(self, rest: str = "") -> str:
        return self.sandbox._path(f"/processes/{self.info.pid}{rest}")

    def _run(self, call: _Call):
        return self.sandbox._client._run(call)

    def _set(self, r: httpx.Response) -> ProcessInfo:
        self.info = ProcessInfo.from_dict(r.json())
        return self.info

    def refresh(self):
        """Reads its state again (running, or its exit)."""
        return self._run(_Call("GET", self._path(), parse=self._set))

    def _events_call(self) -> _Call:
        return _Call("GET", self._path("/events"), timeout=httpx.Timeout(None, connect=10.0))

    def events(self):
        """Attaches: its output so far (the last 256 KiB), then as it comes, until its `exit` (or
        `error`). Leaving early does not stop it."""
        return self.sandbox._client._lines(self._events_call(),
                                           lambda line: ExecEvent.from_dict(json.loads(line)))

    def wait(self):
        """Attaches and waits for its end: an `ExecResult` with the output kept."""
        return self.sandbox._client._collect(self._events_call(),
                                             lambda line: ExecEvent.from_dict(json.loads(line)))

    def _input(self, body: Dict[str, Any]):
        return self._run(_Call("POST", self._path("/input"), json=body))

    def send(self, data: Union[bytes, str]):
        """Sends bytes to its stdin (or PTY)."""
        import base64
        raw = data.encode() if isinstance(data, str) else data
        return self._input({"type": "stdin", "data": base64.b64encode(raw).decode()})

    def close_stdin(self):
        """Closes its stdin."""
        return self._input({"type": "close_stdin"})

    def resize(self, cols: int, rows: int):
        """Resizes its PTY."""
        return self._input({"type": "resize", "cols": cols, "rows": rows})

    def signal(self, kill: bool = False):
        """Sends SIGTERM (or SIGKILL with `kill=True`)."""
        return self._input({"type": "signal", "kill": kill})

    def kill(self):
        """Kills it (SIGKILL); returns what it is now (its end follows on `events`)."""
        return self._run(_Call("DELETE", self._path(), parse=self._set))


class _Base:
    """What both clients offer; subclasses say how a call runs."""

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None, *,
                 socket: Optional[str] = None, timeout: float = 120.0):
        self.base_url, self._transport_args, key = _resolve(host, api_key, socket)
        self._headers = {"user-agent": "rampart-python"}
        if key:
            self._headers["authorization"] = f"Bearer {key}"
        self._timeout = timeout

    def _run(self, call: _Call):  # pragma: no cover - defined by the subclasses
        raise NotImplementedError

    def _lines(self, call: _Call, decode):  # pragma: no cover
        raise NotImplementedError

    def _chunks(self, call: _Call):  # pragma: no cover
        raise NotImplementedError

    def _session(self, path: str, request: Dict[str, Any]):  # pragma: no cover
        raise NotImplementedError

    def _ws_headers(self) -> Dict[str, str]:
        return {k: v for k, v in self._headers.items() if k == "authorization"}

    # Sandboxes
    def create(self, template: Optional[str] = None, *, timeout_secs: Optional[int] = None,
               cpus: Optional[float] = None, memory_bytes: Optional[int] = None,
               disk_bytes: Optional[int] = None, pids: Optional[int] = None,
               env: Optional[Dict[str, str]] = None, metadata: Optional[Dict[str, str]] = None,
               network: Optional[Dict[str, Any]] = None, secrets: Optional[List[Dict[str, Any]]] = None,
               snapshot: Optional[str] = None, volumes: Optional[List[Dict[str, Any]]] = None,
               public_ports: Optional[List[int]] = None, on_timeout: Optional[str] = None,
               artifacts: Optional[List[str]] = None, isolation: Optional[str] = None,
               idle_pause_secs: Optional[int] = None):
        """Creates a sandbox (every option of `POST /v1/sandboxes`) and returns it running.
        `artifacts`: absolute paths kept when it ends (`Sandbox.artifacts()` lists them).
        `isolation`: "namespace" or "gvisor" (the daemon's default when absent).
        `idle_pause_secs`: it sleeps (is paused) after that long without a request, and the
        next request wakes it."""
        body: Dict[str, Any] = {}
        limits = {k: v for k, v in (("cpus", cpus), ("memory_bytes", memory_bytes),
                                    ("disk_bytes", disk_bytes), ("pids", pids)) if v is not None}
        for k, v in (("template", template), ("timeout_secs", timeout_secs), ("env", env),
                     ("metadata", metadata), ("network", network), ("secrets", secrets),
                     ("snapshot", snapshot), ("volumes", volumes), ("public_ports", public_ports),
                     ("on_timeout", on_timeout), ("artifacts", artifacts),
                     ("isolation", isolation), ("idle_pause_secs", idle_pause_secs)):
            if v is not None:
                body[k] = v
        if limits:
            body["limits"] = limits
        return self._run(_Call("POST", "/v1/sandboxes", json=body,
                               parse=lambda r: Sandbox(self, SandboxInfo.from_dict(r.json()))))

    def get(self, sandbox_id: str):
        """A sandbox by id (also an ended one, while its history is kept)."""
        return self._run(_Call("GET", f"/v1/sandboxes/{_q(sandbox_id)}",
                               parse=lambda r: Sandbox(self, SandboxInfo.from_dict(r.json()))))

    def list(self, state: Optional[str] = None, metadata: Optional[Dict[str, str]] = None):
        """Sandboxes (alive ones unless `state` says), carrying all of `metadata`."""
        params: List[Any] = []
        if state:
            params.append(("state", state))
        for k, v in (metadata or {}).items():
            params.append(("metadata", f"{k}={v}"))
        return self._run(_Call("GET", "/v1/sandboxes", params=params,
                               parse=lambda r: [Sandbox(self, SandboxInfo.from_dict(s)) for s in r.json()]))

    # Snapshots and volumes
    def snapshots(self):
        return self._run(_Call("GET", "/v1/snapshots",
                               parse=lambda r: [SnapshotInfo.from_dict(s) for s in r.json()]))

    def delete_snapshot(self, name: str):
        return self._run(_Call("DELETE", f"/v1/snapshots/{_q(name)}", parse=lambda r: None))

    def create_volume(self, name: str, size_mib: int):
        return self._run(_Call("POST", "/v1/volumes", json={"name": name, "size_mib": size_mib},
                               parse=lambda r: VolumeInfo.from_dict(r.json())))

    def volumes(self):
        return self._run(_Call("GET", "/v1/volumes",
                               parse=lambda r: [VolumeInfo.from_dict(v) for v in r.json()]))

    def delete_volume(self, name: str):
        return self._run(_Call("DELETE", f"/v1/volumes/{_q(name)}", parse=lambda r: None))

    # Secrets, templates
    def set_secret(self, name: str, value: str, hosts: List[str], *,
                   inject: Optional[Dict[str, Any]] = None, env: Optional[str] = None):
        """Stores a secret that sandboxes may send to `hosts` (never shown again)."""
        body: Dict[str, Any] = {"name": name, "value": value, "hosts": hosts}
        if inject is not None:
            body["inject"] = inject
        if env is not None:
            body["env"] = env
        return self._run(_Call("POST", "/v1/secrets", json=body))

    def secrets(self):
        return self._run(_Call("GET", "/v1/secrets"))

    def delete_secret(self, name: str):
        return self._run(_Call("DELETE", f"/v1/secrets/{_q(name)}", parse=lambda r: None))

    def templates(self):
        return self._run(_Call("GET", "/v1/templates"))

    # Tenants (the administrator's) and usage
    def create_tenant(self, name: str, **quotas):
        """Makes a tenant; quotas: max_sandboxes, max_paused, max_vcpus, max_memory_bytes,
        max_disk_bytes, creates_per_minute."""
        return self._run(_Call("POST", "/v1/tenants", json={"name": name, "quotas": quotas}))

    def tenants(self):
        return self._run(_Call("GET", "/v1/tenants"))

    def set_quotas(self, name: str, **quotas):
        return self._run(_Call("PUT", f"/v1/tenants/{_q(name)}/quotas", json=quotas))

    def delete_tenant(self, name: str):
        return self._run(_Call("DELETE", f"/v1/tenants/{_q(name)}", parse=lambda r: None))

    def usage(self, start: Optional[str] = None, end: Optional[str] = None,
              tenant: Optional[str] = None, *, verify_with: Optional[str] = None):
        """The signed usage report (a dict) of `[start, end)` (RFC 3339); with `verify_with`
        (the node's key) it is verified here first."""
        params = [(k, v) for k, v in (("from", start), ("to", end), ("tenant", tenant)) if v]

        def parse(r):
            if verify_with is not None:
                verify_usage(r.content, verify_with)
            return r.json()
        return self._run(_Call("GET", "/v1/usage", params=params, parse=parse))

    def audit_key(self) -> Any:
        """The node's public key (`ed25519:<hex>`), to pin in `verify`."""
        return self._run(_Call("GET", "/v1/audit/key", parse=lambda r: r.json()["public_key"]))

    def health(self):
        return self._run(_Call("GET", "/health"))


class Rampart(_Base):
    """The blocking client. `Rampart()` finds the daemon as the CLI does: `host`/`socket`,
    then RAMPART_HOST (with RAMPART_API_KEY) / RAMPART_SOCKET, then the daemon's socket,
    then http://127.0.0.1:3000."""

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None, *,
                 socket: Optional[str] = None, timeout: float = 120.0):
        super().__init__(host, api_key, socket=socket, timeout=timeout)
        self._http = httpx.Client(base_url=self.base_url, headers=self._headers, timeout=timeout,
                                  transport=httpx.HTTPTransport(**self._transport_args))

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _request(self, call: _Call):
        extra = {} if call.timeout is None else {"timeout": call.timeout}
        return self._http.build_request(call.method, call.path, params=call.params, json=call.json,
                                        content=call.content, headers=call.headers, **extra)

    def _send(self, req, stream=False):
        try:
            return self._http.send(req, stream=stream)
        except httpx.TransportError as e:
            raise errors.ConnectionFailed(f"cannot reach the Rampart daemon at {self.base_url}: {e}") from e

    def _run(self, call: _Call):
        r = self._send(self._request(call))
        _check(r)
        return call.parse(r)

    def _open(self, call: _Call) -> httpx.Response:
        """Sends a streamed call now (its errors raise here), its body still to read."""
        r = self._send(self._request(call), stream=True)
        if r.status_code >= 400:
            try:
                r.read()
            finally:
                r.close()
            _check(r)
        return r

    def _lines(self, call: _Call, decode):
        r = self._open(call)

        def lines():
            try:
                for line in r.iter_lines():
                    if line.strip():
                        yield decode(line)
            finally:
                r.close()
        return lines()

    def _collect(self, call: _Call, decode) -> ExecResult:
        c = _session._Collect()
        for ev in self._lines(call, decode):
            c.add(ev)
        return c.result()

    def _chunks(self, call: _Call):
        r = self._open(call)

        def chunks():
            try:
                yield from r.iter_bytes()
            finally:
                r.close()
        return chunks()

    def _session(self, path: str, request: Dict[str, Any]) -> "_session.Session":
        from websockets.exceptions import InvalidStatus
        from websockets.sync.client import connect, unix_connect

        url, uds = _session.ws_target(self.base_url, self._transport_args, path)
        try:
            if uds:
                ws = unix_connect(uds, url, additional_headers=self._ws_headers(), compression=None)
            else:
                ws = connect(url, additional_headers=self._ws_headers(), compression=None, proxy=None)
        except InvalidStatus as e:
            raise _session.rejected(e) from e
        except OSError as e:
            raise errors.ConnectionFailed(f"cannot reach the Rampart daemon at {self.base_url}: {e}") from e
        ws.send(json.dumps(request))
        return _session.Session(ws)


class AsyncRampart(_Base):
    """The async client (same methods, awaited; `Sandbox.stream` and `download` are async
    iterators)."""

    def __init__(self, host: Optional[str] = None, api_key: Optional[str] = None, *,
                 socket: Optional[str] = None, timeout: float = 120.0):
        super().__init__(host, api_key, socket=socket, timeout=timeout)
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=self._headers, timeout=timeout,
                                       transport=httpx.AsyncHTTPTransport(**self._transport_args))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    def _request(self, call: _Call):
        extra = {} if call.timeout is None else {"timeout": call.timeout}
        return self._http.build_request(call.method, call.path, params=call.params, json=call.json,
                                        content=call.content, headers=call.headers, **extra)

    async def _send(self, req, stream=False):
        try:
            return await self._http.send(req, stream=stream)
        except httpx.TransportError as e:
            raise errors.ConnectionFailed(f"cannot reach the Rampart daemon at {self.base_url}: {e}") from e

    async def _run(self, call: _Call):
        r = await self._send(self._request(call))
        _check(r)
        return call.parse(r)

    async def _lines(self, call: _Call, decode):
        r = await self._send(self._request(call), stream=True)
        try:
            if r.status_code >= 400:
                await r.aread()
                _check(r)
            async for line in r.aiter_lines():
                if line.strip():
                    yield decode(line)
        finally:
            await r.aclose()

    async def _collect(self, call: _Call, decode) -> ExecResult:
        c = _session._Collect()
        async for ev in self._lines(call, decode):
            c.add(ev)
        return c.result()

    async def _chunks(self, call: _Call):
        r = await self._send(self._request(call), stream=True)
        try:
            if r.status_code >= 400:
                await r.aread()
                _check(r)
            async for chunk in r.aiter_bytes():
                yield chunk
        finally:
            await r.aclose()

    async def _session(self, path: str, request: Dict[str, Any]) -> "_session.AsyncSession":
        from websockets.asyncio.client import connect, unix_connect
        from websockets.exceptions import InvalidStatus

        url, uds = _session.ws_target(self.base_url, self._transport_args, path)
        try:
            if uds:
                ws = await unix_connect(uds, url, additional_headers=self._ws_headers(), compression=None)
            else:
                ws = await connect(url, additional_headers=self._ws_headers(), compression=None, proxy=None)
        except InvalidStatus as e:
            raise _session.rejected(e) from e
        except OSError as e:
            raise errors.ConnectionFailed(f"cannot reach the Rampart daemon at {self.base_url}: {e}") from e
        await ws.send(json.dumps(request))
        return await _session.AsyncSession.start(ws)


__all__ = ["Rampart", "AsyncRampart", "Sandbox", "Process", "BundleReport", "UsageCheck"]
