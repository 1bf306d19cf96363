"""The fleet's `Planner` over gRPC: requests built from the fleet's values, sent through the
typed planner client (llmgw.clients.planner, the one place a transport error is decoded), and
answers read back into the fleet's values."""

from __future__ import annotations

from fleet_svc.domain import errors
from fleet_svc.domain.asked import ContextAsk, GPUsAsk
from fleet_svc.domain.catalog import Entry
from fleet_svc.planner import Planned
from fleet_svc.rpc.convert import batch_from_proto, inventory_to_proto, model_to_proto
from fleet_svc.rpc.status import PlannerRefused
from llmgw.clients.errors import Refused, Unreachable
from llmgw.clients.planner import AsyncPlannerClient
from llmgw.common.v1 import common_pb2
from llmgw.model import Inventory
from llmgw.planner.v1 import planner_pb2
from llmgw.rpc.common import profile_from_proto
from llmgw.tls import ClientTLS

PLANNER_TIMEOUT_S = 60.0
"""How long the fleet waits for the planner (a cold Hugging Face fetch can be slow)."""


# The codes a planner refusal comes with (planner_svc/rpc/status.py, docs/errors.md). Any
# other code, or one without an ErrorInfo reason, is the planner failing, not refusing.
_REFUSAL_CODES = frozenset(
    {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "NOT_FOUND", "OUT_OF_RANGE", "RESOURCE_EXHAUSTED"}
)


def _failed(exc: Unreachable | Refused) -> Exception:
    """What a failed call becomes: unavailable (nothing changed, retry), the planner's
    refusal passed on with its whole status, or, for a planner failure (INTERNAL, UNKNOWN, a
    status without ErrorInfo), the fleet's own PLANNER_FAILED: a caller never sees a planner
    bug as if it were a refusal of its request."""
    if isinstance(exc, Unreachable):
        return errors.PlannerUnavailable(
            f"the planner at {exc.address} did not answer ({exc.code}); nothing changed: try again"
        )
    if exc.reason and exc.code in _REFUSAL_CODES:
        return PlannerRefused(exc.status)
    return errors.PlannerFailed(
        f"the planner failed on this change ({exc.code}); nothing changed: its log has the details",
        code=exc.code,
    )


def _unchecked(change: common_pb2.ContextChange | common_pb2.GPUsChange) -> str:
    """Why the planner could not check a plan (its verdict NOT_CHECKED), "" when it could."""
    if change.verdict != common_pb2.FIT_VERDICT_NOT_CHECKED:
        return ""
    return change.verdict_note or "the planner could not read the model's shape"


class GrpcPlanner:
    """The planner at `address` (over TLS with `tls`); its refusals are passed on unchanged."""

    def __init__(self, address: str, *, tls: ClientTLS | None = None) -> None:
        self._client = AsyncPlannerClient(address, timeout_s=PLANNER_TIMEOUT_S, tls=tls)
        self.address = address

    async def size_context(self, entry: Entry, inventory: Inventory, ask: ContextAsk) -> Planned:
        """SizeContext on the planner."""
        request = planner_pb2.SizeContextRequest(
            model=model_to_proto(entry),
            tokens=ask.tokens,
            slots=ask.slots,
            inventory=inventory_to_proto(inventory),
            sequences=ask.sequences,
        )
        try:
            answer = await self._client.size_context(request)
        except (Unreachable, Refused) as exc:
            raise _failed(exc) from exc
        return Planned(
            profiles=tuple(profile_from_proto(p, i) for i, p in enumerate(answer.profiles)),
            report=answer.change.SerializeToString(),
            context_length=answer.change.after,
            max_output=answer.change.max_output,
            unchecked=_unchecked(answer.change),
            batches=tuple(batch_from_proto(b) for b in answer.batches),
        )

    async def plan_gpus(self, entry: Entry, inventory: Inventory, ask: GPUsAsk) -> Planned:
        """PlanGPUs on the planner."""
        request = planner_pb2.PlanGPUsRequest(
            model=model_to_proto(entry),
            gpus=ask.gpus,
            profile=ask.profile,
            inventory=inventory_to_proto(inventory),
            sequences=ask.sequences,
        )
        try:
            answer = await self._client.plan_gpus(request)
        except (Unreachable, Refused) as exc:
            raise _failed(exc) from exc
        return Planned(
            profiles=tuple(profile_from_proto(p, i) for i, p in enumerate(answer.profiles)),
            report=answer.change.SerializeToString(),
            unchecked=_unchecked(answer.change),
            batches=tuple(batch_from_proto(b) for b in answer.batches),
        )

    async def close(self) -> None:
        """Close the channel."""
        await self._client.close()
