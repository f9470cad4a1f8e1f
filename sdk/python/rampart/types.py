"""What the API answers, as dataclasses. Members the API adds later are kept in `extra`."""

import base64
import dataclasses
from typing import Any, Dict, List, Optional


def _take(cls, d: Dict[str, Any]):
    names = {f.name for f in dataclasses.fields(cls)}
    known = {k: v for k, v in d.items() if k in names and k != "extra"}
    obj = cls(**known)
    if "extra" in names:
        obj.extra = {k: v for k, v in d.items() if k not in names}
    return obj


@dataclasses.dataclass
class Limits:
    cpus: float
    memory_bytes: int
    pids: int
    disk_bytes: int
    open_files: int


@dataclasses.dataclass
class SandboxInfo:
    """A sandbox as the API describes it."""

    id: str
    template: str
    state: str
    limits: Limits
    metadata: Dict[str, str]
    env_names: List[str]
    created_at: str
    expires_at: str
    ended_at: Optional[str] = None
    reason: Optional[str] = None
    #: The token that opens its ports (`X-Rampart-Token`); only while it is alive.
    access_token: Optional[str] = None
    tenant: Optional[str] = None
    #: The isolation tier it runs on ("namespace" or "gvisor").
    isolation: str = "namespace"
    #: Seconds without a request after which it sleeps (None: never).
    idle_pause_secs: Optional[int] = None
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SandboxInfo":
        d = dict(d)
        d["limits"] = _take(Limits, d["limits"])
        return _take(cls, d)


@dataclasses.dataclass
class ExecResult:
    """The end of a command that was waited for."""

    exit_code: Optional[int]
    stdout: str
    stderr: str
    signal: Optional[int] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration_ms: int = 0
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExecResult":
        return _take(cls, d)


@dataclasses.dataclass
class ExecEvent:
    """One event of a streamed command: `start` (pid), `stdout`/`stderr`/`pty` (data), `exit`
    (exit_code, signal, timed_out), or `error` (message)."""

    type: str
    data: bytes = b""
    pid: Optional[int] = None
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    message: Optional[str] = None
    #: With `pending_approval` (sent first when the sandbox's policy holds the command) and
    #: `denied` (its end, when refused).
    approval_id: Optional[str] = None
    reason: Optional[str] = None

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ExecEvent":
        data = base64.b64decode(d["data"]) if isinstance(d.get("data"), str) else b""
        return cls(
            type=d.get("type", ""),
            data=data,
            pid=d.get("pid"),
            exit_code=d.get("exit_code"),
            signal=d.get("signal"),
            timed_out=bool(d.get("timed_out", False)),
            message=d.get("message"),
            approval_id=d.get("approval_id"),
            reason=d.get("reason"),
        )


@dataclasses.dataclass
class ProcessInfo:
    """A background process: running, or ended (with its exit code, signal or error)."""

    pid: int
    cmd: List[str]
    started_at: str
    running: bool
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    timed_out: bool = False
    error: Optional[str] = None
    ended_at: Optional[str] = None
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "ProcessInfo":
        return _take(cls, d)


@dataclasses.dataclass
class FileEntry:
    name: str
    path: str
    type: str
    size: int
    mode: int
    permissions: str
    owner: str
    group: str
    modified_at: str
    symlink_target: Optional[str] = None
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "FileEntry":
        return _take(cls, d)


@dataclasses.dataclass
class SnapshotInfo:
    name: str
    source: str
    template: str
    memory: bool
    size_bytes: int
    created_at: str
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SnapshotInfo":
        return _take(cls, d)


@dataclasses.dataclass
class VolumeInfo:
    name: str
    size_mib: int
    used_bytes: int
    created_at: str
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "VolumeInfo":
        return _take(cls, d)
