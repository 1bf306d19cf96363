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
"""The store's named value holding the newest version handed out."""


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
        """Versions go on after `version`, the last one handed out (None: read from the
        store here, a store call)."""
        self._store = store
        self._pushed: dict[str, _Pushed] = {}
        last = self.stored_version(store) if version is None else version
        self._version = itertools.count(last + 1)

    @staticmethod
    def stored_version(store: Store) -> int:
        """The last version handed out, as the store keeps it (0: none yet)."""
        return int(store.get_value(VERSION_KEY) or 0)

    def reconnected(self, node: str) -> None:
        """A node's agent said hello: its set is sent again in full."""
        self._pushed[node] = _Pushed()

    def acknowledged(self, node: str, version: int) -> None:
        """A node's agent acknowledged `version`."""
        pushed = self._pushed.get(node)
        if pushed is not None and pushed.version == version:
            pushed.acked = True

    def due(
        self,
        desired: Mapping[str, Sequence[ReplicaState]],
        nodes: Iterable[str],
        now_s: float,
    ) -> list[Send]:
        """The sets to send now to the connected `nodes`: each whose replicas (or their
        revisions) changed, or not acknowledged within RESEND_S, recorded as sent at `now_s`
        (monotonic). The same set sent again keeps its version; `remember` stores the newest
        before they go out."""
        out = []
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
        return out

    def remember(self, sends: Sequence[Send]) -> None:
        """Store the newest version among `sends` (a store call: the controller runs it off
        the loop on PostgreSQL), so versions go on growing after a restart."""
        if sends:
            self._store.put_value(VERSION_KEY, str(max(s.version for s in sends)))
