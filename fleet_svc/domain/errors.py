"""The fleet's exceptions: one root, leaves that carry what a caller needs to act."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.authz.policy import AccessRefusal, RoleRequired, Unauthenticated
from llmgw.refusal import Refusal

__all__ = ["AccessRefusal", "RoleRequired", "Unauthenticated"]
"""The refusals for who calls are the planner's too (llmgw.authz.policy); named here as well,
so the fleet's code raises every refusal of its own from one module."""


@dataclass
class FleetError(Refusal):
    """Root of every refusal the fleet makes."""


@dataclass
class ModelNotFound(FleetError):
    """No such model in the catalog."""

    name: str = ""

    def metadata(self) -> dict[str, str]:
        return {"model": self.name}


@dataclass
class ModelExists(FleetError):
    """A model of that name is in the catalog already."""

    name: str = ""

    def metadata(self) -> dict[str, str]:
        return {"model": self.name}


@dataclass
class ModelDeclared(FleetError):
    """The model is declared in the cluster settings file: change it there."""

    name: str = ""
    path: str = ""

    def metadata(self) -> dict[str, str]:
        return {"model": self.name, "file": self.path}


@dataclass
class StaleRevision(FleetError):
    """The model changed since the caller read it."""

    name: str = ""
    expected: str = ""
    current: str = ""

    def metadata(self) -> dict[str, str]:
        return {"model": self.name, "etag": self.expected, "current_etag": self.current}


@dataclass
class InvalidModel(FleetError):
    """A model or request field is malformed; `field` names it."""

    field: str = ""

    def metadata(self) -> dict[str, str]:
        return {"field": self.field}


@dataclass
class UnknownEngine(InvalidModel):
    """A profile names an engine the registry (llmgw.engines.registry) does not know by that
    name; `known` lists the names it does."""

    engine: str = ""
    known: tuple[str, ...] = ()

    def metadata(self) -> dict[str, str]:
        return {"field": self.field, "engine": self.engine[:64], "known": ",".join(self.known)}


@dataclass
class PlanNotChecked(FleetError):
    """The planner could not read the model's shape, so its plan is not checked (verdict
    NOT_CHECKED), and the caller did not ask to apply an unchecked plan."""

    name: str = ""
    why: str = ""

    def metadata(self) -> dict[str, str]:
        return {"model": self.name, "why": self.why[:300]}


@dataclass
class RequestIdReused(FleetError):
    """A request id was used before for another method, or for another request (a body that
    differs, the id aside) within the request-id window."""

    request_id: str = ""
    method: str = ""

    def metadata(self) -> dict[str, str]:
        return {"request_id": self.request_id, "first_method": self.method}


@dataclass
class RolloutInProgress(FleetError):
    """Another change of the model is rolling out."""

    name: str = ""
    rollout_id: str = ""

    def metadata(self) -> dict[str, str]:
        return {"model": self.name, "rollout_id": self.rollout_id}


@dataclass
class NoRoomBeside(FleetError):
    """No node has the free cards to start a new replica beside an old one."""

    name: str = ""
    profile: str = ""
    gpu_class: str = ""
    need_gpus: int = 0
    most_free: int = 0
    need_nodes: int = 1
    """Nodes a new replica needs at once (more than one for a gang)."""
    nodes_with_room: int = 0
    """Nodes that could take one member of it now (said for a gang)."""

    def metadata(self) -> dict[str, str]:
        meta = {
            "model": self.name,
            "profile": self.profile,
            "gpu_class": self.gpu_class,
            "need_free_gpus": str(self.need_gpus),
            "most_free_gpus": str(self.most_free),
        }
        if self.need_nodes > 1:
            meta["need_nodes"] = str(self.need_nodes)
            meta["nodes_with_room"] = str(self.nodes_with_room)
        return meta


