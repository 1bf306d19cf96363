"""A change on PostgreSQL sends its transaction with its checks put off to the commit, and
runs it again checking as it goes when one did not hold: the answers and refusals are the ones
the careful path gives (real fleet and planner over gRPC, a fresh database each)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from bench.store_pg import ctx_model
from llmgw.fleet.v1 import fleet_pb2, fleet_pb2_grpc
from tests.integration.test_rollouts import reason_and_meta
from tests.support.fleet import running_fleet
from tests.support.planner import running_planner
from tests.support.postgres import fresh_database


@asynccontextmanager
async def pg_fleet(tmp_path: Path) -> AsyncIterator[fleet_pb2_grpc.FleetServiceAsyncStub]:
    """A planner and a fleet on a fresh PostgreSQL database holding `ctx` (no replicas)."""
    with fresh_database() as (_name, dsn):
        async with (
            running_planner() as (planner, _p, _c),
            running_fleet(tmp_path, planner=f"127.0.0.1:{planner.port}", store_url=dsn) as (
                _fleet,
                stub,
            ),
        ):
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=ctx_model()))
            yield stub


async def revisions(stub: fleet_pb2_grpc.FleetServiceAsyncStub) -> list[int]:
    """`ctx`'s revisions, oldest first."""
    found = await stub.ListModelRevisions(fleet_pb2.ListModelRevisionsRequest(name="ctx"))
    return [r.revision for r in found.revisions]


async def test_a_retried_change_is_given_its_first_answer_after_the_model_moved_on(
    tmp_path: Path,
) -> None:
    """A SetContext retried with its request id after the model changed again is given its
    first answer (the revision it wrote), and writes nothing: its put-off claim fails at the
    commit, and the careful try replays the answer."""
    async with pg_fleet(tmp_path) as stub:
        first = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="ctx", tokens=16384, request_id="s1")
        )
        assert first.model.revision == 2
        await stub.SetContext(fleet_pb2.SetContextRequest(name="ctx", tokens=4096))
        again = await stub.SetContext(
            fleet_pb2.SetContextRequest(name="ctx", tokens=16384, request_id="s1")
        )
        assert again == first
        assert await revisions(stub) == [1, 2, 3]


async def test_changes_racing_on_one_model_write_one_revision_each_answer(
    tmp_path: Path,
) -> None:
    """Changes of one model sent at once, none naming an etag: each that is answered wrote
    the revision it names, and each other is refused STALE_REVISION (the careful try finds
    the model moved), never an internal error and never a revision nobody was told of."""
    async with pg_fleet(tmp_path) as stub:
        results = await asyncio.gather(
            *(
                stub.SetContext(fleet_pb2.SetContextRequest(name="ctx", tokens=4096 * (2 + i % 2)))
                for i in range(8)
            ),
            return_exceptions=True,
        )
        answered = [r for r in results if isinstance(r, fleet_pb2.SetContextResponse)]
        refused = [r for r in results if not isinstance(r, fleet_pb2.SetContextResponse)]
        for err in refused:
            assert isinstance(err, grpc.aio.AioRpcError), err
            assert reason_and_meta(err)[0] == "STALE_REVISION", err
        written = [r.model.revision for r in answered if not r.unchanged]
        assert sorted(written) == (await revisions(stub))[1:]
        assert len(set(written)) == len(written)


async def test_a_stale_etag_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """A SetContext naming an etag read before the model changed is refused STALE_REVISION
    and writes nothing, as before the checks were put off."""
    async with pg_fleet(tmp_path) as stub:
        old = (await stub.GetModel(fleet_pb2.GetModelRequest(name="ctx"))).model.etag
        await stub.SetContext(fleet_pb2.SetContextRequest(name="ctx", tokens=16384))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.SetContext(
                fleet_pb2.SetContextRequest(name="ctx", tokens=4096, etag=old, request_id="e1")
            )
        assert reason_and_meta(caught.value)[0] == "STALE_REVISION"
        assert await revisions(stub) == [1, 2]
