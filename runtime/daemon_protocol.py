"""The clock daemon's wire protocol: JSON lines over a Unix stream socket, checked by pydantic.

One request per line, one reply per line, in order, on a connection that lives as long as
the client's leases (docs/clock-daemon.md). Requests are a union on "op": `hello` (who the daemon
sees and what it may do), `status`, `lock` and `reset`; every field is strict and bounded,
unknown fields are refused. Replies carry "ok"; an error reply names a code and says why.

Parts: the limits, the request models and `parse_request`, the reply models, `encode`.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

MAX_LINE_BYTES = 1024  # longest request line, newline included, bytes
MAX_REPLY_BYTES = 65_536  # longest reply line a client reads, newline included, bytes
MAX_GPU_INDEX = 1023  # highest NVML index a request may name
MAX_CLOCK_MHZ = 100_000  # highest clock a request may name, MHz (real cards stay below 10,000)
MAX_UUID_CHARS = 96  # longest GPU uuid a request may carry, characters
MAX_MESSAGE_CHARS = 300  # longest error message in a reply, characters

GpuIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]
ClockMhz = Annotated[int, Field(ge=1, le=MAX_CLOCK_MHZ)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class HelloRequest(_Request):
    """Who is asking (as the daemon sees it) and what that peer may do."""

    op: Literal["hello"]


class StatusRequest(_Request):
    """Every GPU's lease and clocks, and how many leases the daemon has reset."""

    op: Literal["status"]


class LockRequest(_Request):
    """Lock GPU `gpu` at core_mhz/mem_mhz, taking its lease for this connection if free."""

    op: Literal["lock"]
    gpu: GpuIndex
    core_mhz: ClockMhz
    mem_mhz: ClockMhz
    uuid: Annotated[str, Field(max_length=MAX_UUID_CHARS)] | None = None


class ResetRequest(_Request):
    """Reset GPU `gpu` to stock clocks and end this connection's lease on it."""

    op: Literal["reset"]
    gpu: GpuIndex


Request = Annotated[HelloRequest | StatusRequest | LockRequest | ResetRequest, Field(discriminator="op")]
_REQUEST = TypeAdapter(Request)


class ProtocolError(Exception):
    """A request that is not valid: `code` for programs, the message for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_request(line: bytes) -> HelloRequest | StatusRequest | LockRequest | ResetRequest:
    """One request line (JSON) as a request model; ProtocolError("bad_request") otherwise."""
    try:
        return _REQUEST.validate_json(line)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "request"
        raise ProtocolError("bad_request", f"{where}: {first['msg']}") from None


# --- replies ------------------------------------------------------------------------------------
class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ErrorReply(_Reply):
    ok: Literal[False] = False
    error: str
    message: str


class ClockRange(_Reply):
    """What a peer may lock on one GPU: floor and ceiling per clock, MHz, inclusive."""

    gpu: int
    core_mhz: tuple[int, int]
    mem_mhz: tuple[int, int]


class HelloReply(_Reply):
    ok: Literal[True] = True
    uid: int
    gid: int
    pid: int
    dry_run: bool
    may_lock: list[ClockRange]


class GpuStatus(_Reply):
    index: int
    uuid: str
    leased: bool
    holder_pid: int | None
    core_mhz: int | None
    mem_mhz: int | None


class StatusReply(_Reply):
    ok: Literal[True] = True
    gpus: list[GpuStatus]
    resets: int
    dry_run: bool
    recorded_calls: int  # dry-run: NVML calls recorded instead of made


class LockReply(_Reply):
    ok: Literal[True] = True
    gpu: int
    core_mhz: int
    mem_mhz: int


class ResetReply(_Reply):
    ok: Literal[True] = True
    gpu: int


Reply = ErrorReply | HelloReply | StatusReply | LockReply | ResetReply


def error_reply(code: str, message: str) -> ErrorReply:
    return ErrorReply(error=code, message=message[:MAX_MESSAGE_CHARS])


def encode(reply: Reply) -> bytes:
    """One reply line."""
    return reply.model_dump_json().encode() + b"\n"


def decode_reply(line: bytes, model: type[_Reply]) -> Any:
    """A reply line as `model`, or as ErrorReply when the daemon answered an error
    (pydantic's ValidationError, a ValueError, for anything else)."""
    return _reply_adapter(model).validate_json(line)


@functools.cache
def _reply_adapter(model: type[_Reply]) -> TypeAdapter:
    return TypeAdapter(ErrorReply | model)  # "ok" (false or true) tells them apart
