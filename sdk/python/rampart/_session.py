"""Interactive commands over the exec WebSocket (`GET /v1/sandboxes/{id}/exec/ws`): stdin
sent as it comes, the PTY resized, signals, events as they happen."""

import base64
import json
from typing import Any, Dict, Optional, Union

from . import errors
from .types import ExecEvent, ExecResult


def _stdin(data: Union[bytes, str]) -> str:
    if isinstance(data, str):
        data = data.encode()
    return json.dumps({"type": "stdin", "data": base64.b64encode(data).decode()})


class _Collect:
    """Gathers the output of events into the result of `wait`."""

    def __init__(self):
        self.out, self.err, self.end = bytearray(), bytearray(), None

    def add(self, ev: ExecEvent) -> None:
        if ev.type in ("stdout", "pty"):
            self.out += ev.data
        elif ev.type == "stderr":
            self.err += ev.data
        elif ev.type == "exit":
            self.end = ev
        elif ev.type == "error":
            raise errors.RampartError(ev.message or "the command failed", code="exec_error")
        elif ev.type == "denied":
            raise errors.Denied(ev.reason or "denied", status=403, code="denied")

    def result(self) -> ExecResult:
        e = self.end
        return ExecResult(
            exit_code=e.exit_code if e else None,
            signal=e.signal if e else None,
            timed_out=e.timed_out if e else False,
            stdout=self.out.decode("utf-8", "replace"),
            stderr=self.err.decode("utf-8", "replace"),
        )


def _started(first: Optional[ExecEvent]) -> None:
    if first is not None and first.type == "denied":
        raise errors.Denied(first.reason or "denied", status=403, code="denied")
    if first is None or first.type != "start":
        raise errors.RampartError(f"the command did not start: {first}", code="exec_error")


class Session:
    """A running command (blocking client). Iterate it for its events; `wait()` collects
    them into an `ExecResult`."""

    def __init__(self, ws):
        self._ws = ws
        self._done = False
        first = self._next()
        #: The approval it waited for, when the sandbox's policy held it.
        self.approval_id = None
        while first is not None and first.type == "pending_approval":
            self.approval_id = first.approval_id
            first = self._next()
        _started(first)
        #: The process's pid inside the sandbox.
        self.pid = first.pid

    def _next(self) -> Optional[ExecEvent]:
        if self._done:
            return None
        from websockets.exceptions import ConnectionClosed
        try:
            msg = self._ws.recv()
        except ConnectionClosed:
            self._done = True
            return None
        ev = ExecEvent.from_dict(json.loads(msg))
        if ev.type in ("exit", "error", "denied"):
            self._done = True
        return ev

    def send(self, data: Union[bytes, str]) -> None:
        """Sends bytes to its stdin (or PTY)."""
        self._ws.send(_stdin(data))

    def close_stdin(self) -> None:
        self._ws.send(json.dumps({"type": "close_stdin"}))

    def resize(self, cols: int, rows: int) -> None:
        self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    def signal(self, kill: bool = False) -> None:
        """SIGTERM, or SIGKILL with `kill`."""
        self._ws.send(json.dumps({"type": "signal", "kill": kill}))

    def __iter__(self):
        while True:
            ev = self._next()
            if ev is None:
                return
            yield ev

    def wait(self) -> ExecResult:
        c = _Collect()
        for ev in self:
            c.add(ev)
        return c.result()

    def close(self) -> None:
        self._ws.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AsyncSession:
    """A running command (async client); `async for` its events, `await wait()`."""

    def __init__(self, ws, pid: Optional[int]):
        self._ws = ws
        self._done = False
        self.pid = pid

    @classmethod
    async def start(cls, ws) -> "AsyncSession":
        s = cls(ws, None)
        first = await s._next()
        s.approval_id = None
        while first is not None and first.type == "pending_approval":
            s.approval_id = first.approval_id
            first = await s._next()
        _started(first)
        s.pid = first.pid
        return s

    async def _next(self) -> Optional[ExecEvent]:
        if self._done:
            return None
        from websockets.exceptions import ConnectionClosed
        try:
            msg = await self._ws.recv()
        except ConnectionClosed:
            self._done = True
            return None
        ev = ExecEvent.from_dict(json.loads(msg))
        if ev.type in ("exit", "error", "denied"):
            self._done = True
        return ev

    async def send(self, data: Union[bytes, str]) -> None:
        await self._ws.send(_stdin(data))

    async def close_stdin(self) -> None:
        await self._ws.send(json.dumps({"type": "close_stdin"}))

    async def resize(self, cols: int, rows: int) -> None:
        await self._ws.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def signal(self, kill: bool = False) -> None:
        await self._ws.send(json.dumps({"type": "signal", "kill": kill}))

    def __aiter__(self):
        return self

    async def __anext__(self) -> ExecEvent:
        ev = await self._next()
        if ev is None:
            raise StopAsyncIteration
        return ev

    async def wait(self) -> ExecResult:
        c = _Collect()
        async for ev in self:
            c.add(ev)
        return c.result()

    async def close(self) -> None:
        await self._ws.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()


def ws_target(base_url: str, transport_args: Dict[str, Any], path: str):
    """(ws URL, unix socket path or None) of `path` on the daemon."""
    rest = base_url.split("://", 1)[1]
    scheme = "wss" if base_url.startswith("https://") else "ws"
    return f"{scheme}://{rest}{path}", transport_args.get("uds")


def rejected(e) -> errors.RampartError:
    """The API error of a refused WebSocket upgrade."""
    resp = getattr(e, "response", None)
    if resp is not None and getattr(resp, "status_code", None):
        return errors.from_answer(resp.status_code, bytes(resp.body or b""))
    return errors.ConnectionFailed(f"the exec WebSocket failed: {e}")
