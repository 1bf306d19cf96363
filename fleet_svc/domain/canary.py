"""Canary analysis: a policy's traffic steps, the figures a gateway reports summed per revision,
the verdict on one step (promote, hold or fail), and the weights that give the new revision its
share of a model's traffic. Pure: the controller passes the figures and the time in."""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_STEPS = (5, 25, 50, 100)
"""Percent of the model's weight at each step when a policy names none (Argo Rollouts' and
Flagger's examples walk a canary up in a few such steps)."""
DEFAULT_STEP_MIN_S = 60.0
"""A step's least duration: Flagger's default analysis interval is one minute."""
DEFAULT_STEP_MIN_REQUESTS = 100
"""Requests a step's canary must serve before it is judged (Flagger's `threshold` analogue:
too little traffic says nothing, so the step holds, as Flagger halts advancement)."""
DEFAULT_MAX_ERROR_RATIO = 0.01
"""Flagger's example `request-success-rate` check holds the success rate at 99 %."""
MAX_STEPS = 20
WEEK_S = 7 * 86400
"""The longest a step may last or hold (a canary is not a way to park a rollout)."""
MAX_BUCKETS = 64


class InvalidPolicy(ValueError):
    """A canary policy that cannot be run; the message names the field and what would do."""

    def __init__(self, message: str, field_name: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Policy:
    """A canary's steps and thresholds. A threshold of 0 is not checked (`max_error_ratio`:
    a negative value is not checked, 0 in a request means the default)."""

    steps: tuple[int, ...] = DEFAULT_STEPS
    step_min_s: float = DEFAULT_STEP_MIN_S
    step_min_requests: int = DEFAULT_STEP_MIN_REQUESTS
    max_error_ratio: float = DEFAULT_MAX_ERROR_RATIO
    max_error_ratio_increase: float = 0.0
    max_p99_ttft_ms: float = 0.0
    max_p99_itl_ms: float = 0.0
    max_context_refusal_ratio: float = 0.0
    max_hold_s: float = 0.0


def policy_of(
    *,
    steps: Iterable[int] = (),
    step_min_s: float = 0,
    step_min_requests: int = 0,
    max_error_ratio: float = 0.0,
    max_error_ratio_increase: float = 0.0,
    max_p99_ttft_ms: float = 0.0,
    max_p99_itl_ms: float = 0.0,
    max_context_refusal_ratio: float = 0.0,
    max_hold_s: float = 0.0,
) -> Policy:
    """A policy from a request's fields, 0 (or empty) taking the default.

    Raises:
        InvalidPolicy: steps not rising within 1..100, a negative duration or count, a ratio
            above 1, a latency below 0, or numbers that are not finite.
    """
    chosen = tuple(steps) or DEFAULT_STEPS
    if len(chosen) > MAX_STEPS:
        raise InvalidPolicy(f"a canary has at most {MAX_STEPS} steps, not {len(chosen)}", "steps")
    for before, after in itertools.pairwise(chosen):
        if after <= before:
            raise InvalidPolicy(
                f"canary steps must rise (e.g. 5, 25, 50, 100): {after} follows {before}", "steps"
            )
    if chosen[0] < 1 or chosen[-1] > 100:
        raise InvalidPolicy("canary steps are percents of the model's weight, 1..100", "steps")
    numbers = {
        "step_min_s": step_min_s,
        "max_error_ratio": max_error_ratio,
        "max_error_ratio_increase": max_error_ratio_increase,
        "max_p99_ttft_ms": max_p99_ttft_ms,
        "max_p99_itl_ms": max_p99_itl_ms,
        "max_context_refusal_ratio": max_context_refusal_ratio,
        "max_hold_s": max_hold_s,
    }
    for name, value in numbers.items():
        if not math.isfinite(value):
            raise InvalidPolicy(f"canary {name} must be a finite number", name)
    for name in (
        "step_min_s",
        "max_error_ratio_increase",
        "max_p99_ttft_ms",
        "max_p99_itl_ms",
        "max_hold_s",
    ):
        if numbers[name] < 0:
            raise InvalidPolicy(f"canary {name} must not be negative", name)
    for name in ("step_min_s", "max_hold_s"):
        if numbers[name] > WEEK_S:
            raise InvalidPolicy(f"canary {name} is at most a week ({WEEK_S} s)", name)
    least = float(step_min_s) or DEFAULT_STEP_MIN_S
    if 0 < max_hold_s < least:
        raise InvalidPolicy(
            f"canary max_hold_s ({_num(max_hold_s)} s) must be at least the step's"
            f" {_num(least)} s (step_min_s), or 0 for no limit",
            "max_hold_s",
        )
    if step_min_requests < 0:
        raise InvalidPolicy("canary step_min_requests must not be negative", "step_min_requests")
    for name in ("max_error_ratio", "max_error_ratio_increase", "max_context_refusal_ratio"):
        if numbers[name] > 1:
            raise InvalidPolicy(f"canary {name} is a ratio of requests, at most 1", name)
    if max_context_refusal_ratio < 0:
        raise InvalidPolicy("canary max_context_refusal_ratio must not be negative", "ratio")
    return Policy(
        steps=chosen,
        step_min_s=float(step_min_s) or DEFAULT_STEP_MIN_S,
        step_min_requests=step_min_requests or DEFAULT_STEP_MIN_REQUESTS,
        max_error_ratio=max_error_ratio or DEFAULT_MAX_ERROR_RATIO,
        max_error_ratio_increase=max_error_ratio_increase,
        max_p99_ttft_ms=float(max_p99_ttft_ms),
        max_p99_itl_ms=float(max_p99_itl_ms),
        max_context_refusal_ratio=max_context_refusal_ratio,
        max_hold_s=float(max_hold_s),
    )


@dataclass(frozen=True)
class Histogram:
    """Requests per latency bucket: `counts[i]` fell at or under `bounds_ms[i]` (and above the
    bound before); the last count, one past the bounds, fell above every bound."""

    bounds_ms: tuple[float, ...] = ()
    counts: tuple[int, ...] = (0,)

    @property
    def total(self) -> int:
        """Requests counted."""
        return sum(self.counts)

    def plus(self, other: Histogram) -> Histogram:
        """Both histograms' counts together, bucket by bound (gateways should share bounds;
        differing ones are merged on the union of bounds, each count kept at its own bound)."""
        if other.bounds_ms == self.bounds_ms:
            return Histogram(self.bounds_ms, tuple(a + b for a, b in zip_counts(self, other)))
        by_bound: dict[float, int] = {}
        over = 0
        for h in (self, other):
            for bound, count in zip(h.bounds_ms, h.counts, strict=False):
                by_bound[bound] = by_bound.get(bound, 0) + count
            over += h.counts[-1] if len(h.counts) > len(h.bounds_ms) else 0
        bounds = tuple(sorted(by_bound))
        return Histogram(bounds, (*(by_bound[b] for b in bounds), over))

    def quantile(self, q: float) -> float:
        """The q-quantile in ms, interpolated linearly within its bucket (as Prometheus'
        histogram_quantile); one in the bucket above every bound reads as the highest bound.
        0 when nothing was counted."""
        total = self.total
        if total <= 0 or not self.bounds_ms:
            return 0.0
        rank = q * total
        seen = 0
        lower = 0.0
        for bound, count in zip(self.bounds_ms, self.counts, strict=False):
            if count > 0 and seen + count >= rank:
                return lower + (bound - lower) * (rank - seen) / count
            seen += count
            lower = bound
        return self.bounds_ms[-1]


def zip_counts(a: Histogram, b: Histogram) -> Iterable[tuple[int, int]]:
    """Counts of two histograms of the same bounds, bucket by bucket."""
    width = len(a.bounds_ms) + 1
    ca = (*a.counts, *([0] * (width - len(a.counts))))
    cb = (*b.counts, *([0] * (width - len(b.counts))))
    return zip(ca[:width], cb[:width], strict=True)


@dataclass(frozen=True)
class Figures:
    """Traffic of one revision summed over a window: requests, errors (5xx answers and
    timeouts), context-length refusals, and the latency histograms."""

    requests: int = 0
    errors: int = 0
    context_refusals: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)

    def plus(self, other: Figures) -> Figures:
        """Both windows' traffic together."""
        return Figures(
            self.requests + other.requests,
            self.errors + other.errors,
            self.context_refusals + other.context_refusals,
            self.ttft.plus(other.ttft),
            self.itl.plus(other.itl),
        )

    @property
    def error_ratio(self) -> float:
        """Errors per request (0 with no requests)."""
        return self.errors / self.requests if self.requests else 0.0

    @property
    def context_refusal_ratio(self) -> float:
        """Context-length refusals per request (0 with no requests)."""
        return self.context_refusals / self.requests if self.requests else 0.0

    @property
    def p99_ttft_ms(self) -> float:
        """The 99th percentile of time to first token."""
        return self.ttft.quantile(0.99)

    @property
    def p99_itl_ms(self) -> float:
        """The 99th percentile of inter-token latency."""
        return self.itl.quantile(0.99)


