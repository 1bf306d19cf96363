"""Calls only the leading fleet serves: refused elsewhere with NOT_LEADER and the leader's address.

A server interceptor (after the auth interceptor: a caller not let in learns nothing of the
leader), so no servicer method needing the leader is reached on a fleet that follows. Reads of
what the store holds (the catalog, replicas, rollouts and their watches) are served by every
fleet, and so are agents' streams (fleet_svc/rpc/agent_relay.py); changes and ListNodes (the
live inventory, which only the leader's controller holds) are the leader's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from grpc_status import rpc_status

from fleet_svc.domain.access import FLEET, MUTATIONS
from fleet_svc.rpc.status import store_status
from fleet_svc.store.base import NotLeader
from llmgw.rpc.handlers import admitted

log = structlog.get_logger(__name__)

LEADER_ONLY = MUTATIONS | {FLEET + "ListNodes"}
"""The RPCs a fleet that does not lead refuses (dry runs of changes too: they size against the
live inventory, which only the leader's controller holds). Agents' streams are served by every
fleet (fleet_svc/rpc/agent_relay.py)."""

Refusal = Callable[[], NotLeader | None]


class LeaderGate(grpc.aio.ServerInterceptor):
    """Refuses LEADER_ONLY calls while `refusal()` says this fleet does not lead."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        """Asked at each call (set once the fleet's duties exist)."""

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method not in LEADER_ONLY:
            return handler
        wrapped: grpc.RpcMethodHandler[Any, Any] = admitted(
            handler, lambda request, context: self._admit(method, context)
        )
        return wrapped

    async def _admit(self, method: str, context: Any) -> None:
        refused = self.refusal()
        if refused is None:
            return
        status = store_status(refused)
        assert status is not None, "the store table names NotLeader"
        log.info(
            "call_not_leader",
            rpc=method.rsplit("/", 1)[-1],
            leader=refused.leader,
            leader_address=refused.leader_address,
        )
        await context.abort_with_status(rpc_status.to_status(status))
