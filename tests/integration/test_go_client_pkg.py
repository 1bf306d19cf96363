"""gen/go/client, the Go package a gateway imports, against live services: its `go test -run
TestLive` runs here against a planner, two fleets on one PostgreSQL (the follower given first,
the leader with a scripted agent) and a fleet whose planner is down, all over mutual TLS. It
finds the leader through NOT_LEADER, decodes ErrorInfo and RetryInfo, keeps a routing table
from WatchReplicas through a resume and a snapshot, and retries a write only when it carries
a request id."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.go_swarm import module_env
from fleet_svc.server import FleetServer, start_fleet
from planner_svc.server import PlannerServer, start_planner
from tests.integration.test_go_client import (
    Pki,
    as_json,
    fleet_options,
    go,  # noqa: F401  (the fixture)
    llama,
    run,
    two_fleets,
)

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "gen" / "go"


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_go_client_package_against_live_services(go: str, tmp_path: Path) -> None:  # noqa: F811
    """Every subtest of TestLive runs and passes: none is skipped, none missing."""
    pki = Pki(tmp_path / "tls")
    settings = tmp_path / "settings.yaml"
    env = module_env()
    code, out, err = await run(
        [go, "test", "-c", "-o", str(tmp_path / "client.test"), "./client/"], MODULE, env, 240
    )
    assert code == 0, out + err
    async with two_fleets(tmp_path, pki) as (leader, follower):
        # A third fleet, on its own SQLite store, whose planner does not answer.
        planner: PlannerServer = await start_planner("127.0.0.1:0", tls=pki.server("planner"))
        (tmp_path / "orphaned").mkdir()
        orphaned: FleetServer = await start_fleet(
            fleet_options(tmp_path / "orphaned", pki, "127.0.0.1:1", settings)
        )
        try:
            cert, key = pki.local.clients["admin"]
            config = {
                "ca": str(pki.local.ca_cert),
                "cert": str(cert),
                "key": str(key),
                "planner": f"127.0.0.1:{planner.port}",
                "fleets": f"127.0.0.1:1,{follower},{leader}",
                "leader": leader,
                "orphaned": f"127.0.0.1:{orphaned.port}",
                "model": as_json(llama("go-pkg")),
            }
            path = tmp_path / "live.json"
            path.write_text(json.dumps(config))
            code, out, err = await run(
                [str(tmp_path / "client.test"), "-test.run", "^TestLive$", "-test.v"],
                MODULE / "client",
                env | {"LLMGW_GO_LIVE": str(path)},
                240,
            )
        finally:
            await orphaned.stop(0.5)
            await planner.stop(0.5)
    assert code == 0, out + err
    assert "--- SKIP" not in out, out
    passed = set(re.findall(r"--- PASS: TestLive/(\S+)", out))
    assert len(passed) == 5 and "--- PASS: TestLive " in out, out