def summed(figures: Iterable[Figures]) -> Figures:
    """Every window's traffic together (several gateways, several intervals)."""
    total = Figures()
    for f in figures:
        total = total.plus(f)
    return total


class Verdict(enum.StrEnum):
    """What one analysis decides (the values are what the store keeps)."""

    NONE = ""
    """Not judged yet."""
    PROMOTE = "promote"
    """Enough requests, enough time and no threshold broken: on to the next step."""
    HOLD = "hold"
    """Too few requests, or the step's least time has not passed: the step goes on."""
    FAIL = "fail"
    """A threshold was broken: the rollout fails and is undone."""


@dataclass(frozen=True)
class Breach:
    """One threshold a canary broke: what was measured, its value and the limit."""

    check: str
    value: float
    threshold: float

    def line(self) -> str:
        """The breach as people read it."""
        return f"{self.check} {_num(self.value)} > {_num(self.threshold)}"


@dataclass(frozen=True)
class Analysis:
    """One verdict with why: the thresholds broken (FAIL) or what the step waits for (HOLD)."""

    verdict: Verdict
    findings: tuple[str, ...] = ()
    breaches: tuple[Breach, ...] = ()


def _num(value: float) -> str:
    return f"{value:.4g}"


def breaches(policy: Policy, canary: Figures, baseline: Figures) -> tuple[Breach, ...]:
    """The thresholds `canary`'s figures break, against `baseline`'s where relative."""
    out: list[Breach] = []
    if policy.max_error_ratio >= 0 and canary.error_ratio > policy.max_error_ratio:
        out.append(Breach("error_ratio", canary.error_ratio, policy.max_error_ratio))
    if policy.max_error_ratio_increase > 0 and baseline.requests > 0:
        increase = canary.error_ratio - baseline.error_ratio
        if increase > policy.max_error_ratio_increase:
            out.append(Breach("error_ratio_increase", increase, policy.max_error_ratio_increase))
    if policy.max_p99_ttft_ms > 0 and canary.p99_ttft_ms > policy.max_p99_ttft_ms:
        out.append(Breach("p99_ttft_ms", canary.p99_ttft_ms, policy.max_p99_ttft_ms))
    if policy.max_p99_itl_ms > 0 and canary.p99_itl_ms > policy.max_p99_itl_ms:
        out.append(Breach("p99_itl_ms", canary.p99_itl_ms, policy.max_p99_itl_ms))
    ratio = canary.context_refusal_ratio
    if policy.max_context_refusal_ratio > 0 and ratio > policy.max_context_refusal_ratio:
        out.append(Breach("context_refusal_ratio", ratio, policy.max_context_refusal_ratio))
    return tuple(out)


