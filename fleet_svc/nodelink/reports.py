"""A node's report as its store row holds it (fleet_svc.store.base.NodeReport.report): the
Hello's view of the node, the latest report of each replica, the last acknowledgement.

Written by the fleet holding the node's stream and read by the leader's controller. The reader
takes nothing on trust: a field of the wrong type reads as absent, a replica report that does
not decode is left out, so a damaged row costs that node's news and nothing else."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleet_svc.domain.nodes import NodeView
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.reports import Observed
from fleet_svc.store.rows import progress_doc, progress_of_doc
from llmgw.card import Card
from llmgw.rejection import Rejection


@dataclass
class NodeNews:
    """A node's report, decoded."""

    view: NodeView
    observed: dict[str, Observed] = field(default_factory=dict)
    ack_version: int = 0
    rejected: tuple[Rejection, ...] = ()


def _int(doc: Mapping[str, Any], key: str) -> int:
    value = doc.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key, "")
    return value if isinstance(value, str) else ""


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def card_doc(c: Card) -> dict[str, Any]:
    """A card as JSON-able data."""
    return {
        "index": c.index,
        "uuid": c.uuid,
        "model": c.model,
        "memory_total_bytes": c.memory_total_bytes,
        "memory_used_bytes": c.memory_used_bytes,
        "cuda_memory_total_bytes": c.cuda_memory_total_bytes,
    }


def card_of_doc(doc: Mapping[str, Any]) -> Card:
    """A card from `card_doc`'s data."""
    return Card(
        index=_int(doc, "index"),
        uuid=_str(doc, "uuid"),
        model=_str(doc, "model"),
        memory_total_bytes=_int(doc, "memory_total_bytes"),
        memory_used_bytes=_int(doc, "memory_used_bytes"),
        cuda_memory_total_bytes=_int(doc, "cuda_memory_total_bytes"),
    )


def observed_doc(o: Observed) -> dict[str, Any]:
    """A replica report as JSON-able data."""
    return {
        "replica_id": o.replica_id,
        "revision": o.revision,
        "phase": o.phase.value,
        "address": o.address,
        "restarts": o.restarts,
        "message": o.message,
        "log_tail": list(o.log_tail),
        "gpus": list(o.gpus),
        "gang_address": o.gang_address,
        "progress": progress_doc(o.progress),
    }


def observed_of_doc(doc: Any) -> Observed | None:
    """A replica report from `observed_doc`'s data; None when it does not decode."""
    if not isinstance(doc, dict) or not _str(doc, "replica_id"):
        return None
    try:
        phase = ReplicaPhase(doc.get("phase"))
    except ValueError:
        return None
    gpus = doc.get("gpus", [])
    return Observed(
        replica_id=_str(doc, "replica_id"),
        revision=_int(doc, "revision"),
        phase=phase,
        address=_str(doc, "address"),
        restarts=_int(doc, "restarts"),
        message=_str(doc, "message"),
        log_tail=_strs(doc.get("log_tail")),
        gpus=tuple(g for g in gpus if isinstance(g, int)) if isinstance(gpus, list) else (),
        gang_address=_str(doc, "gang_address"),
        progress=progress_of_doc(progress)
        if isinstance(progress := doc.get("progress"), dict)
        else None,
    )


def report_doc(
    view: NodeView,
    observed: Iterable[Observed],
    ack_version: int,
    rejected: Iterable[Rejection],
) -> dict[str, Any]:
    """A node's whole report as its row holds it."""
    return {
        "view": {
            "labels": dict(view.labels),
            "cards": [card_doc(c) for c in view.cards],
            "engines": list(view.engines),
            "engine_versions": dict(view.engine_versions),
            "memory_bytes": view.memory_bytes,
            "memory_free_bytes": view.memory_free_bytes,
        },
        "observed": [observed_doc(o) for o in observed],
        "ack": {
            "version": ack_version,
            "rejected": [
                {
                    "replica_id": r.replica_id,
                    "revision": r.revision,
                    "reason": r.reason,
                    "message": r.message,
                }
                for r in rejected
            ],
        },
    }


def news_of(node: str, doc: Mapping[str, Any]) -> NodeNews:
    """A node's report from its row (`report_doc`'s data, checked)."""
    v = doc.get("view")
    v = v if isinstance(v, dict) else {}
    cards = v.get("cards")
    view = NodeView(
        name=node,
        labels=_str_map(v.get("labels")),
        cards=tuple(card_of_doc(c) for c in cards if isinstance(c, dict))
        if isinstance(cards, list)
        else (),
        engines=_strs(v.get("engines")),
        engine_versions=_str_map(v.get("engine_versions")),
        memory_bytes=_int(v, "memory_bytes"),
        memory_free_bytes=_int(v, "memory_free_bytes"),
    )
    observed: dict[str, Observed] = {}
    listed = doc.get("observed")
    for item in listed if isinstance(listed, list) else ():
        o = observed_of_doc(item)
        if o is not None:
            observed[o.replica_id] = o
    ack = doc.get("ack")
    ack = ack if isinstance(ack, dict) else {}
    rejected = ack.get("rejected")
    return NodeNews(
        view=view,
        observed=observed,
        ack_version=_int(ack, "version"),
        rejected=tuple(
            Rejection(
                _str(r, "replica_id"), _int(r, "revision"), _str(r, "reason"), _str(r, "message")
            )
            for r in (rejected if isinstance(rejected, list) else ())
            if isinstance(r, dict)
        ),
    )
