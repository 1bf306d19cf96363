"""A canary rollout's traffic steps: begun once its canary replicas are ready, judged on the
figures the gateways reported for the step's window, promoted (by analysis or by hand), or
failed and undone. Pure: the caller passes the figures, the wall time and the replicas."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from fleet_svc.domain.canary import (
    Analysis,
    Breach,
    CanaryRun,
    Figures,
    Verdict,
    judge,
)
from fleet_svc.domain.control import Action
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState
from fleet_svc.domain.rollout import Event, EventKind, Rollout, Stage, in_canary
from fleet_svc.domain.rollout_run import fail

CANARY_ANALYSIS_FAILED = "CANARY_ANALYSIS_FAILED"
"""The reason of a rollout its canary's analysis failed."""


def window_start(ro: Rollout) -> float:
    """When the running step's window began (wall clock; 0 when no step runs)."""
    run = ro.canary
    return run.step_started_s if run is not None and in_canary(ro) else 0.0


def ready_to_judge(ro: Rollout) -> bool:
    """Whether every canary step's new replica is ready (the weighted steps may run)."""
    canaries = [s for s in ro.steps if s.canary]
    return bool(canaries) and all(s.stage is Stage.CANARY for s in canaries)


def _lost_canary(ro: Rollout, replicas: Mapping[str, ReplicaState]) -> str:
    """Why a canary replica serving its step can serve no more ("" when all can): gone, or
    FAILED or LOST (a crash the agent restarts is waited for: it comes back READY)."""
    for step in ro.steps:
        if not step.canary or step.stage is not Stage.CANARY:
            continue
        new = replicas.get(step.new_id)
        if new is None:
            return f"canary replica {step.new_id} is gone"
        if new.phase in (ReplicaPhase.FAILED, ReplicaPhase.LOST):
            where = new.node or "no node"
            return f"canary replica {new.id} on {where} is {new.phase.value}: {new.reason}"
    return ""


def _weights_line(run: CanaryRun) -> str:
    pct = run.weight_percent
    return f"step {run.step + 1}/{len(run.policy.steps)}: new revision {pct} %, old {100 - pct} %"


def step_on(
    ro: Rollout,
    canary: Figures,
    baseline: Figures,
    now_wall: float,
    replicas: Mapping[str, ReplicaState],
    now_s: float,
    *,
    new_id: Callable[[], str],
) -> tuple[Rollout, list[Action], list[Event]]:
    """Move a canary on: begin its first step once its replicas are ready, then judge the
    running step on `canary`'s and `baseline`'s figures over the step's window.

    PROMOTE sets the next step (after the last, the canary is promoted and the rollout goes
    on replacing the old replicas beside); HOLD records why, with an event when that changed;
    FAIL ends the rollout FAILED (CANARY_ANALYSIS_FAILED, the breaches in its metadata) and
    retires the new replicas, so the old revision has the model's whole weight at once.
    """
    run = ro.canary
    if run is None or not in_canary(ro) or ro.done:
        return ro, [], []
    lost = _lost_canary(ro, replicas)
    if lost:
        return fail(ro, lost, replicas, now_s, new_id=new_id)
    if not run.started:
        if not ready_to_judge(ro):
            return ro, [], []
        run = replace(run, step_started_s=now_wall, verdict=Verdict.NONE, findings=())
        ro = replace(ro, canary=run)
        return ro, [], [Event(EventKind.CANARY_STEP, message=_weights_line(run), canary=run)]
    analysis = judge(run.policy, canary, baseline, now_wall - run.step_started_s)
    judged = replace(
        run,
        canary=canary,
        baseline=baseline,
        verdict=analysis.verdict,
        findings=analysis.findings,
    )
    if analysis.verdict is Verdict.HOLD:
        changed = (run.verdict, run.findings) != (judged.verdict, judged.findings)
        ro = replace(ro, canary=judged)
        if not changed:
            return ro, [], []
        message = "hold: " + "; ".join(analysis.findings)
        return ro, [], [Event(EventKind.CANARY_ANALYSIS, message=message, canary=judged)]
    if analysis.verdict is Verdict.FAIL:
        return _failed(replace(ro, canary=judged), analysis, replicas, now_s, new_id)
    done = Event(EventKind.CANARY_ANALYSIS, message="promote", canary=judged)
    return _next(ro, judged, now_wall, done)


def promote(ro: Rollout, *, full: bool, by: str, now_wall: float) -> tuple[Rollout, list[Event]]:
    """An operator's promotion: the next step without its analysis, or (`full`) past every
    step. A canary not judging any more is left as it is."""
    run = ro.canary
    if run is None or not in_canary(ro) or ro.done:
        return ro, []
    how = "every step" if full else "the next step"
    marked = replace(
        run,
        verdict=Verdict.PROMOTE,
        findings=(f"promoted to {how} by {by}",),
        step=len(run.policy.steps) - 1 if full else run.step,
    )
    done = Event(EventKind.CANARY_ANALYSIS, message=marked.findings[0], canary=marked)
    ro, _actions, events = _next(ro, marked, now_wall, done)
    return ro, events


def _next(
    ro: Rollout, run: CanaryRun, now_wall: float, done: Event
) -> tuple[Rollout, list[Action], list[Event]]:
    """The step after `run`'s: its weights begin now, or, after the last, the canary is
    promoted (the rollout's steps go on beside: domain.rollout.advance)."""
    step = run.step + 1
    if step >= len(run.policy.steps):
        promoted = replace(run, step=step, promoted=True)
        ro = replace(ro, canary=promoted)
        return ro, [], [done, Event(EventKind.CANARY_STEP, message="promoted", canary=promoted)]
    # A step promoted by hand before the canary replicas were ready begins with them.
    started = replace(run, step=step, step_started_s=now_wall if run.started else 0.0)
    ro = replace(ro, canary=started)
    if not started.started:
        return ro, [], [done]
    return (
        ro,
        [],
        [done, Event(EventKind.CANARY_STEP, message=_weights_line(started), canary=started)],
    )


def failure_metadata(run: CanaryRun, breaches: tuple[Breach, ...]) -> dict[str, str]:
    """ErrorInfo metadata of a failed analysis: each broken check's value and threshold, the
    step and both revisions' request counts (numbers as strings)."""
    meta = {
        "step": str(run.step + 1),
        "weight_percent": str(run.weight_percent),
        "canary_requests": str(run.canary.requests),
        "baseline_requests": str(run.baseline.requests),
        "failed_checks": ",".join(b.check for b in breaches),
    }
    for b in breaches:
        meta[b.check] = f"{b.value:.6g}"
        meta[f"{b.check}_threshold"] = f"{b.threshold:.6g}"
    return meta


def _failed(
    ro: Rollout,
    analysis: Analysis,
    replicas: Mapping[str, ReplicaState],
    now_s: float,
    new_id: Callable[[], str],
) -> tuple[Rollout, list[Action], list[Event]]:
    run = ro.canary
    assert run is not None
    reason = f"canary analysis failed at {_weights_line(run)}: " + "; ".join(analysis.findings)
    judged = Event(
        EventKind.CANARY_ANALYSIS, message="fail: " + "; ".join(analysis.findings), canary=run
    )
    ro = replace(
        ro,
        failure_reason=CANARY_ANALYSIS_FAILED,
        failure_metadata=failure_metadata(run, analysis.breaches),
    )
    ended, actions, events = fail(ro, reason, replicas, now_s, new_id=new_id, events=(judged,))
    # The ending event carries the figures too (WatchRollout's last message says why).
    last = events[-1]
    events[-1] = replace(last, canary=run)
    return ended, actions, events