def judge(policy: Policy, canary: Figures, baseline: Figures, elapsed_s: float) -> Analysis:
    """The verdict on a step from its window's figures so far.

    A step is judged once its canary has served `step_min_requests` (fewer: HOLD, whatever
    the figures, so a handful of requests cannot fail or pass it). Then a broken threshold
    fails it at once — not at the step's end, so a bad revision leaves routing within one
    report — and an unbroken one promotes it once `step_min_s` has passed (before: HOLD).
    """
    if canary.requests < policy.step_min_requests:
        short = (
            f"the canary served {canary.requests} of the {policy.step_min_requests}"
            " requests a step needs"
        )
        if 0 < policy.max_hold_s <= elapsed_s:
            held = Breach("hold_s", elapsed_s, policy.max_hold_s)
            return Analysis(Verdict.FAIL, (f"{short} in {_num(elapsed_s)} s", held.line()), (held,))
        return Analysis(Verdict.HOLD, (short,))
    broken = breaches(policy, canary, baseline)
    if broken:
        return Analysis(Verdict.FAIL, tuple(b.line() for b in broken), broken)
    if elapsed_s < policy.step_min_s:
        return Analysis(Verdict.HOLD, (f"a step lasts at least {_num(policy.step_min_s)} s",))
    return Analysis(Verdict.PROMOTE)


