"""The PlannerService servicer: requests to domain calls, answers and refusals back."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import Message

from llmgw.authz.guard import current_caller
from llmgw.authz.policy import ANONYMOUS
from llmgw.common.v1 import common_pb2
from llmgw.engines.llamacpp import LLAMACPP_VERSION
from llmgw.identity import peer_identity
from llmgw.limits import DEFAULT_LIMITS, Limits
from llmgw.model import Model
from llmgw.planner.v1 import planner_pb2, planner_pb2_grpc
from llmgw.rpc import common
from llmgw.shape import ModelShape
from llmgw.sources import redacted
from planner_svc.domain import errors
from planner_svc.domain.context import check_size_request, size_context
from planner_svc.domain.gpus import check_gpus_request, plan_gpus
from planner_svc.rpc import convert, decoded
from planner_svc.rpc.fresh import FreshPlans
from planner_svc.rpc.placing import PlanCosts, timed
from planner_svc.rpc.status import refusals_as_status

log = structlog.get_logger(__name__)

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"


class Resolver(Protocol):
    """What the servicer needs of a shape resolver."""

    async def resolve(
        self, source: str, files: Any = (), *, caller: str | Callable[[], str] = ""
    ) -> ModelShape:
        """The shape of the model at `source`, fetched (when it must be) on `caller`'s
        account."""


def caller_of(context: Context) -> str:
    """Who a call is from, for per-caller limits: the identity the call was admitted as
    (planner_svc.rpc.auth: certificate or token), else its certificate identity, else the host
    it came from (the port varies by connection), else ""."""
    admitted = current_caller()
    if admitted is not None and admitted.kind != ANONYMOUS:
        return admitted.identity
    identity = peer_identity(context)
    if identity is not None:
        return str(identity)
    peer = context.peer() or ""
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


class PlannerServicer(planner_pb2_grpc.PlannerServiceServicer):
    """Answers SizeContext, PlanGPUs and DescribeModel."""

    def __init__(self, resolver: Resolver, limits: Limits = DEFAULT_LIMITS) -> None:
        self._resolver = resolver
        self._limits = limits
        self._answers = _Answers(limit_bytes=limits.answer_cache_bytes)
        self._model_of, self._inventory_of = decoded.decoders(limits)
        # Planning is pure Python: on the event loop, one large request would hold every other
        # call (health checks included) for its whole length. One worker thread, not a pool:
        # the GIL lets only one plan run at a time anyway, so more threads would only hold
        # more requests' work in memory at once.
        # A plan seen to be cheap runs on the loop instead: the hop costs more (placing.py).
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="planning")
        self._costs = PlanCosts()
        self._fresh = FreshPlans(LLAMACPP_VERSION)

    def _like(
        self, request: Message, values: tuple[object, ...], extras: tuple[Hashable, ...]
    ) -> tuple[Hashable, ...] | None:
        """The key of plans like this request's; None when its model or inventory message
        is too large to be kept decoded (then the values are new objects each call), or the
        request too large for its other fields to be kept in a key."""
        kept = decoded.KEPT_MESSAGE_BYTES
        if request.ByteSize() > 3 * kept:
            return None
        for name in ("model", "inventory"):
            if getattr(request, name).ByteSize() > kept:
                return None
        return PlanCosts.key(values, (type(request).__name__, *extras))

    async def _planned(
        self,
        plan: Callable[[], T],
        like: tuple[Hashable, ...] | None = None,
        values: tuple[object, ...] = (),
    ) -> T:
        """`plan()`, run on the event loop when the last plan `like` it was cheap, else on the
        planning thread (its context variables with it); its CPU noted under `like`."""
        spent: list[float] = []
        try:
            if self._costs.cheap(like):
                return timed(plan, spent)()
            context = contextvars.copy_context()
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._planner, context.run, timed(plan, spent))
        finally:
            if spent:
                self._costs.note(like, spent[0], values)

    async def _resolve(
        self, msg: common_pb2.Model, context: Context
    ) -> ModelShape | errors.SourceUnreachable | None:
        """The shape of a model's source (None for an inline shape or no source); a source
        that cannot be reached is returned, not raised: the change goes ahead with a note."""
        if msg.HasField("shape") or not msg.source:
            return None
        files = tuple((f.path, f.bytes) for f in msg.origin.files)
        try:
            return await self._resolver.resolve(
                msg.source, files, caller=lambda: caller_of(context)
            )
        except errors.SourceUnreachable as exc:
            log.info(
                "shape_unreadable", model=msg.name, source=redacted(msg.source), error=exc.message
            )
            return exc

    @staticmethod
    def _shape_of(
        model: Model, resolved: ModelShape | errors.SourceUnreachable | None
    ) -> tuple[ModelShape | None, str]:
        """A model's shape and, when it could not be read, a note saying so.

        A source that cannot be reached leaves the change to go ahead unchecked (as the
        reference does); a malformed header or config is refused (InvalidShape, raised by the
        resolver), since the engine would not load it either.
        """
        if isinstance(resolved, errors.SourceUnreachable):
            return None, (
                f"its shape could not be read ({resolved.message}), so the memory it needs is "
                "not checked"
            )
        shape = model.shape if model.shape is not None else resolved
        if shape is None:
            return None, "where it came from is not known, so the memory it needs is not checked"
        if shape.weights_bytes <= 0 and model.files_bytes > 0:
            shape = replace(shape, weights_bytes=model.files_bytes)
        return shape, ""

    @refusals_as_status
    async def SizeContext(
        self, request: planner_pb2.SizeContextRequest, context: Context
    ) -> planner_pb2.SizeContextResponse:
        """A new context for a model: each profile's engine arguments and memory."""
        # Everything that needs no shape is checked first: a refusal costs no fetch.
        model = self._model_of(request.model)
        inventory = self._inventory_of(request.inventory)
        check_size_request(model, tokens=request.tokens, slots=request.slots)
        resolved = await self._resolve(request.model, context)
        key = _memo_key(request, resolved)
        hit = self._answers.get(key, planner_pb2.SizeContextResponse)
        if hit is not None:
            return hit
        shape, note = self._shape_of(model, resolved)
        values = (model, shape, inventory)
        like = self._like(request, values, (request.slots, request.sequences, note))
        # A context never asked before of a model asked before: its plan's arithmetic, on
        # the loop (fresh.py), else the full sizing.
        planned = self._fresh.answer(
            like,
            model,
            shape,
            inventory,
            tokens=request.tokens,
            slots=request.slots,
            sequences=request.sequences,
            note=note,
        )
        if planned is not None:
            answer, change = planned
        else:
            change = await self._planned(
                functools.partial(
                    size_context,
                    model,
                    shape,
                    tokens=request.tokens,
                    slots=request.slots,
                    inventory=inventory,
                    note=note,
                    sequences=request.sequences,
                ),
                like,
                values,
            )
            answer = convert.size_answer(change, note if shape is None else "", LLAMACPP_VERSION)
        log.info("context_sized", model=model.name, before=change.before, after=change.after)
        self._answers.put(key, answer, resolved)
        return answer

    @refusals_as_status
    async def PlanGPUs(
        self, request: planner_pb2.PlanGPUsRequest, context: Context
    ) -> planner_pb2.PlanGPUsResponse:
        """N cards of one node per replica for one profile or every GPU profile."""
        model = self._model_of(request.model)
        inventory = self._inventory_of(request.inventory)
        check_gpus_request(model, gpus=request.gpus, profile=request.profile)
        resolved = await self._resolve(request.model, context)
        key = _memo_key(request, resolved)
        hit = self._answers.get(key, planner_pb2.PlanGPUsResponse)
        if hit is not None:
            return hit
        shape, note = self._shape_of(model, resolved)
        values = (model, shape, inventory)
        change = await self._planned(
            functools.partial(
                plan_gpus,
                model,
                shape,
                gpus=request.gpus,
                profile=request.profile,
                inventory=inventory,
                note=note,
                sequences=request.sequences,
            ),
            self._like(request, values, (request.gpus, request.profile, request.sequences, note)),
            values,
        )
        log.info("gpus_planned", model=model.name, gpus=change.gpus)
        answer = planner_pb2.PlanGPUsResponse(
            profiles=[common.profile_to_proto(p) for p in change.updated],
            llamacpp_version=LLAMACPP_VERSION,
            batches=[convert.batch_to_proto(b) for b in change.batches],
        )
        convert.gpus_change_to_proto(change, note if shape is None else "", answer.change)
        self._answers.put(key, answer, resolved)
        return answer

    @refusals_as_status
    async def DescribeModel(
        self, request: planner_pb2.DescribeModelRequest, context: Context
    ) -> planner_pb2.DescribeModelResponse:
        """The resolved shape of a model's source."""
        if not request.source:
            raise errors.InvalidRequest(
                "the request names no source: give a GGUF URL or path, or hf://ORG/NAME",
                field="source",
            )
        files = tuple((f.path, f.bytes) for f in request.origin.files)
        shape = await self._resolver.resolve(
            request.source, files, caller=lambda: caller_of(context)
        )
        files_bytes = sum(size for _, size in files)
        if shape.weights_bytes <= 0 and files_bytes > 0:
            shape = replace(shape, weights_bytes=files_bytes)
        return planner_pb2.DescribeModelResponse(
            shape=common.shape_to_proto(shape), llamacpp_version=LLAMACPP_VERSION
        )


