"""Canary policies, states and traffic reports between the protos and the domain's values."""

from __future__ import annotations

from google.rpc import error_details_pb2

from fleet_svc.domain.canary import CanaryRun, Figures, Histogram, InvalidPolicy, Policy, policy_of
from fleet_svc.domain.errors import InvalidRequest
from fleet_svc.domain.rollout import Rollout, Strategy
from fleet_svc.domain.traffic import EndpointReport
from fleet_svc.rpc.status import DOMAIN
from llmgw.fleet.v1 import fleet_pb2

_VERDICTS = {
    "": fleet_pb2.CANARY_VERDICT_UNSPECIFIED,
    "promote": fleet_pb2.CANARY_VERDICT_PROMOTE,
    "hold": fleet_pb2.CANARY_VERDICT_HOLD,
    "fail": fleet_pb2.CANARY_VERDICT_FAIL,
}


def change_strategy(
    strategy: int, policy: fleet_pb2.CanaryPolicy | None, *, in_place: bool = False
) -> tuple[Strategy, Policy | None]:
    """The strategy and canary policy a change asks for: a policy makes it a canary (with
    strategy unset or CANARY); CANARY with no policy takes the default one.

    Raises:
        InvalidRequest: a policy with another strategy (or in place), or a policy that
            cannot run (domain.canary.policy_of).
    """
    if policy is None and strategy != fleet_pb2.STRATEGY_CANARY:
        if strategy == fleet_pb2.STRATEGY_IN_PLACE or (in_place and strategy == 0):
            return Strategy.IN_PLACE, None
        if strategy == fleet_pb2.STRATEGY_AUTO:
            return Strategy.AUTO, None
        return Strategy.BESIDE, None
    if strategy not in (fleet_pb2.STRATEGY_UNSPECIFIED, fleet_pb2.STRATEGY_CANARY) or in_place:
        raise InvalidRequest(
            "a canary rolls out beside the old replicas: drop the other strategy (or "
            "--in-place), or the canary policy",
            field="canary",
        )
    return Strategy.CANARY, policy_of_proto(policy or fleet_pb2.CanaryPolicy())


def policy_of_proto(p: fleet_pb2.CanaryPolicy) -> Policy:
    """A canary policy from its message.

    Raises:
        InvalidRequest: naming the field that cannot run.
    """
    try:
        return policy_of(
            steps=list(p.steps),
            step_min_s=p.step_min_s,
            step_min_requests=p.step_min_requests,
            max_error_ratio=p.max_error_ratio,
            max_error_ratio_increase=p.max_error_ratio_increase,
            max_p99_ttft_ms=p.max_p99_ttft_ms,
            max_p99_itl_ms=p.max_p99_itl_ms,
            max_context_refusal_ratio=p.max_context_refusal_ratio,
            max_hold_s=p.max_hold_s,
        )
    except InvalidPolicy as exc:
        raise InvalidRequest(str(exc), field=f"canary.{exc.field}") from exc


def policy_proto(p: Policy) -> fleet_pb2.CanaryPolicy:
    """A canary policy as its message."""
    return fleet_pb2.CanaryPolicy(
        steps=list(p.steps),
        step_min_s=round(p.step_min_s),
        step_min_requests=p.step_min_requests,
        max_error_ratio=p.max_error_ratio,
        max_error_ratio_increase=p.max_error_ratio_increase,
        max_p99_ttft_ms=round(p.max_p99_ttft_ms),
        max_p99_itl_ms=round(p.max_p99_itl_ms),
        max_context_refusal_ratio=p.max_context_refusal_ratio,
        max_hold_s=round(p.max_hold_s),
    )


def figures_proto(f: Figures, revision: int) -> fleet_pb2.TrafficFigures:
    """One revision's summed figures as their message."""
    return fleet_pb2.TrafficFigures(
        revision=revision,
        requests=f.requests,
        errors=f.errors,
        context_refusals=f.context_refusals,
        error_ratio=f.error_ratio,
        context_refusal_ratio=f.context_refusal_ratio,
        p99_ttft_ms=f.p99_ttft_ms,
        p99_itl_ms=f.p99_itl_ms,
    )


def canary_status(
    run: CanaryRun, *, canary_revision: int, baseline_revision: int
) -> fleet_pb2.CanaryStatus:
    """A canary's state as its message."""
    status = fleet_pb2.CanaryStatus(
        policy=policy_proto(run.policy),
        step=run.step,
        weight_percent=run.weight_percent,
        canary=figures_proto(run.canary, canary_revision),
        baseline=figures_proto(run.baseline, baseline_revision),
        verdict=_VERDICTS.get(run.verdict.value, fleet_pb2.CANARY_VERDICT_UNSPECIFIED),
        findings=list(run.findings),
        promoted=run.promoted,
    )
    if run.step_started_s > 0:
        status.step_started_at.FromNanoseconds(int(run.step_started_s * 1e9))
    return status


def failure_info(ro: Rollout) -> error_details_pb2.ErrorInfo | None:
    """A failed rollout's reason and metadata as ErrorInfo (None when it has none)."""
    if not ro.failure_reason:
        return None
    return error_details_pb2.ErrorInfo(
        reason=ro.failure_reason, domain=DOMAIN, metadata=dict(ro.failure_metadata)
    )


def _histogram(h: fleet_pb2.LatencyHistogram) -> Histogram:
    bounds = tuple(h.upper_bounds_ms)
    counts = tuple(h.counts)
    if not bounds and not counts:
        return Histogram()
    return Histogram(bounds, counts)


def endpoint_reports(request: fleet_pb2.ReportTrafficRequest) -> list[EndpointReport]:
    """A report's endpoints as the domain checks them (domain.traffic.check_report)."""
    return [
        EndpointReport(
            replica_id=e.replica_id,
            model=e.model,
            revision=e.revision,
            requests=e.requests,
            errors_5xx=e.errors_5xx,
            timeouts=e.timeouts,
            context_refusals=e.context_refusals,
            ttft=_histogram(e.ttft),
            itl=_histogram(e.itl),
        )
        for e in request.endpoints
    ]
