"""Canary analysis as pure functions: policies checked, figures summed and quantiles read from
histograms, the verdict on a step, the weights of a step, and a canary rollout stepped,
promoted and failed."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fleet_svc.domain.canary import (
    CanaryRun,
    Figures,
    Histogram,
    InvalidPolicy,
    Policy,
    Verdict,
    judge,
    policy_of,
    split_weights,
    summed,
)
from fleet_svc.domain.canary_steps import CANARY_ANALYSIS_FAILED, promote, step_on
from fleet_svc.domain.control import Retire
from fleet_svc.domain.errors import CanaryAnalysisFailed
from fleet_svc.domain.phases import ReplicaPhase
from fleet_svc.domain.replicas import ReplicaState, RunSpec
from fleet_svc.domain.rollout import Event, EventKind, Rollout, RolloutState, Stage, Step, Strategy
from fleet_svc.metrics import CanaryMetrics, canary_gauges
from fleet_svc.rpc.status import code_and_reason
from fleet_svc.store.canary_rows import canary_doc, canary_of_doc

BOUNDS = (50.0, 100.0, 200.0, 400.0)


def test_a_policy_with_no_fields_takes_the_defaults() -> None:
    """0 and empty fields mean the defaults (5/25/50/100 %, 60 s, 100 requests, 1 %)."""
    p = policy_of()
    assert (p.steps, p.step_min_s, p.step_min_requests, p.max_error_ratio) == (
        (5, 25, 50, 100),
        60.0,
        100,
        0.01,
    )


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"steps": [25, 5]}, "steps"),
        ({"steps": [5, 5]}, "steps"),
        ({"steps": [0, 50]}, "steps"),
        ({"steps": [50, 101]}, "steps"),
        ({"steps": list(range(1, 30))}, "steps"),
        ({"step_min_s": -1}, "step_min_s"),
        ({"step_min_s": 10**9}, "step_min_s"),
        ({"step_min_requests": -5}, "step_min_requests"),
        ({"max_error_ratio": 1.5}, "max_error_ratio"),
        ({"max_error_ratio": float("nan")}, "max_error_ratio"),
        ({"max_p99_ttft_ms": -3}, "max_p99_ttft_ms"),
        ({"max_context_refusal_ratio": 2}, "max_context_refusal_ratio"),
        ({"max_hold_s": -1}, "max_hold_s"),
        ({"max_hold_s": 10**9}, "max_hold_s"),
        ({"step_min_s": 300, "max_hold_s": 120}, "max_hold_s"),
        ({"max_hold_s": 30}, "max_hold_s"),
    ],
)
def test_a_policy_that_cannot_run_is_refused_naming_its_field(
    fields: dict[str, object], field: str
) -> None:
    """Steps not rising in 1..100, negative or absurd numbers and ratios above 1 are refused."""
    with pytest.raises(InvalidPolicy) as caught:
        policy_of(**fields)  # type: ignore[arg-type]
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("counts", "q", "want"),
    [
        ((0, 0, 0, 0, 0), 0.99, 0.0),
        ((100, 0, 0, 0, 0), 0.99, 49.5),
        ((0, 100, 0, 0, 0), 0.5, 75.0),
        ((90, 0, 0, 10, 0), 0.99, 200.0 + 200.0 * 0.9),
        ((0, 0, 0, 0, 7), 0.99, 400.0),
    ],
)
def test_a_quantile_is_interpolated_within_its_bucket(
    counts: tuple[int, ...], q: float, want: float
) -> None:
    """As Prometheus' histogram_quantile: linear within the bucket, the top bound above all."""
    assert Histogram(BOUNDS, counts).quantile(q) == pytest.approx(want)


def test_histograms_of_other_bounds_merge_on_the_union() -> None:
    """Same bounds add bucket by bucket; other bounds keep each count at its own bound."""
    a = Histogram((10.0, 20.0), (1, 2, 3))
    assert a.plus(a) == Histogram((10.0, 20.0), (2, 4, 6))
    merged = a.plus(Histogram((15.0,), (4, 5)))
    assert merged == Histogram((10.0, 15.0, 20.0), (1, 4, 2, 8))
    assert merged.total == a.total + 9


