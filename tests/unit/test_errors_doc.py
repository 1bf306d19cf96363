"""docs/errors.md lists every reason the servers answer with, its code and metadata keys, and
nothing they do not: the tables are walked, so the page cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest
from google.rpc import status_pb2

import fleet_svc.server  # noqa: F401  (loads every fleet refusal class)
import planner_svc.server  # noqa: F401  (loads every planner refusal class)
from fleet_svc.domain import errors
from fleet_svc.rpc import status as fleet_status
from llmgw.rpc import intake
from llmgw.rpc.status import error_info, subclasses
from planner_svc.rpc import status as planner_status

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"

# Google's HTTP mapping of each code (google/rpc/code.proto), and the rows that answer
# otherwise on purpose (their reason: the status the gateway answers instead).
HTTP = {
    "INVALID_ARGUMENT": "400",
    "FAILED_PRECONDITION": "400",
    "OUT_OF_RANGE": "400",
    "UNAUTHENTICATED": "401",
    "PERMISSION_DENIED": "403",
    "NOT_FOUND": "404",
    "ALREADY_EXISTS": "409",
    "ABORTED": "409",
    "RESOURCE_EXHAUSTED": "429",
    "INTERNAL": "500",
    "DATA_LOSS": "500",
    "UNAVAILABLE": "503",
}
HTTP_OVERRIDES = {"MESSAGE_TOO_LARGE": "413", "WATCHER_TOO_SLOW": "—"}


def code_name(status: status_pb2.Status) -> str:
    """The name of a status's numeric code."""
    return next(c.name for c in grpc.StatusCode if c.value[0] == status.code)


def documented() -> dict[str, dict[str, tuple[str, str, set[str]]]]:
    """Per section of the page (the intake's, the planner's, the fleet's): reason -> (code,
    HTTP, metadata keys) as its table lists them."""
    sections: dict[str, dict[str, tuple[str, str, set[str]]]] = {}
    current = ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            current = (
                "intake"
                if "bytes" in line
                else "planner"
                if "planner.llmgw.dev" in line
                else "fleet"
                if "fleet.llmgw.dev" in line
                else ""
            )
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current and len(cells) == 5 and re.fullmatch(r"[A-Z][A-Z_]+", cells[0]):
            reason, code, http, metadata, _when = cells
            keys = set(re.findall(r"`([a-z_]+)`", metadata))
            sections.setdefault(current, {})[reason] = (code, http.split()[0], keys)
    return sections


def answered(statuses: list[status_pb2.Status]) -> dict[str, tuple[str, set[str]]]:
    """reason -> (code, metadata keys) of the statuses a table answers with."""
    out: dict[str, tuple[str, set[str]]] = {}
    for status in statuses:
        info = error_info(status)
        assert info is not None, f"a status without ErrorInfo: {status.message}"
        code, keys = out.setdefault(info.reason, (code_name(status), set()))
        assert code == code_name(status), f"{info.reason} answered with two codes"
        keys.update(info.metadata)
    return out


SERVICES = [
    pytest.param("planner", planner_status.example_statuses, planner_status.DOMAIN, id="planner"),
    pytest.param("fleet", fleet_status.example_statuses, fleet_status.DOMAIN, id="fleet"),
]


@pytest.mark.parametrize(("section", "examples", "domain"), SERVICES)
def test_every_reason_is_documented_with_its_code_and_metadata(
    section: str, examples: object, domain: str
) -> None:
    """Each reason a service's table answers (and the intake's) is a row of its section with
    the same code, every metadata key it carries listed, and an HTTP status that is Google's
    mapping of the code unless the reason is a documented exception."""
    assert callable(examples)
    docs = documented()
    rows = {**docs["intake"], **docs[section]}
    statuses = [*examples(), *intake.example_statuses(domain)]
    for status in statuses:
        info = error_info(status)
        assert info is not None
        assert info.domain == domain, f"{info.reason} carries domain {info.domain}"
    for reason, (code, keys) in answered(statuses).items():
        assert reason in rows, f"{reason} ({section}) is not in docs/errors.md"
        doc_code, http, doc_keys = rows[reason]
        assert doc_code == code, f"{reason}: docs say {doc_code}, the table answers {code}"
        assert keys <= doc_keys, f"{reason}: metadata {sorted(keys - doc_keys)} undocumented"
        assert http == HTTP_OVERRIDES.get(reason, HTTP[code]), f"{reason}: HTTP {http}"


@pytest.mark.parametrize(("section", "examples", "domain"), SERVICES)
def test_the_page_lists_no_reason_the_tables_do_not_answer(
    section: str, examples: object, domain: str
) -> None:
    """A row of a service's section is a reason its table answers: the page holds no stale
    reason."""
    assert callable(examples)
    answers = answered([*examples()])
    stale = set(documented()[section]) - set(answers)
    assert not stale, (
        f"docs/errors.md lists {sorted(stale)} for the {section}, which no table answers"
    )


def test_every_concrete_refusal_has_its_own_reason() -> None:
    """Only the roots fall to the catch-all REFUSED: each refusal class a service raises has
    a precise reason in its table."""
    planner_refused = {
        cls.__name__
        for root in planner_status._ROOTS
        for cls in subclasses(root)
        if planner_status.code_and_reason(cls("example"))[1] == "REFUSED"
    }
    fleet_refused = {
        cls.__name__
        for cls in subclasses(errors.FleetError)
        if fleet_status.code_and_reason(cls("example"))[1] == "REFUSED"
    }
    assert planner_refused == {"PlannerError", "EngineError"}
    assert fleet_refused == {"FleetError"}