@dataclass
class NoRoomInPlace(FleetError):
    """An in-place change whose new replica could never be placed: no node of the class
    could free the cards it needs, even with the profile's old replicas stopped, while the
    other replicas there keep theirs."""

    name: str = ""
    profile: str = ""
    gpu_class: str = ""
    need_gpus: int = 0
    most_gpus: int = 0
    """The most cards any node of the class could free for it."""
    node: str = ""
    """The node that could free the most."""
    need_nodes: int = 1

    def metadata(self) -> dict[str, str]:
        meta = {
            "model": self.name,
            "profile": self.profile,
            "gpu_class": self.gpu_class,
            "need_gpus": str(self.need_gpus),
            "most_gpus": str(self.most_gpus),
            "node": self.node,
        }
        if self.need_nodes > 1:
            meta["need_nodes"] = str(self.need_nodes)
        return meta


@dataclass
class RolloutNotFound(FleetError):
    """No such rollout."""

    rollout_id: str = ""

    def metadata(self) -> dict[str, str]:
        return {"rollout_id": self.rollout_id}


@dataclass
class CannotUndo(FleetError):
    """A rollout cannot be rolled back now (it runs, or the model changed since)."""

    rollout_id: str = ""

    def metadata(self) -> dict[str, str]:
        return {"rollout_id": self.rollout_id}


@dataclass
class PlannerUnavailable(FleetError):
    """The planner did not answer; nothing changed, the call may be retried."""


@dataclass
class NoHello(FleetError):
    """An agent's stream did not open with a Hello naming its node."""


@dataclass
class StreamReplaced(FleetError):
    """An agent's stream was ended by the fleet: a newer one from the same node replaced it."""

    node: str = ""

    def metadata(self) -> dict[str, str]:
        return {"node": self.node}


@dataclass
class InvalidSource(InvalidModel):
    """A model's source is not of a form the fleet accepts (it could read as an engine flag,
    climb out of a cache, or name something no node may load)."""

    source: str = ""

    def metadata(self) -> dict[str, str]:
        return {"field": self.field, "source": self.source[:200]}


@dataclass
class NodeIdentityMismatch(FleetError):
    """An agent said Hello for a node its certificate does not name (or has no node
    certificate where one is required)."""

    node: str = ""
    identity: str = ""

    def metadata(self) -> dict[str, str]:
        return {"node": self.node, "identity": self.identity}


@dataclass
class ModelTooLarge(InvalidModel):
    """A model holds more profiles, arguments, files or nodes than the fleet's limits allow
    (`llmgw.limits.Limits`; `limit` names which)."""

    limit: str = ""
    maximum: int = 0
    count: int = 0

    def metadata(self) -> dict[str, str]:
        return {
            "field": self.field,
            "limit": self.limit,
            "maximum": str(self.maximum),
            "count": str(self.count),
        }


@dataclass
class PlannerFailed(FleetError):
    """The planner answered a change with an error that is not a refusal (INTERNAL, UNKNOWN,
    a status without the planner's ErrorInfo): nothing changed, and the planner's log says
    why. `code` is the planner's status code's name."""

    code: str = ""

    def metadata(self) -> dict[str, str]:
        return {"planner_code": self.code}


@dataclass
class TooManyCalls(FleetError):
    """A caller (`scope` "identity") or everyone together (`scope` "total") already has as
    many streams, or unary calls in flight, as the fleet's limit `limit` allows."""

    limit: str = ""
    maximum: int = 0
    scope: str = ""
    identity: str = ""
    retry_after_s: int = 1

    def metadata(self) -> dict[str, str]:
        return {
            "limit": self.limit,
            "maximum": str(self.maximum),
            "scope": self.scope,
            "identity": self.identity,
        }


@dataclass
class NotCanary(FleetError):
    """A promotion of a rollout that is no canary being judged (not one, ended, promoted)."""

    rollout_id: str = ""

    def metadata(self) -> dict[str, str]:
        return {"rollout_id": self.rollout_id}


@dataclass
class InvalidRequest(FleetError):
    """A request whose fields cannot be acted on (a canary policy, a traffic report): the
    field it names, and what would do."""

    field: str = ""

    def metadata(self) -> dict[str, str]:
        return {"field": self.field}


@dataclass
class CanaryAnalysisFailed(FleetError):
    """A canary broke its analysis' thresholds: not a call's refusal but a rollout's end,
    carried as ErrorInfo in `Rollout.failure` (metadata: the figures and thresholds)."""

    figures: dict[str, str] | None = None

    def metadata(self) -> dict[str, str]:
        return dict(self.figures or {})