def test_figures_of_several_gateways_are_summed() -> None:
    """Two gateways' reports of one window add up; ratios are of the sums."""
    one = Figures(requests=100, errors=1, ttft=Histogram(BOUNDS, (100, 0, 0, 0, 0)))
    two = Figures(
        requests=300, errors=7, context_refusals=4, ttft=Histogram(BOUNDS, (0, 0, 0, 300, 0))
    )
    total = summed([one, two])
    assert (total.requests, total.errors, total.context_refusals) == (400, 8, 4)
    assert total.error_ratio == pytest.approx(0.02)
    assert total.ttft.total == 400


HEALTHY = Figures(requests=500, errors=1, ttft=Histogram(BOUNDS, (500, 0, 0, 0, 0)))
BASE = Figures(requests=5000, errors=10)


@pytest.mark.parametrize(
    ("policy", "canary", "elapsed_s", "verdict", "checks"),
    [
        (Policy(), replace(HEALTHY, requests=99, errors=99), 600.0, Verdict.HOLD, ()),
        (Policy(max_hold_s=900), replace(HEALTHY, requests=99), 899.0, Verdict.HOLD, ()),
        (Policy(max_hold_s=900), replace(HEALTHY, requests=99), 900.0, Verdict.FAIL, ("hold_s",)),
        (Policy(), HEALTHY, 10.0, Verdict.HOLD, ()),
        (Policy(), HEALTHY, 60.0, Verdict.PROMOTE, ()),
        (Policy(), replace(HEALTHY, errors=50), 1.0, Verdict.FAIL, ("error_ratio",)),
        (
            Policy(max_error_ratio=-1, max_error_ratio_increase=0.001),
            replace(HEALTHY, errors=5),
            60.0,
            Verdict.FAIL,
            ("error_ratio_increase",),
        ),
        (Policy(max_p99_ttft_ms=40), HEALTHY, 60.0, Verdict.FAIL, ("p99_ttft_ms",)),
        (
            Policy(max_p99_itl_ms=10),
            replace(HEALTHY, itl=Histogram(BOUNDS, (0, 500, 0, 0, 0))),
            60.0,
            Verdict.FAIL,
            ("p99_itl_ms",),
        ),
        (
            Policy(max_context_refusal_ratio=0.05),
            replace(HEALTHY, context_refusals=100),
            60.0,
            Verdict.FAIL,
            ("context_refusal_ratio",),
        ),
    ],
)
def test_a_step_is_judged_on_its_figures(
    policy: Policy, canary: Figures, elapsed_s: float, verdict: Verdict, checks: tuple[str, ...]
) -> None:
    """Too few requests hold whatever the figures, until `max_hold_s` (then they fail); a
    broken threshold fails at once; otherwise the step promotes once its least time passed."""
    analysis = judge(policy, canary, BASE, elapsed_s)
    assert analysis.verdict is verdict
    assert tuple(b.check for b in analysis.breaches) == checks
    if verdict is not Verdict.PROMOTE:
        assert analysis.findings


@pytest.mark.parametrize(
    ("endpoints", "percent", "want"),
    [
        ({"o1": (1, 100), "o2": (1, 100), "n1": (2, 100)}, 5, {"n1": 15, "o1": 143, "o2": 142}),
        ({"o1": (1, 100), "o2": (1, 100), "n1": (2, 100)}, 50, {"n1": 150, "o1": 75, "o2": 75}),
        ({"o1": (1, 100), "n1": (2, 100)}, 100, {"n1": 200, "o1": 0}),
        ({"o1": (1, 100), "n1": (2, 100)}, 0, {"n1": 0, "o1": 200}),
        ({"o1": (1, 10), "n1": (2, 10)}, 1, {"n1": 1, "o1": 19}),
        ({"o1": (1, 100), "o2": (1, 100)}, 25, {"o1": 100, "o2": 100}),
    ],
)
def test_weights_give_the_new_revision_its_share_of_the_total(
    endpoints: dict[str, tuple[int, int]], percent: int, want: dict[str, int]
) -> None:
    """The new revision's weights sum to the step's share of the model's total, the old ones'
    to the rest, exactly; with one revision only, every endpoint keeps its own."""
    weights = split_weights(endpoints, 2, percent)
    assert weights == want
    assert sum(weights.values()) == sum(w for _r, w in endpoints.values())


