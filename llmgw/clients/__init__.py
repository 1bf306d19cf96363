"""Typed clients of llmgw's services: the one place a gRPC error becomes `Unreachable` or
`Refused` (llmgw.clients.errors)."""

from llmgw.clients.errors import ClientError, Refused, Unreachable
from llmgw.clients.fleet import FleetClient
from llmgw.clients.planner import AsyncPlannerClient, PlannerClient

__all__ = [
    "AsyncPlannerClient",
    "ClientError",
    "FleetClient",
    "PlannerClient",
    "Refused",
    "Unreachable",
]
