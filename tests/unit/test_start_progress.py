"""A starting replica's progress: the agent's one-a-second gate and its reading of the Hub
cache, the fleet's intake of a hostile report, the store row's form, and the CLI's cell."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_svc.agent.progress import Gate, hub_cache, hub_download, repo_of
from fleet_svc.agent.replica import Progress, Stage
from fleet_svc.domain.replicas import StartProgress
from fleet_svc.rpc.agent_stream import MAX_PROGRESS_FILE_CHARS, observed_of
from fleet_svc.store.rows import progress_doc, progress_of_doc
from llmgw.agent.v1 import agent_pb2
from llmgw.cli.progress import duration, progress_text, size
from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.testing.clock import FakeClock


def test_the_gate_lets_through_the_first_then_one_a_second_and_every_final() -> None:
    """Chunks arriving every 0.1 s for 3 s give the first report, one a second after it and
    the final one; the rate is measured between the reports let through."""
    clock = FakeClock()
    gate = Gate(clock.monotonic)
    passed = []
    for i in range(1, 31):
        clock.advance(0.1)
        done = i * 100_000
        if gate.due(done, final=i == 30):
            passed.append((i, gate.rate_bytes_per_s))
    assert [i for i, _ in passed] == [1, 11, 21, 30]
    assert passed[0][1] == 0
    assert passed[1][1] == pytest.approx(1_000_000, rel=0.01)


def test_the_hub_cache_shows_an_engines_download_until_every_blob_is_whole(
    tmp_path: Path,
) -> None:
    """A repo with an `.incomplete` blob is DOWNLOADING with the bytes on disk and the whole
    files counted; with none incomplete (or no folder) nothing is downloading."""
    cache = hub_cache({"HF_HOME": str(tmp_path)})
    assert cache == tmp_path / "hub"
    assert hub_download(cache, "org/model") is None
    blobs = cache / "models--org--model" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / "aaa").write_bytes(bytes(1000))
    (blobs / "bbb.incomplete").write_bytes(bytes(500))
    seen = hub_download(cache, "org/model")
    assert seen == Progress(Stage.DOWNLOADING, done_bytes=1500, files_done=1, file="org/model")
    (blobs / "bbb.incomplete").rename(blobs / "bbb")
    assert hub_download(cache, "org/model") is None


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"HF_HUB_CACHE": "/c", "HF_HOME": "/h"}, Path("/c")),
        ({"HF_HOME": "/h"}, Path("/h/hub")),
        ({"HOME": "/home/x"}, Path("/home/x/.cache/huggingface/hub")),
    ],
)
def test_the_hub_cache_is_found_as_huggingface_hub_finds_it(
    env: dict[str, str], want: Path
) -> None:
    """$HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    assert hub_cache(env) == want


@pytest.mark.parametrize(
    ("source", "repo"),
    [
        ("hf://org/name", "org/name"),
        ("hf://org/name@main", "org/name"),
        ("hf://name", ""),
        ("https://host/x.gguf", ""),
        ("/models/x.gguf", ""),
    ],
)
def test_only_an_hf_source_names_a_repo_to_watch(source: str, repo: str) -> None:
    """ORG/NAME of an hf:// source; nothing for a URL, a path or a repo without an org."""
    assert repo_of(source) == repo


def _observed(
    phase: agent_pb2.ProcessPhase.ValueType, progress: common_pb2.StartProgress
) -> agent_pb2.ObservedReplica:
    return agent_pb2.ObservedReplica(replica_id="r-1", revision=1, phase=phase, progress=progress)


def test_a_hostile_progress_report_is_bounded_and_cleaned() -> None:
    """Negative numbers read as 0, a control character in the file name is replaced and a
    long name cut; an unknown stage, or progress on a replica not starting, is dropped."""
    hostile = common_pb2.StartProgress(
        stage=common_pb2.START_STAGE_DOWNLOADING,
        done_bytes=-5,
        total_bytes=100,
        rate_bytes_per_s=-1,
        files_done=-2,
        files_total=1,
        file="\x1b[31m" + "x" * 1000,
    )
    o = observed_of(_observed(agent_pb2.PROCESS_PHASE_STARTING, hostile))
    assert o is not None and o.progress is not None
    p = o.progress
    assert (p.stage, p.done_bytes, p.total_bytes, p.rate_bytes_per_s, p.files_done) == (
        "DOWNLOADING",
        0,
        100,
        0,
        0,
    )
    assert "\x1b" not in p.file and len(p.file) == MAX_PROGRESS_FILE_CHARS
    unknown = common_pb2.StartProgress(stage=99, done_bytes=1)  # type: ignore[arg-type]
    o = observed_of(_observed(agent_pb2.PROCESS_PHASE_STARTING, unknown))
    assert o is not None and o.progress is None
    o = observed_of(_observed(agent_pb2.PROCESS_PHASE_HEALTHY, hostile))
    assert o is not None and o.progress is None


def test_the_row_form_reads_back_and_a_damaged_one_reads_as_unknown_numbers() -> None:
    """A progress written to a row reads back equal; {} is none; a number that is not one
    reads as 0 rather than failing the row."""
    p = StartProgress("DOWNLOADING", 1, 2, 3, 4, 5, "x.gguf")
    assert progress_of_doc(progress_doc(p)) == p
    assert progress_doc(None) == {} and progress_of_doc({}) is None
    damaged = {"stage": "LOADING", "done_bytes": "many", "total_bytes": True, "file": 7}
    assert progress_of_doc(damaged) == StartProgress("LOADING", file="7")


def _replica(**progress: object) -> fleet_pb2.Replica:
    r = fleet_pb2.Replica(id="r-1")
    if progress:
        r.progress.CopyFrom(common_pb2.StartProgress(**progress))  # type: ignore[arg-type]
    return r


@pytest.mark.parametrize(
    ("progress", "text"),
    [
        ({}, "-"),
        ({"stage": common_pb2.START_STAGE_LOADING, "file": "x.gguf"}, "loading"),
        (
            {
                "stage": common_pb2.START_STAGE_DOWNLOADING,
                "done_bytes": 120_000_000,
                "total_bytes": 268_000_000,
                "rate_bytes_per_s": 12_000_000,
            },
            "downloading 44% 120 MB/268 MB 12 MB/s eta 12s",
        ),
        (
            {
                "stage": common_pb2.START_STAGE_DOWNLOADING,
                "done_bytes": 4_200_000_000,
                "files_done": 1,
                "files_total": 4,
            },
            "downloading 4.2 GB file 2/4",
        ),
    ],
)
def test_the_progress_cell_says_stage_share_bytes_rate_and_eta(
    progress: dict[str, object], text: str
) -> None:
    """What `replica list` shows in PROGRESS for each kind of report."""
    assert progress_text(_replica(**progress)) == text


def test_sizes_and_durations_read_as_download_tools_show_them() -> None:
    """Decimal units, and minutes and hours past a minute."""
    assert [size(n) for n in (640_000, 120_000_000, 4_200_000_000)] == [
        "640 kB",
        "120 MB",
        "4.2 GB",
    ]
    assert [duration(s) for s in (42, 190, 7500)] == ["42s", "3m10s", "2h05m"]