def canary_rollout(steps: tuple[int, ...] = (10, 50, 100), **policy: object) -> Rollout:
    """A canary rollout of m (1 -> 2) whose canary replica c is ready beside old replica o."""
    return Rollout(
        id="ro-1",
        model="m",
        kind="context",
        strategy=Strategy.CANARY,
        from_revision=1,
        to_revision=2,
        steps=(
            Step("gpu", old_id="o", new_id="c", stage=Stage.CANARY, canary=True),
            Step("gpu", old_id="o2"),
        ),
        canary=CanaryRun(policy=Policy(steps=steps, step_min_s=30, step_min_requests=10, **policy)),  # type: ignore[arg-type]
    )


REPLICAS = {
    rid: ReplicaState(
        id=rid,
        model="m",
        profile="gpu",
        revision=rev,
        spec=RunSpec("vllm"),
        phase=ReplicaPhase.READY,
        address="h:1",
    )
    for rid, rev in (("o", 1), ("o2", 1), ("c", 2))
}
IDS = itertools.count()


def new_id() -> str:
    """Fresh replica ids."""
    return f"r-{next(IDS)}"


def test_a_canary_walks_its_steps_and_is_promoted_after_the_last() -> None:
    """Its first step begins once the canary is ready; each passing analysis after the least
    time sets the next step; after the last the canary is promoted."""
    ro = canary_rollout()
    ro, _a, events = step_on(ro, Figures(), Figures(), 1000.0, REPLICAS, 0.0, new_id=new_id)
    assert [e.kind for e in events] == [EventKind.CANARY_STEP]
    assert ro.canary is not None and ro.canary.weight_percent == 10
    good = Figures(requests=50)
    ro, _a, events = step_on(ro, good, Figures(), 1010.0, REPLICAS, 0.0, new_id=new_id)
    assert ro.canary is not None and ro.canary.verdict is Verdict.HOLD and ro.canary.step == 0
    assert [e.kind for e in events] == [EventKind.CANARY_ANALYSIS]
    _same, _a, again = step_on(ro, good, Figures(), 1011.0, REPLICAS, 0.0, new_id=new_id)
    assert again == [], "the same hold is not told twice"
    for at, percent in ((1031.0, 50), (1062.0, 100)):
        ro, _a, events = step_on(ro, good, Figures(), at, REPLICAS, 0.0, new_id=new_id)
        assert ro.canary is not None and ro.canary.weight_percent == percent
        assert [e.kind for e in events] == [EventKind.CANARY_ANALYSIS, EventKind.CANARY_STEP]
    ro, _a, _e = step_on(ro, good, Figures(), 1093.0, REPLICAS, 0.0, new_id=new_id)
    assert ro.canary is not None and ro.canary.promoted and ro.canary.weight_percent == 0
    assert ro.state is RolloutState.RUNNING


def test_a_failed_analysis_ends_the_rollout_and_retires_the_canary() -> None:
    """A broken threshold fails the rollout CANARY_ANALYSIS_FAILED with its figures and
    thresholds, and retires the canary replica; the old replicas are not touched."""
    ro, _a, _e = step_on(
        canary_rollout(), Figures(), Figures(), 1000.0, REPLICAS, 0.0, new_id=new_id
    )
    bad = Figures(requests=100, errors=40)
    ended, actions, events = step_on(
        ro, bad, Figures(requests=100), 1005.0, REPLICAS, 0.0, new_id=new_id
    )
    assert ended.state is RolloutState.FAILED
    assert ended.failure_reason == CANARY_ANALYSIS_FAILED
    assert ended.failure_metadata["error_ratio"] == "0.4"
    assert ended.failure_metadata["error_ratio_threshold"] == "0.01"
    assert ended.failure_metadata["failed_checks"] == "error_ratio"
    assert [a.replica_id for a in actions if isinstance(a, Retire)] == ["c"]
    assert (
        events[0].kind is EventKind.CANARY_ANALYSIS and events[-1].kind is EventKind.ROLLOUT_FAILED
    )
    assert events[-1].canary is not None and "error_ratio 0.4 > 0.01" in ended.reason


