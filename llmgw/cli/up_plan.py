"""What `llmgw up` runs, from its flags, and what it prints once everything serves."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmgw.cli.common import DEFAULT_DATA, DEFAULT_FLEET, DEFAULT_PLANNER, ENV_DATA, LOCAL_USER
from llmgw.cli.up_pki import SETTINGS, shown_path
from llmgw.clients.convert import Replica
from llmgw.demo.hf_repo import REPO as DEMO_REPO

_GPUS = re.compile(r"^\s*(\d+)x([A-Za-z0-9._-]+)")


def dialable(address: str) -> str:
    """Where to dial a child that listens on `address`: a wildcard host (`--host 0.0.0.0`)
    is dialled on 127.0.0.1, a name every server certificate of DATA/tls carries."""
    host, _, port = address.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "") else address


class UpError(Exception):
    """`llmgw up` cannot go on; the message says what failed and what to do."""


def gpu_class_of(gpus: str) -> str:
    """The card class of an agent's `--gpus` (the first group's): 4xH100-80GB -> H100-80GB.

    Raises:
        UpError: the text is not COUNTxCLASS.
    """
    match = _GPUS.match(gpus)
    if match is None:
        raise UpError(f"--gpus {gpus!r}: write COUNTxCLASS, e.g. 4xH100-80GB")
    return match.group(2)


def command_name(argv0: str | None = None) -> str:
    """How to call `llmgw` again, as it was called: `llmgw` when that is on PATH, else the
    path it was run by (e.g. `.venv/bin/llmgw`), else through Python."""
    called = argv0 if argv0 is not None else sys.argv[0]
    on_path = shutil.which("llmgw")
    if Path(called).name == "llmgw":
        if on_path and Path(on_path).resolve() == Path(called).resolve():
            return "llmgw"
        relative = os.path.relpath(called)
        if relative.startswith(".."):
            return os.path.abspath(called)
        return relative if "/" in relative else f"./{relative}"
    return "llmgw" if on_path else f"{sys.executable} -m llmgw.cli.main"


@dataclass
class Plan:
    """What `llmgw up` runs, from its flags."""

    data: Path
    host: str
    planner_port: int
    fleet_port: int
    files_port: int
    gpus: str
    node: str
    agent: bool
    ready_timeout_s: float
    python: str = sys.executable
    metrics_port: int = 0
    """Prometheus metrics on `host`: the planner at this port, the fleet at the next, the
    agent at the one after (0: no metrics)."""
    build_llama_server: bool = False
    """Build llama-server in the background when none is found (`make run`)."""

    def metrics(self, offset: int) -> list[str]:
        """The `--metrics` flag of the child `offset` ports past `metrics_port`, if any."""
        return (
            ["--metrics", f"{self.host}:{self.metrics_port + offset}"] if self.metrics_port else []
        )

    @property
    def logs(self) -> Path:
        """Where the children's logs are."""
        return self.data / "logs"

    @property
    def models(self) -> Path:
        """The folder the file server serves."""
        return self.data / "models"

    @property
    def tls(self) -> Path:
        """The local CA and every pair it issued."""
        return self.data / "tls"

    @property
    def settings(self) -> Path:
        """The fleet's cluster settings (the roles)."""
        return self.data / SETTINGS


def build_plan(opts: argparse.Namespace) -> Plan:
    """The plan from the flags.

    Raises:
        UpError: a flag is out of range.
    """
    for flag in ("planner_port", "fleet_port", "files_port"):
        value = getattr(opts, flag)
        if not 0 <= value <= 65535:
            raise UpError(f"--{flag.replace('_', '-')} {value}: a port is 0..65535 (0: any free)")
    if not (opts.metrics_port == 0 or 1 <= opts.metrics_port <= 65533):
        raise UpError(f"--metrics-port {opts.metrics_port}: a port is 1..65533 (it takes three)")
    gpu_class_of(opts.gpus)
    return Plan(
        data=Path(opts.data).resolve(),
        host=opts.host,
        planner_port=opts.planner_port,
        fleet_port=opts.fleet_port,
        files_port=opts.files_port,
        gpus=opts.gpus,
        node=opts.node,
        agent=not opts.no_agent,
        ready_timeout_s=opts.ready_timeout,
        metrics_port=opts.metrics_port,
        build_llama_server=opts.build_llama_server,
    )


