"""Rampart's Python SDK: sandboxes for agents, and offline verification of their signed
record (`README.md`)."""

from . import errors
from ._client import AsyncRampart, Process, Rampart, Sandbox
from ._session import AsyncSession, Session
from .errors import RampartError
from .types import (ExecEvent, ExecResult, FileEntry, ProcessInfo, SandboxInfo, SnapshotInfo,
                    VolumeInfo)
from .verify import BundleReport, UsageCheck, VerificationError, verify_bundle, verify_usage

__version__ = "0.1.0"

__all__ = [
    "AsyncRampart", "Rampart", "Sandbox", "Process", "ProcessInfo", "Session", "AsyncSession", "RampartError", "errors", "ExecEvent", "ExecResult",
    "FileEntry", "SandboxInfo", "SnapshotInfo", "VolumeInfo", "BundleReport", "UsageCheck",
    "VerificationError", "verify_bundle", "verify_usage",
]