def split_weights(
    endpoints: Mapping[str, tuple[int, int]], new_revision: int, percent: int
) -> dict[str, int]:
    """Weights giving the new revision `percent` of a model's total weight.

    Args:
        endpoints: replica id -> (revision, its own weight), the model's routable endpoints.
        new_revision: the canary's revision; every other revision is the baseline.
        percent: the new revision's share, 0..100.

    Returns:
        replica id -> weight: the new revision's sum to round(total × percent / 100) (at
        least 1 while percent > 0), the rest's to what remains, each group split in
        proportion to its endpoints' own weights (largest remainder, so the sums are exact).
        The endpoints' own weights when either group is empty.
    """
    new = {rid: w for rid, (rev, w) in endpoints.items() if rev == new_revision}
    old = {rid: w for rid, (rev, w) in endpoints.items() if rev != new_revision}
    if not new or not old:
        return {rid: w for rid, (_rev, w) in endpoints.items()}
    total = sum(new.values()) + sum(old.values())
    share = round(total * percent / 100)
    if percent > 0:
        share = max(share, 1)
    return {**_apportion(new, share), **_apportion(old, total - share)}


def _apportion(weights: Mapping[str, int], total: int) -> dict[str, int]:
    """`total` split over `weights` in proportion (largest remainder; ties by id)."""
    own = sum(weights.values())
    if own <= 0:
        even = {rid: 1 for rid in weights}
        return _apportion(even, total) if weights and total > 0 else dict.fromkeys(weights, 0)
    exact = {rid: total * w / own for rid, w in weights.items()}
    out = {rid: math.floor(x) for rid, x in exact.items()}
    left = total - sum(out.values())
    for rid in sorted(exact, key=lambda r: (out[r] - exact[r], r))[:left]:
        out[rid] += 1
    return out


@dataclass(frozen=True)
class CanaryRun:
    """Where a canary stands: its policy, the step now, when its window began (wall clock,
    0 until every canary replica is ready), the last analysis and its figures."""

    policy: Policy = field(default_factory=Policy)
    step: int = 0
    step_started_s: float = 0.0
    promoted: bool = False
    verdict: Verdict = Verdict.NONE
    findings: tuple[str, ...] = ()
    canary: Figures = field(default_factory=Figures)
    baseline: Figures = field(default_factory=Figures)

    @property
    def started(self) -> bool:
        """Whether the weighted steps began (every canary replica is ready)."""
        return self.step_started_s > 0

    @property
    def weight_percent(self) -> int:
        """The new revision's share of the model's weight now: 0 until the steps begin, the
        step's percent during them, 0 once promoted (the endpoints' own weights then)."""
        if self.promoted or not self.started:
            return 0
        return self.policy.steps[min(self.step, len(self.policy.steps) - 1)]
