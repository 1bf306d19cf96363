"""A canary's state and the gateways' traffic figures to and from the store's JSON (a key a
document lacks reads as its field's default)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fleet_svc.domain.canary import (
    CanaryRun,
    Figures,
    Histogram,
    Policy,
    Verdict,
    summed,
)
from fleet_svc.store.base import TrafficRecord


def histogram_doc(h: Histogram) -> dict[str, Any]:
    """A histogram as JSON-able data."""
    return {"bounds_ms": list(h.bounds_ms), "counts": list(h.counts)}


def histogram_of_doc(doc: Any) -> Histogram:
    """A histogram from its JSON (absent or malformed: empty)."""
    if not isinstance(doc, Mapping):
        return Histogram()
    bounds = tuple(float(b) for b in doc.get("bounds_ms", []))
    counts = tuple(int(c) for c in doc.get("counts", []))
    if len(counts) != len(bounds) + 1:
        return Histogram()
    return Histogram(bounds, counts)


def figures_doc(f: Figures) -> dict[str, Any]:
    """Summed figures as JSON-able data (a canary's state keeps its last analysis's)."""
    return {
        "requests": f.requests,
        "errors": f.errors,
        "context_refusals": f.context_refusals,
        "ttft": histogram_doc(f.ttft),
        "itl": histogram_doc(f.itl),
    }


def figures_of_doc(doc: Any) -> Figures:
    """Figures from their JSON: a canary state's (`errors`) or a traffic report's (`errors_5xx`
    and `timeouts`, both errors)."""
    if not isinstance(doc, Mapping):
        return Figures()
    errors = int(doc.get("errors", 0)) + int(doc.get("errors_5xx", 0)) + int(doc.get("timeouts", 0))
    return Figures(
        requests=int(doc.get("requests", 0)),
        errors=errors,
        context_refusals=int(doc.get("context_refusals", 0)),
        ttft=histogram_of_doc(doc.get("ttft")),
        itl=histogram_of_doc(doc.get("itl")),
    )


def policy_doc(p: Policy) -> dict[str, Any]:
    """A canary policy as JSON-able data."""
    return {
        "steps": list(p.steps),
        "step_min_s": p.step_min_s,
        "step_min_requests": p.step_min_requests,
        "max_error_ratio": p.max_error_ratio,
        "max_error_ratio_increase": p.max_error_ratio_increase,
        "max_p99_ttft_ms": p.max_p99_ttft_ms,
        "max_p99_itl_ms": p.max_p99_itl_ms,
        "max_context_refusal_ratio": p.max_context_refusal_ratio,
        "max_hold_s": p.max_hold_s,
    }


def policy_of_doc(doc: Mapping[str, Any]) -> Policy:
    """A canary policy from its JSON (as stored: already checked when it was accepted)."""
    base = Policy()
    return Policy(
        steps=tuple(int(x) for x in doc.get("steps", base.steps)) or base.steps,
        step_min_s=float(doc.get("step_min_s", base.step_min_s)),
        step_min_requests=int(doc.get("step_min_requests", base.step_min_requests)),
        max_error_ratio=float(doc.get("max_error_ratio", base.max_error_ratio)),
        max_error_ratio_increase=float(doc.get("max_error_ratio_increase", 0.0)),
        max_p99_ttft_ms=float(doc.get("max_p99_ttft_ms", 0.0)),
        max_p99_itl_ms=float(doc.get("max_p99_itl_ms", 0.0)),
        max_context_refusal_ratio=float(doc.get("max_context_refusal_ratio", 0.0)),
        max_hold_s=float(doc.get("max_hold_s", 0.0)),
    )


def canary_doc(run: CanaryRun) -> dict[str, Any]:
    """A canary's state as a rollout row keeps it."""
    return {
        "policy": policy_doc(run.policy),
        "step": run.step,
        "step_started_s": run.step_started_s,
        "promoted": run.promoted,
        "verdict": run.verdict.value,
        "findings": list(run.findings),
        "canary": figures_doc(run.canary),
        "baseline": figures_doc(run.baseline),
    }


def canary_of_doc(doc: Any) -> CanaryRun | None:
    """A canary's state from a rollout row (None: not a canary)."""
    if not isinstance(doc, Mapping):
        return None
    verdict = str(doc.get("verdict", ""))
    return CanaryRun(
        policy=policy_of_doc(doc.get("policy", {})),
        step=int(doc.get("step", 0)),
        step_started_s=float(doc.get("step_started_s", 0.0)),
        promoted=bool(doc.get("promoted", False)),
        verdict=Verdict(verdict) if verdict in {v.value for v in Verdict} else Verdict.NONE,
        findings=tuple(str(x) for x in doc.get("findings", [])),
        canary=figures_of_doc(doc.get("canary")),
        baseline=figures_of_doc(doc.get("baseline")),
    )


def revision_figures(records: Iterable[TrafficRecord], revision: int) -> tuple[Figures, Figures]:
    """The reports summed for `revision` (the canary) and for every other revision (the
    baseline): every gateway's, every interval's."""
    canary: list[Figures] = []
    baseline: list[Figures] = []
    for rec in records:
        (canary if rec.revision == revision else baseline).append(figures_of_doc(rec.figures))
    return summed(canary), summed(baseline)
