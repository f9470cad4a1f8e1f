"""Errors of the Rampart API: one class per API error code (`docs/api.md`, "Errors")."""

from typing import Any, Dict, Optional, Type


class RampartError(Exception):
    """An answer of the API that is an error, or a daemon that cannot be reached."""

    code: str = "error"

    def __init__(self, message: str, *, status: Optional[int] = None, code: Optional[str] = None,
                 quota: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.message = message
        self.status = status
        if code is not None:
            self.code = code
        #: With `quota_exceeded` and `rate_limited`: `{limit, used, requested, max}`.
        self.quota = quota

    def __str__(self) -> str:
        return f"{self.status} {self.code}: {self.message}" if self.status else self.message


class ConnectionFailed(RampartError):
    """The daemon could not be reached."""

    code = "connection_failed"


class BadRequest(RampartError):
    code = "bad_request"


class Unauthorized(RampartError):
    code = "unauthorized"


class Forbidden(RampartError):
    code = "forbidden"


class PermissionDenied(RampartError):
    code = "permission_denied"


class NotFound(RampartError):
    code = "not_found"


class Conflict(RampartError):
    code = "conflict"


class TooLarge(RampartError):
    code = "too_large"


class LimitExceeded(RampartError):
    code = "limit_exceeded"


class QuotaExceeded(RampartError):
    code = "quota_exceeded"


class RateLimited(RampartError):
    code = "rate_limited"


class Capacity(RampartError):
    code = "capacity"


class Timeout(RampartError):
    code = "timeout"


class AgentError(RampartError):
    code = "agent_error"


class InternalError(RampartError):
    code = "internal"


class Denied(RampartError):
    """The sandbox's approval policy held the command and it was denied, or nobody decided
    in time: it never started."""

    code = "denied"


BY_CODE: Dict[str, Type[RampartError]] = {
    c.code: c
    for c in (
        BadRequest, Unauthorized, Forbidden, PermissionDenied, NotFound, Conflict, TooLarge,
        LimitExceeded, QuotaExceeded, RateLimited, Capacity, Timeout, AgentError, InternalError,
        Denied,
    )
}
BY_CODE["agent_unreachable"] = AgentError
BY_CODE["misdirected_request"] = Forbidden
BY_CODE["unsupported_media_type"] = BadRequest
BY_CODE["resource_exhausted"] = TooLarge


def from_answer(status: int, body: bytes) -> RampartError:
    """The exception of an error answer."""
    import json

    try:
        e = json.loads(body)["error"]
        code, message, quota = e.get("code", "error"), e.get("message", ""), e.get("quota")
    except (ValueError, KeyError, TypeError):
        code, message, quota = "error", body.decode("utf-8", "replace")[:500], None
    cls = BY_CODE.get(code, RampartError)
    return cls(message, status=status, code=code, quota=quota)