def test_a_promotion_by_hand_skips_the_analysis() -> None:
    """promote moves to the next step at once; full promotes past every step."""
    ro, _a, _e = step_on(
        canary_rollout(), Figures(), Figures(), 1000.0, REPLICAS, 0.0, new_id=new_id
    )
    one, events = promote(ro, full=False, by="alice", now_wall=1001.0)
    assert one.canary is not None and one.canary.step == 1 and events
    full, _events = promote(ro, full=True, by="alice", now_wall=1001.0)
    assert full.canary is not None and full.canary.promoted
    again, nothing = promote(full, full=True, by="alice", now_wall=1002.0)
    assert again == full and nothing == []


def test_a_canary_state_round_trips_through_its_row() -> None:
    """Step, window, verdict, findings and figures survive the store (a restart resumes)."""
    run = CanaryRun(
        policy=Policy(steps=(1, 2, 3), max_p99_ttft_ms=5.0, max_hold_s=700.0),
        step=2,
        step_started_s=1234.5,
        verdict=Verdict.HOLD,
        findings=("x",),
        canary=Figures(requests=3, errors=1, itl=Histogram((1.0,), (2, 1))),
        baseline=Figures(requests=9),
    )
    assert canary_of_doc(canary_doc(run)) == run


def test_the_failure_reason_is_the_status_tables() -> None:
    """The reason a failed canary carries is the one the error table names (docs/errors.md)."""
    assert code_and_reason(CanaryAnalysisFailed("x"))[1] == CANARY_ANALYSIS_FAILED


def test_metrics_show_a_canarys_step_weight_figures_and_verdicts() -> None:
    """A canary being judged shows its step, weight and both revisions' figures; each
    analysis recorded counts its verdict."""
    run = CanaryRun(
        policy=Policy(steps=(10, 50)),
        step=1,
        step_started_s=5.0,
        verdict=Verdict.HOLD,
        canary=Figures(requests=40, errors=2),
        baseline=Figures(requests=400),
    )
    ro = replace(canary_rollout(), canary=run)
    families = {f.name: f for f in canary_gauges([ro])}
    assert families["llmgw_fleet_canary_step"].samples[0].value == 2
    assert families["llmgw_fleet_canary_weight_percent"].samples[0].value == 50
    ratios = {s.labels["role"]: s.value for s in families["llmgw_fleet_canary_error_ratio"].samples}
    assert ratios == {"canary": 0.05, "baseline": 0.0}
    registry = CollectorRegistry()
    counter = CanaryMetrics(registry)
    counter(ro, Event(EventKind.CANARY_ANALYSIS, canary=replace(run, verdict=Verdict.FAIL)))
    counter(ro, Event(EventKind.CANARY_STEP, canary=run))
    text = generate_latest(registry).decode()
    assert 'llmgw_fleet_canary_verdicts_total{verdict="fail"} 1.0' in text
    assert 'llmgw_fleet_canary_verdicts_total{verdict="hold"} 0.0' in text


@pytest.mark.parametrize("phase", [ReplicaPhase.FAILED, ReplicaPhase.LOST, None])
def test_a_canary_replica_that_cannot_serve_fails_the_rollout(phase: ReplicaPhase | None) -> None:
    """A canary replica FAILED, LOST or gone fails the rollout instead of holding forever."""
    replicas = dict(REPLICAS)
    if phase is None:
        del replicas["c"]
    else:
        replicas["c"] = replace(replicas["c"], phase=phase)
    ended, _a, events = step_on(
        canary_rollout(), Figures(), Figures(), 1.0, replicas, 0.0, new_id=new_id
    )
    assert ended.state is RolloutState.FAILED and "canary replica c" in ended.reason
    assert events[-1].kind is EventKind.ROLLOUT_FAILED
