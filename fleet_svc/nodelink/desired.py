"""Desired sets: what each node is told to run, versioned, sent when it changes and again
when its agent does not acknowledge it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fleet_svc.domain.gang import launchable
from fleet_svc.domain.phases import RUNNING
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.store.base import Store

RESEND_S = 5.0
"""A desired set not acknowledged within this long is sent again (it is idempotent)."""

VERSION_KEY = "desired_version"
"""The store's named value: no version handed out is above it."""
VERSION_BLOCK = 1024
"""Versions reserved in the store at a time: the stored value is raised a block ahead of the
newest version handed out, so a tick's sets go out without a store write of their own (one
in about a block of versions), as a database sequence caches its values; a restart skips what
was left of the block."""


def desired_by_node(replicas: Iterable[ReplicaState]) -> dict[str, list[ReplicaState]]:
    """Every node's desired replicas (those placed there in a running phase), by id; a gang
    on each of its members' nodes, once the addresses that member needs are known."""
    out: dict[str, list[ReplicaState]] = {}
    for r in replicas:
        if not r.node or r.phase not in RUNNING:
            continue
        if r.gang:
            for m in launchable(r):
                out.setdefault(m.node, []).append(r)
            continue
        out.setdefault(r.node, []).append(r)
    for group in out.values():
        group.sort(key=lambda r: r.id)
    return out


@dataclass
class _Pushed:
    """The last desired set sent to a node and whether it was acknowledged."""

    version: int = 0
    key: tuple[tuple[str, int, tuple[str, ...]], ...] = ()
    sent_s: float = 0.0
    acked: bool = True


@dataclass(frozen=True)
class Send:
    """A desired set to send: the node, its version and its replicas."""

    node: str
    version: int
    replicas: Sequence[ReplicaState]


class DesiredSets:
    """The versions of the nodes' desired sets. Versions only grow, across restarts too (the
    newest handed out is kept in the store), so an agent can tell a newer set from an older."""

    def __init__(self, store: Store, *, version: int | None = None) -> None:
        """Versions go on after `version`, the last one the store reserved (None: read from
        the store here, a store call)."""
        self._store = store
        self._pushed: dict[str, _Pushed] = {}
        self._unacked: dict[str, float] = {}
        """Nodes sent a set not acknowledged yet, and when it was sent."""
        self._reserved = self.stored_version(store) if version is None else version
        """The stored value: every version up to it may have been handed out."""
        self._version = itertools.count(self._reserved + 1)

    @staticmethod
    def stored_version(store: Store) -> int:
        """The versions reserved in the store: every one up to it may have been handed out
        (0: none yet)."""
        return int(store.get_value(VERSION_KEY) or 0)

    def reconnected(self, node: str) -> None:
        """A node's agent said hello: its set is sent again in full."""
        self._pushed[node] = _Pushed()
        self._unacked.pop(node, None)

    def acknowledged(self, node: str, version: int) -> None:
        """A node's agent acknowledged `version`."""
        pushed = self._pushed.get(node)
        if pushed is not None and pushed.version == version:
            pushed.acked = True
            self._unacked.pop(node, None)

    def resend_due(self, now_s: float) -> bool:
        """Whether a set sent is not acknowledged after RESEND_S (monotonic `now_s`)."""
        return any(now_s - sent_s >= RESEND_S for sent_s in self._unacked.values())

    def due(
        self,
        desired: Mapping[str, Sequence[ReplicaState]],
        nodes: Iterable[str],
        now_s: float,
    ) -> list[Send]:
        """The sets to send now to the connected `nodes`: each whose replicas (or their
        revisions) changed, or not acknowledged within RESEND_S, recorded as sent at `now_s`
        (monotonic). The same set sent again keeps its version; `remember` reserves the newest
        in the store before they go out, when `store_due` says so."""
        out = []
        nodes = list(nodes)
        for gone in self._unacked.keys() - set(nodes):
            del self._unacked[gone]  # its agent left: nothing waits on it now
        for node in nodes:
            want = desired.get(node, ())
            # A gang's member is sent again when its peers' addresses become known.
            key = tuple((r.id, r.revision, tuple(m.gang_address for m in r.members)) for r in want)
            pushed = self._pushed.setdefault(node, _Pushed())
            same = bool(pushed.version) and key == pushed.key
            if same and (pushed.acked or now_s - pushed.sent_s < RESEND_S):
                continue
            version = pushed.version if same else next(self._version)
            out.append(Send(node, version, want))
            self._pushed[node] = _Pushed(version=version, key=key, sent_s=now_s, acked=False)
            self._unacked[node] = now_s
        return out

    def store_due(self, sends: Sequence[Send]) -> bool:
        """Whether `remember` must write before `sends` go out: the newest among them is
        past the versions reserved in the store."""
        return bool(sends) and max(s.version for s in sends) > self._reserved

    def remember(self, sends: Sequence[Send]) -> None:
        """Reserve versions past the newest among `sends` in the store, when it is past those
        reserved already (a store call: the controller runs it off the loop on PostgreSQL),
        so versions go on growing after a restart."""
        top = max((s.version for s in sends), default=0)
        if top > self._reserved:
            reserved = top + VERSION_BLOCK
            self._store.put_value(VERSION_KEY, str(reserved))
            self._reserved = reserved
