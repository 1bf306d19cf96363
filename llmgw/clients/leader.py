"""Finding the leading fleet among several: the addresses a client was given, the one it calls
now, and where to go after a call failed.

Several fleets share one PostgreSQL and one leads (docs/fleet.md, "Leadership"). A fleet that
does not lead answers what needs the leader with UNAVAILABLE, reason NOT_LEADER and the
leader's address in `leader_address` ("" while an election is under way). So a client given
`--fleet a:1,b:1,c:1` (or a name that resolves to several addresses: a Kubernetes headless
Service) calls the first; told NOT_LEADER with an address it goes there at once; told nothing
(or that address does not answer) it tries the next in turn. The address that answered stays
current for the next call: a client finds the leader once, not on every call.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence

from llmgw.clients.errors import ClientError, Unreachable

NOT_LEADER = "NOT_LEADER"
"""The ErrorInfo reason of a fleet that does not lead."""
LEADER_ADDRESS = "leader_address"
"""The ErrorInfo metadata key naming where the leader answers."""
MAX_ADDRESSES = 16
"""Addresses a client keeps, those it was given and the leaders it was sent to."""

Resolve = Callable[[str, int], Sequence[str]]


def _resolve(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (IPv4 and IPv6), in the resolver's order, once each."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    seen: list[str] = []
    for info in infos:
        ip = str(info[4][0])
        if ip not in seen:
            seen.append(ip)
    return seen


def fleet_addresses(spec: str, resolve: Resolve = _resolve) -> tuple[str, ...]:
    """The fleet addresses a `--fleet` value names: HOST:PORT entries separated by commas; a
    lone entry whose host name resolves to several addresses (a headless Service) stands for
    each of them.

    Raises:
        ValueError: no address, or an entry without a port.
    """
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if not entries:
        raise ValueError("no fleet address given: --fleet HOST:PORT[,HOST:PORT...]")
    for entry in entries:
        host, sep, port = entry.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"fleet address {entry!r} is not HOST:PORT")
    if len(entries) > 1:
        return tuple(dict.fromkeys(entries))
    host, _, port = entries[0].rpartition(":")
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare)
        return (entries[0],)
    except ValueError:
        pass
    found = resolve(bare, int(port))
    if len(found) < 2:
        return (entries[0],)  # one address (or none yet): let gRPC resolve the name itself
    return tuple(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in found)


def leader_hint(failure: ClientError) -> str:
    """The leader's address a NOT_LEADER answer names ("" for any other failure)."""
    if isinstance(failure, Unreachable) and failure.reason == NOT_LEADER:
        return (failure.metadata or {}).get(LEADER_ADDRESS, "")
    return ""


def not_leader(failure: ClientError) -> bool:
    """Whether a call failed because the fleet it reached does not lead."""
    return isinstance(failure, Unreachable) and failure.reason == NOT_LEADER


class Fleets:
    """The fleet addresses a client knows and the one it calls now."""

    def __init__(self, addresses: Sequence[str]) -> None:
        if not addresses:
            raise ValueError("no fleet address given")
        self.addresses = list(addresses)
        self.current = self.addresses[0]

    def after(self, failure: ClientError) -> bool:
        """Move on from `current` after `failure`: to the leader it names, else to the next
        address in turn.

        Returns:
            True when it moved to a named leader (try there at once), False when it moved on
            in turn (wait a little first: an election may be under way).
        """
        hint = leader_hint(failure)
        if hint and hint != self.current:
            if hint not in self.addresses:
                if len(self.addresses) >= MAX_ADDRESSES:
                    self.addresses.pop(len(self.addresses) - 1)
                self.addresses.append(hint)
            self.current = hint
            return True
        at = self.addresses.index(self.current) if self.current in self.addresses else -1
        self.current = self.addresses[(at + 1) % len(self.addresses)]
        return False

    def __str__(self) -> str:
        return ",".join(self.addresses)
