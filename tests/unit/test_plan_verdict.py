"""A whole plan's verdict: NOT_CHECKED with its reason when the model's shape was unread,
else the worst of its profiles' card verdicts."""

from __future__ import annotations

import pytest

from llmgw.common.v1 import common_pb2
from planner_svc.rpc.convert import plan_verdict

V = common_pb2


def changes(*verdicts: int) -> list[common_pb2.ProfileChange]:
    """Profile changes whose memory has these verdicts (0: no memory figures)."""
    out = []
    for i, v in enumerate(verdicts):
        c = common_pb2.ProfileChange(profile=f"p{i}")
        if v:
            c.memory.verdict = v  # type: ignore[assignment]
        out.append(c)
    return out


@pytest.mark.parametrize(
    ("profiles", "unchecked", "want"),
    [
        (changes(V.FIT_VERDICT_FITS), "its shape could not be read", V.FIT_VERDICT_NOT_CHECKED),
        (changes(V.FIT_VERDICT_FITS, V.FIT_VERDICT_WITHIN_MARGIN), "", V.FIT_VERDICT_WITHIN_MARGIN),
        (changes(V.FIT_VERDICT_DOES_NOT_FIT, V.FIT_VERDICT_FITS), "", V.FIT_VERDICT_DOES_NOT_FIT),
        # A CPU profile's RAM (and unknown weights) is NOT_CHECKED per profile: not the plan's.
        (changes(V.FIT_VERDICT_NOT_CHECKED, V.FIT_VERDICT_FITS), "", V.FIT_VERDICT_FITS),
        (changes(V.FIT_VERDICT_NOT_CHECKED, 0), "", V.FIT_VERDICT_UNSPECIFIED),
    ],
)
def test_plan_verdict(profiles: list[common_pb2.ProfileChange], unchecked: str, want: int) -> None:
    """An unread shape makes the plan NOT_CHECKED, saying why; else the worst card verdict."""
    verdict, note = plan_verdict(profiles, unchecked)
    assert verdict == want and note == unchecked