ANSWERS_KEPT = 1024
"""Answers remembered for requests asked again (a gateway asks the same plan many times), at
most; their bytes are bounded too (`Limits.answer_cache_bytes`)."""

ENTRY_OVERHEAD_BYTES = 256
"""What one remembered answer costs beside its bytes (the key tuple, the dict slot), counted
so that many small answers are bounded as well as a few large ones."""

MemoKey: TypeAlias = tuple[str, bytes, int]
M = TypeVar("M", bound=Message)
T = TypeVar("T")


def _memo_key(request: Message, resolved: object) -> MemoKey | None:
    """What an answer depends on: the request (by its digest, so a 4 MiB request does not
    keep 4 MiB of key), and which cached shape its source resolved to (None when the source
    could not be read: such answers are not remembered)."""
    if isinstance(resolved, errors.SourceUnreachable):
        return None
    digest = hashlib.sha256(request.SerializeToString(deterministic=True)).digest()
    return (type(request).__name__, digest, id(resolved))


class _Answers:
    """A memory of answers bounded in entries and in bytes: the planner is a pure function of
    the request and the shape, so a request asked again against the same cached shape gets the
    same answer. Answers are kept serialized, so the bytes counted are the bytes held. An
    entry holds its shape, so the shape's identity in the key cannot be reused while it lives;
    when the shape cache refetches a source, the new shape makes new keys."""

    def __init__(self, limit: int = ANSWERS_KEPT, limit_bytes: int = 64 << 20) -> None:
        self._limit = limit
        self._limit_bytes = limit_bytes
        self._kept: OrderedDict[MemoKey, tuple[bytes, object]] = OrderedDict()
        self.held_bytes = 0
        """The bytes the kept answers count for (answers + keys + ENTRY_OVERHEAD_BYTES each)."""

    def get(self, key: MemoKey | None, kind: type[M]) -> M | None:
        """The answer remembered for `key`, if any, as a `kind` message."""
        if key is None:
            return None
        hit = self._kept.get(key)
        if hit is None:
            return None
        self._kept.move_to_end(key)
        return kind.FromString(hit[0])

    def put(self, key: MemoKey | None, answer: Message, shape: object) -> None:
        """Remember an answer; the least recently used are forgotten beyond the limits, and
        an answer larger than the whole byte limit is not kept."""
        if key is None:
            return
        data = answer.SerializeToString()
        cost = _cost(key, data)
        if cost > self._limit_bytes:
            return
        old = self._kept.pop(key, None)
        if old is not None:
            self.held_bytes -= _cost(key, old[0])
        self._kept[key] = (data, shape)
        self.held_bytes += cost
        while len(self._kept) > self._limit or self.held_bytes > self._limit_bytes:
            old_key, (old_data, _) = self._kept.popitem(last=False)
            self.held_bytes -= _cost(old_key, old_data)

    def __len__(self) -> int:
        return len(self._kept)


def _cost(key: MemoKey, data: bytes) -> int:
    """The bytes one remembered answer counts for."""
    return len(data) + len(key[1]) + len(key[0]) + ENTRY_OVERHEAD_BYTES


SERVICE_NAME = planner_pb2.DESCRIPTOR.services_by_name["PlannerService"].full_name
"""The planner's full service name, for health and reflection."""


def add_planner_service(
    server: grpc.aio.Server, resolver: Resolver, limits: Limits = DEFAULT_LIMITS
) -> PlannerServicer:
    """Serve the planner's RPCs on `server`, resolving shapes with `resolver`, holding
    requests to `limits`; the servicer, for its answer cache's figures."""
    servicer = PlannerServicer(resolver, limits)
    planner_pb2_grpc.add_PlannerServiceServicer_to_server(servicer, server)
    return servicer