@dataclass
class Started:
    """Where the started services listen."""

    files_url: str
    planner: str
    fleet: str
    gguf_path: Path
    llama_server: str | None


def banner_lines(
    plan: Plan, started: Started, ready: Sequence[Replica], *, complete: bool, building: str
) -> list[str]:
    """What `llmgw up` prints once it serves: where everything listens and how to use it
    (`complete`: every example replica served; `building`: the llama-server build's phase,
    "" when none runs)."""
    p = plan
    prog = command_name()
    fleet, planner = started.fleet, started.planner
    fleet_flag = "" if fleet == DEFAULT_FLEET else f" --fleet {fleet}"
    planner_flag = "" if planner == DEFAULT_PLANNER else f" --planner {planner}"
    lines = [
        "llmgw up: ready" if complete else "llmgw up: running (see above)",
        f"  planner  {planner}",
        f"  fleet    {fleet}   (store {p.data / 'fleet.db'})",
        f"  files    {started.files_url}   (the demo's hf:// repo: the planner's mirror of "
        f"{DEMO_REPO.split('/', 1)[0]}, the agent's HF_ENDPOINT)",
    ]
    if p.agent:
        engine = (
            f"llama.cpp on {started.llama_server}" if started.llama_server else "stand-in engines"
        )
        if building:
            engine += f" (llama-server building: {building}; llama.cpp moves onto it when built)"
        lines.append(f"  agent    node {p.node}, {p.gpus} stand-in cards, {engine}")
    else:
        lines.append("  agent    none (--no-agent): replicas stay PENDING until one connects")
    if p.metrics_port:
        scrape = [f"http://{p.host}:{p.metrics_port + i}/metrics" for i in range(3)]
        lines.append(f"  metrics  planner {scrape[0]}, fleet {scrape[1]}, agent {scrape[2]}")
    lines.append(f"  logs     {p.logs}")
    tls = shown_path(p.tls)
    lines.append(
        f"  tls      {tls}   (mutual TLS, local CA ca.crt; callers admin.crt/.key and "
        "viewer.crt/.key)"
    )
    lines.append(f"  roles    {shown_path(p.settings)}   (the fleet's cluster settings)")
    for r in ready:
        lines.append(f"  replica  {r.model}/{r.profile} ({r.engine}) at http://{r.address}")
    lines += ["", "Try:"]
    if p.data != Path(DEFAULT_DATA).resolve():
        # `llmgw ctl` and `plan` look for the admin pair under ./data/tls, else here.
        lines.append(f"  export {ENV_DATA}={shown_path(p.data)}")
    lines += [
        f"  {prog} ctl{fleet_flag} model list",
        f"  {prog} ctl{fleet_flag} replica list",
        f"  {prog} ctl{fleet_flag} model show tiny-llama-hf",
        f"  {prog} ctl{fleet_flag} node list",
        f"  {prog} ctl{fleet_flag} replica watch",
        f"  {prog} ctl{fleet_flag} model gpus tiny-llama-hf 2",
        f"  {prog} ctl{fleet_flag} model context tiny-llama-gguf 16384",
        f"  {prog} plan{planner_flag} describe hf://llmgw-demo/tiny-llama",
        f"  grpcurl -cacert {tls}/ca.crt -cert {tls}/{LOCAL_USER}.crt -key "
        f"{tls}/{LOCAL_USER}.key {fleet} list",
        f"  {prog} certs client alice --ca-dir {tls}   (another caller; node NAME: another node)",
    ]
    for r in ready:
        if r.model == "tiny-llama-gguf":
            lines.append(
                f"  curl -s http://{r.address}/v1/completions -H 'Content-Type: "
                f'application/json\' -d \'{{"model": "{r.model}", "prompt": '
                f'"hello", "max_tokens": 8}}\''
            )
    lines.append("Ctrl-C stops everything.")
    return lines
