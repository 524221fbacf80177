"""Who may lease which GPU through the clock daemon, and within which clocks.

A peer is the process at the other end of the daemon's socket, as the kernel reports it
(SO_PEERCRED: pid, uid, gid; supplementary groups from /proc/PID/status), never as the
client says. The daemon's rules are a list read from a TOML or JSON rules file
(docs/clock-daemon.md): a rule names users and groups, the GPUs they may lease (default every
GPU) and a floor and ceiling per clock (default the card's range). A lock is allowed when any
rule matching the peer covers the GPU and both clocks. Without a file the rules are
`default_rules`: root and the socket's group, every GPU, the card's range.

Parts: `Peer` and `peer_of`, the file's models, `DaemonRules` (load, allows, may_lock).
"""

from __future__ import annotations

import grp
import json
import pwd
import socket
import struct
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, model_validator

from kdvfs.runtime.types import ClockGrid, ClockPair, KdvfsError

Clock = Annotated[StrictInt, Field(ge=1, le=100_000)]


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a connection, as the kernel knows it."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int]  # gid and the supplementary groups


def peer_of(sock: socket.socket) -> Peer:
    """The peer credentials of a connected Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return Peer(pid, uid, gid, frozenset({gid}) | _supplementary_groups(pid))


def _supplementary_groups(pid: int) -> frozenset[int]:
    """The process's supplementary groups from /proc (empty where it cannot be read)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Groups:"):
                return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


# --- the file ------------------------------------------------------------------------------------
class _RuleFile(BaseModel):
    model_config = ConfigDict(extra="forbid")  # strict per field: a TOML/JSON list is a tuple here

    users: list[StrictStr | StrictInt] = []
    groups: list[StrictStr | StrictInt] = []
    gpus: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    core_mhz: tuple[Clock, Clock] | None = None
    mem_mhz: tuple[Clock, Clock] | None = None

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> _RuleFile:
        for name in ("core_mhz", "mem_mhz"):
            bounds = getattr(self, name)
            if bounds is not None and bounds[0] > bounds[1]:
                raise ValueError(f"{name}: floor {bounds[0]} is above ceiling {bounds[1]}")
        if not self.users and not self.groups:
            raise ValueError("a rule names no users and no groups")
        return self


class _RulesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allow: list[_RuleFile]


@dataclass(frozen=True)
class Rule:
    """Users and groups (numeric), the GPUs they may lease (None: all), clock bounds in MHz
    (None: the card's range)."""

    uids: frozenset[int]
    gids: frozenset[int]
    gpus: frozenset[int] | None = None
    core_mhz: tuple[int, int] | None = None
    mem_mhz: tuple[int, int] | None = None

    def matches(self, peer: Peer) -> bool:
        return peer.uid in self.uids or bool(peer.groups & self.gids)

    def allows(self, gpu: int, pair: ClockPair) -> bool:
        return (
            (self.gpus is None or gpu in self.gpus)
            and _within(pair.core_mhz, self.core_mhz)
            and _within(pair.mem_mhz, self.mem_mhz)
        )

    def range_on(self, grid: ClockGrid) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """(core floor/ceiling, mem floor/ceiling) of the grid's pairs this rule allows."""
        pairs = [
            p for p in grid.pairs if _within(p.core_mhz, self.core_mhz) and _within(p.mem_mhz, self.mem_mhz)
        ]
        if not pairs:
            return None
        cores, mems = [p.core_mhz for p in pairs], [p.mem_mhz for p in pairs]
        return (min(cores), max(cores)), (min(mems), max(mems))


def _within(value: int, bounds: tuple[int, int] | None) -> bool:
    return bounds is None or bounds[0] <= value <= bounds[1]


@dataclass(frozen=True)
class DaemonRules:
    """The clock daemon's access rules: who may lease which GPU within which clocks."""

    rules: tuple[Rule, ...]
    source: str  # the file it came from, or "default (...)"

    @classmethod
    def load(cls, path: Path | str) -> DaemonRules:
        """A rules file, TOML (.toml) or JSON; KdvfsError naming the problem otherwise."""
        path = Path(path)
        try:
            text = path.read_text()
            raw = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
            parsed = _RulesFile.model_validate(raw)
        except OSError as exc:
            raise KdvfsError(f"rules file {path}: cannot read it ({exc.strerror})") from None
        except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
            raise KdvfsError(
                f"rules file {path}: not valid {path.suffix.lstrip('.') or 'JSON'} ({exc})"
            ) from None
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            raise KdvfsError(f"rules file {path}: {where}: {first['msg']}") from None
        rules = tuple(
            Rule(
                frozenset(_uid(u, path) for u in r.users),
                frozenset(_gid(g, path) for g in r.groups),
                None if r.gpus is None else frozenset(r.gpus),
                r.core_mhz,
                r.mem_mhz,
            )
            for r in parsed.allow
        )
        return cls(rules, str(path))

    def allows(self, peer: Peer, gpu: int, pair: ClockPair) -> bool:
        return any(rule.matches(peer) and rule.allows(gpu, pair) for rule in self.rules)

    def may_lease(self, peer: Peer, gpu: int) -> bool:
        return any(rule.matches(peer) and (rule.gpus is None or gpu in rule.gpus) for rule in self.rules)

    def may_lock(
        self, peer: Peer, grids: dict[int, ClockGrid]
    ) -> list[tuple[int, tuple[int, int], tuple[int, int]]]:
        """(gpu, core range, mem range) for each GPU and matching rule, clipped to the card."""
        out = []
        for gpu, grid in sorted(grids.items()):
            for rule in self.rules:
                if rule.matches(peer) and (rule.gpus is None or gpu in rule.gpus):
                    ranges = rule.range_on(grid)
                    if ranges is not None:
                        out.append((gpu, *ranges))
        return out


def default_rules(socket_gid: int) -> DaemonRules:
    """Root and members of the socket's group may lease every GPU within the card's range."""
    return DaemonRules(
        (Rule(frozenset({0}), frozenset({socket_gid})),), f"default (uid 0 and gid {socket_gid})"
    )


def _uid(user: str | int, path: Path) -> int:
    if isinstance(user, int):
        return user
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise KdvfsError(f"rules file {path}: no user named {user!r} on this machine") from None


def _gid(group: str | int, path: Path) -> int:
    if isinstance(group, int):
        return group
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise KdvfsError(f"rules file {path}: no group named {group!r} on this machine") from None
