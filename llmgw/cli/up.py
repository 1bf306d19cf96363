"""`llmgw up`: the whole control plane on one machine, with an example catalog.

It starts, as child processes, the demo's file server (a tiny GGUF model and a Hugging
Face-shaped repo, `HF_ENDPOINT` pointed at it), the planner, the fleet (SQLite in the data
folder) and one node agent with stand-in cards whose engines the stand-in plays (llama.cpp
runs for real where a llama-server is built). It loads the example catalog through the
fleet's API (so it can be edited like any model), waits until the example replicas are
READY, prints where everything listens, and runs until Ctrl-C or SIGTERM, which stop the
children in order: agent (it stops its engines), fleet, planner, file server. Each child
logs JSON lines to DATA/logs/NAME.log.

The planner, the fleet and the agent's stream speak mutual TLS, with a local CA and pairs it
makes under DATA/tls/ (llmgw.certs.make_local_tls; kept across runs, so certificates given
out stay good): `planner.crt/.key` and `fleet.crt/.key` for the servers, `node-NODE.crt/.key`
for the agent, `admin` and `viewer` for people, `fleet-client` (identity `fleet`) for the
fleet's channel to the planner and `llmgw-up` for the example catalog's writer. The roles
of those identities are in DATA/settings.yaml, the fleet's cluster settings (written once,
then the operator's to edit). The demo's file server stays plain HTTP on loopback.

With --build-llama-server (what `make run` passes) and no llama-server found, it builds one in
the background (llmgw.cli.up_build) while everything above runs on the stand-in, tells the
build's phase as it goes, and once it lands restarts the agent with it (leaving its engines
running, to be adopted) and rolls the llama.cpp example onto it: the example's source becomes
the GGUF's local path, an ordinary catalog change rolled out beside.

One run's steps are here, in the order they happen; what it runs and prints is in
llmgw.cli.up_plan, what TLS needs made in llmgw.cli.up_pki, the build in llmgw.cli.up_build,
the children's keeping in llmgw.cli.supervisor.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from llmgw.certs import names_service, service_name
from llmgw.cli import GRPC_VERBOSITY, GRPC_VERBOSITY_SET_HERE
from llmgw.cli.common import (
    DEFAULT_DATA,
    ENV_DATA,
    EXIT_ERROR,
    EXIT_USAGE,
    add_env_argument,
    example,
)
from llmgw.cli.supervisor import Child, StartFailed, Supervisor, port_taken, wait_listening
from llmgw.cli.up_build import EngineBuild
from llmgw.cli.up_pki import (
    LocalPki,
    make_pki,
    server_flags,
    tls_flags,
    write_settings,
)
from llmgw.cli.up_plan import (
    Plan,
    Started,
    UpError,
    banner_lines,
    build_plan,
    dialable,
    gpu_class_of,
)
from llmgw.clients import ClientError, FleetClient, Unreachable
from llmgw.clients.convert import Model, Replica
from llmgw.demo.catalog import (
    CALLER,
    GGUF_FILE,
    ensure_example_catalog,
    example_models,
    wait_ready,
)
from llmgw.demo.hf_repo import REPO as DEMO_REPO
from llmgw.demo.tiny_gguf import write_tiny_gguf
from llmgw.llama_server import LLAMA_SERVER_ENV, find_llama_server
from llmgw.sources import ENV_HF_MIRRORS
from llmgw.tls import ENV_CA, ENV_CERT, ENV_KEY, ClientTLS

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
STOP_ORDER = ("agent", "fleet", "planner", "files")
"""The agent first (it stops its engines), then what it and the others depend on."""
_CHILD_ENV_DROPPED = (ENV_CA, ENV_CERT, ENV_KEY, "LLMGW_TOKEN")
"""A person's client settings, not passed to the children (each is given its own files)."""


class Up:
    """One run of `llmgw up`: what it starts, in which order, and what it tells the person
    running it. Its children are kept by a Supervisor."""

    def __init__(self, plan: Plan, out: TextIO = sys.stdout) -> None:
        self.plan = plan
        self.out = out
        self.stop = threading.Event()
        self.children = Supervisor(plan.logs)
        self.complete = True
        """Whether every example replica served before the banner."""
        self.pki: LocalPki | None = None
        self.build: EngineBuild | None = None
        """The llama-server build running in the background, if any."""
        self.started: Started | None = None
        self.agent_env: dict[str, str] = {}

    def say(self, text: str) -> None:
        """A line for the person running it."""
        print(text, file=self.out, flush=True)

    def check_ports(self) -> None:
        """Refuse to start when a fixed port is taken, naming it."""
        p = self.plan
        for name, flag, port in (
            ("planner", "--planner-port", p.planner_port),
            ("fleet", "--fleet-port", p.fleet_port),
            ("file server", "--files-port", p.files_port),
        ):
            if port and port_taken(p.host, port):
                raise UpError(
                    f"port {port} ({name}) on {p.host} is taken: stop what listens there "
                    f"(another `llmgw up`?) or pass {flag} N (0 picks a free one)"
                )

    def run(self) -> int:
        """Start everything, wait for the examples, serve until signalled; the exit code."""
        p = self.plan
        p.logs.mkdir(parents=True, exist_ok=True)
        p.models.mkdir(parents=True, exist_ok=True)
        self.check_ports()
        started = self.started = self.start_services()
        ready = self.load_examples(started)
        if self.stop.is_set():
            return 0
        self.banner(started, ready or [])
        return self.serve()

    def start_services(self) -> Started:
        """Start the file server, the planner, the fleet and (unless --no-agent) the agent,
        each once the one before it listens (its address is needed next).

        Raises:
            StartFailed: one did not come up.
        """
        p = self.plan
        pki = self.pki = make_pki(p.tls, node=p.node, host=p.host)
        if write_settings(p.settings):
            self.say(f"settings: wrote {p.settings} (roles of the local identities)")
        env = {k: v for k, v in os.environ.items() if k not in _CHILD_ENV_DROPPED}
        if GRPC_VERBOSITY_SET_HERE:
            env.pop(GRPC_VERBOSITY, None)
        # The folder holding the project's packages, so the children import them whatever the
        # working directory (as the agent does for its engines).
        env["PYTHONPATH"] = os.pathsep.join(
            x for x in (_PROJECT_ROOT, env.get("PYTHONPATH", "")) if x
        )
        gguf_path = p.models / GGUF_FILE
        if not gguf_path.is_file():
            write_tiny_gguf(gguf_path)
        llama_server = find_llama_server(env)
        if llama_server is None and p.build_llama_server:
            self.build = EngineBuild(p.logs, env, p.python)
            self.build.start()
            self.say(
                "llama-server: none found; building it in the background (about 14 min on 2 "
                f"cores the first time; log {self.build.log_path}). The stand-in plays "
                "llama.cpp until it lands, then the example rolls out onto it."
            )
        py = [p.python, "-m"]
        json_logs = ["--log-format", "json"]

        files = self.children.start(
            "files",
            [
                *py,
                "llmgw.demo",
                "--listen",
                f"{p.host}:{p.files_port}",
                "--folder",
                str(p.models),
                *json_logs,
            ],
            env,
            5.0,
        )
        files_url = "http://" + wait_listening(files, 30, self.stop)
        # The children read the demo's hf:// repo from the file server, with their own cache
        # (no stored Hub token is sent to it, nothing mixes with the user's cache).
        env |= {
            "HF_ENDPOINT": files_url,
            "HF_HOME": str(p.data / "huggingface"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
        }
        # DATA/models is the one local folder model sources may be in (a real llama-server is
        # handed the GGUF's path there): the planner may read it, the agent may serve from it.
        roots = ["--allow-root", str(p.models)]
        # The planner reads the demo's organisation from the file server and every other
        # hf:// id from the Hub (HF_ENDPOINT as the user has it, else huggingface.co).
        planner_env = {k: v for k, v in env.items() if k != "HF_ENDPOINT"}
        if "HF_ENDPOINT" in os.environ:
            planner_env["HF_ENDPOINT"] = os.environ["HF_ENDPOINT"]
        planner_env[ENV_HF_MIRRORS] = f"{DEMO_REPO.split('/', 1)[0]}={files_url}"
        planner = self.children.start(
            "planner",
            [
                *py,
                "planner_svc",
                "--listen",
                f"{p.host}:{p.planner_port}",
                *server_flags(pki.ca, pki.planner),
                # The same roles and revoked list as the fleet's, re-read when edited.
                "--settings",
                str(p.settings),
                *roots,
                *p.metrics(0),
                *json_logs,
            ],
            planner_env,
            10.0,
        )
        # The fleet asks the planner to size context and card changes: it starts once the
        # planner's address is known (a port of 0 is only known once it listens).
        planner_address = dialable(wait_listening(planner, 60, self.stop))
        fleet = self.children.start(
            "fleet",
            [
                *py,
                "fleet_svc",
                "--listen",
                f"{p.host}:{p.fleet_port}",
                "--store",
                str(p.data / "fleet.db"),
                "--planner",
                planner_address,
                "--settings",
                str(p.settings),
                *server_flags(pki.ca, pki.fleet),
                *tls_flags("planner-", pki.ca, pki.fleet_client),
                # The fleet checks the planner's service name; a planner pair from before
                # service names is checked by the host the fleet dials.
                *(
                    []
                    if names_service(pki.planner[0], "planner")
                    else ["--planner-tls-server-name", planner_address.rsplit(":", 1)[0]]
                ),
                *p.metrics(1),
                *json_logs,
            ],
            env,
            10.0,
        )
        fleet_address = dialable(wait_listening(fleet, 60, self.stop))
        # Every child starts before this process opens a gRPC channel: gRPC's threads and a
        # fork do not mix (the children's pre-exec hook runs between them).
        if p.agent:
            agent_env = self.agent_env = dict(env)
            if llama_server:
                agent_env[LLAMA_SERVER_ENV] = llama_server
            self.children.start(
                "agent",
                [
                    *py,
                    "fleet_svc.agent",
                    "--fleet",
                    fleet_address,
                    "--node",
                    p.node,
                    "--gpus",
                    p.gpus,
                    "--state-dir",
                    str(p.data / "agent"),
                    *tls_flags("", pki.ca, pki.node),
                    # The agent checks it reached the fleet, not another service of the CA
                    # (a fleet pair from before service names: the host name only).
                    *(
                        ["--tls-server-name", service_name("fleet")]
                        if names_service(pki.fleet[0], "fleet")
                        else []
                    ),
                    # The example's local GGUF is there (the agent runs local sources only
                    # from folders it is told).
                    "--source-root",
                    str(p.models),
                    "--demo",
                    *p.metrics(2),
                    *json_logs,
                ],
                agent_env,
                # The agent stops its engines (each with its own grace) before it exits.
                45.0,
            )
        return Started(files_url, planner_address, fleet_address, gguf_path, llama_server)

    def load_examples(self, started: Started) -> list[Replica] | None:
        """Load the example catalog through the fleet's API and wait for its replicas; the
        serving ones, or None when not all served in time (or there is no agent).

        Raises:
            UpError: the fleet did not take the catalog.
        """
        p = self.plan
        models = self.examples(started)
        with self.writer(started) as fleet:
            try:
                if not fleet.wait_connected(30, self.stop):
                    return None
                for line in ensure_example_catalog(fleet, models):
                    self.say(f"catalog: {line}")
            except ClientError as exc:
                if self.stop.is_set():
                    return None
                why = f"{exc}: {exc.detail}" if isinstance(exc, Unreachable) else str(exc)
                raise UpError(
                    f"the fleet at {started.fleet} did not take the example catalog ({why}); "
                    f"see {p.logs / 'fleet.log'}"
                ) from exc
            if not p.agent:
                return None
            self.say(f"waiting for the example replicas (up to {p.ready_timeout_s:.0f} s):")
            got = wait_ready(fleet, models, p.ready_timeout_s, self.stop, self.out)
        if got is None and not self.stop.is_set():
            self.say(
                f"llmgw up: the example replicas are not all READY after "
                f"{p.ready_timeout_s:.0f} s; `llmgw ctl replica list` says why, the "
                f"engines' logs are in {p.data / 'agent' / 'logs'}. "
                "The control plane keeps running."
            )
        self.complete = got is not None
        return got

    def examples(self, started: Started) -> list[Model]:
        """The example catalog: the GGUF example by its local path for a real llama-server
        (its -m takes a path), else by the file server's URL for the stand-in."""
        gguf_source = (
            str(started.gguf_path)
            if started.llama_server
            else f"{started.files_url}/files/{GGUF_FILE}"
        )
        return example_models(gguf_source=gguf_source, gpu_class=gpu_class_of(self.plan.gpus))

    def writer(self, started: Started) -> FleetClient:
        """A client of the fleet as the example catalog's writer."""
        assert self.pki is not None, "start_services made the certificates"
        writer = ClientTLS(ca=self.pki.ca, cert=self.pki.writer[0], key=self.pki.writer[1])
        return FleetClient(started.fleet, caller=CALLER, timeout_s=10.0, tls=writer)

    def follow_build(self) -> None:
        """Tell the background build's phase when it moved on; once it ended, take the
        llama.cpp example over onto what it built (or say why not)."""
        build = self.build
        if build is None:
            return
        news = build.news()
        if news is not None:
            self.say(f"llmgw up: llama-server build: {news}")
        code = build.finished()
        if code is None:
            return
        self.build = None
        if code != 0:
            self.say(
                f"llmgw up: the llama-server build failed (code {code}); its log "
                f"({build.log_path}) ends:\n{build.child.tail()}\nThe stand-in keeps playing "
                "llama.cpp; `make llama-server` builds it again."
            )
            return
        built = find_llama_server(self.agent_env)
        if built is None:
            self.say(
                f"llmgw up: the llama-server build ended but no llama-server is found; see "
                f"{build.log_path}. The stand-in keeps playing llama.cpp."
            )
            return
        self.take_over(built)

    def take_over(self, llama_server: str) -> None:
        """Run llama.cpp's example on `llama_server` from now on: the agent restarted with it
        (SIGUSR1: its engines left running and adopted), then the example's source changed
        to the GGUF's local path, which rolls out beside like any catalog change."""
        started = self.started
        if started is None or not self.plan.agent:
            return
        self.say(
            f"llmgw up: llama-server built ({llama_server}): restarting the agent with it "
            "(its engines keep running) and rolling the llama.cpp example onto it"
        )
        self.agent_env[LLAMA_SERVER_ENV] = llama_server
        self.children.restart("agent", self.agent_env, signal.SIGUSR1)
        started.llama_server = llama_server
        try:
            with self.writer(started) as fleet:
                if fleet.wait_connected(30, self.stop):
                    for line in ensure_example_catalog(fleet, self.examples(started)):
                        self.say(f"catalog: {line}")
        except ClientError as exc:
            self.say(f"llmgw up: the llama.cpp example was not rolled onto llama-server: {exc}")

    def banner(self, started: Started, ready: Sequence[Replica]) -> None:
        """Where everything listens and how to use it."""
        build = self.build.phase().text() if self.build is not None else ""
        self.say(
            "\n".join(
                banner_lines(self.plan, started, ready, complete=self.complete, building=build)
            )
        )

    def serve(self) -> int:
        """Run until signalled; a child that exits on its own stops everything."""
        while not self.stop.wait(0.5):
            self.follow_build()
            child = self.children.exited()
            if child is not None:
                self.say(
                    f"llmgw up: the {child.name} exited (code {child.exit_code()}); its log "
                    f"({child.log_path}) ends:\n{child.tail()}\nstopping the rest"
                )
                return EXIT_ERROR
        return 0

    def shutdown(self) -> None:
        """Stop the children in STOP_ORDER, saying so for each."""

        def stopped(child: Child, code: int | None) -> None:
            self.say(f"llmgw up: {child.name} stopped (code {code})")

        if self.build is not None:
            self.build.stop()  # resumed where it stopped by the next build
            self.say("llmgw up: llama-server build stopped (the next run goes on with it)")
        self.children.stop_all(STOP_ORDER, stopped)


def run(opts: argparse.Namespace) -> int:
    """Run `llmgw up`; its exit code."""
    try:
        plan = build_plan(opts)
    except UpError as exc:
        print(f"llmgw up: {exc}", file=sys.stderr)
        return EXIT_USAGE
    up = Up(plan)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        up.stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return up.run()
    except (UpError, StartFailed) as exc:
        if up.stop.is_set():
            # Ctrl-C or SIGTERM while starting: not a failure.
            return 0
        print(f"llmgw up: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        up.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `up` to the `llmgw` parser's subcommands."""
    up: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="run the whole control plane here, with an example catalog",
        description="Run the whole control plane on this machine: the demo's file server, "
        "the planner, the fleet (SQLite in the data folder) and one node agent with stand-in "
        "cards, speaking mutual TLS with a local CA under DATA/tls. It loads an example "
        "catalog, waits until its replicas are READY, prints where everything listens and "
        "runs until Ctrl-C or SIGTERM. Each child logs JSON lines to DATA/logs/NAME.log.",
        epilog=example("llmgw up", "llmgw up --data /tmp/llmgw --gpus 8xH100-80GB"),
    )
    add_env_argument(
        up,
        "--data",
        env=ENV_DATA,
        default=DEFAULT_DATA,
        help="the folder for the store, logs, model files and certificates",
    )
    up.add_argument("--host", default="127.0.0.1", help="the address every service listens on")
    up.add_argument(
        "--planner-port", type=int, default=50051, help="the planner's port; 0 picks a free one"
    )
    up.add_argument(
        "--fleet-port", type=int, default=50052, help="the fleet's port; 0 picks a free one"
    )
    up.add_argument(
        "--files-port", type=int, default=50053, help="the port of the demo's file server"
    )
    up.add_argument("--gpus", default="4xH100-80GB", help="the local agent's stand-in cards")
    up.add_argument("--node", default="local", help="the local agent's node name")
    up.add_argument("--no-agent", action="store_true", help="start no agent")
    up.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve Prometheus metrics on --host: the planner at PORT, the fleet at PORT+1, "
        "the agent at PORT+2 (default 0: none)",
    )
    up.add_argument(
        "--build-llama-server",
        action="store_true",
        help="when no llama-server is found, build one in the background (what `make run` "
        "does; scripts/build_llama_server.sh): llama.cpp runs on the stand-in until it lands, "
        "then moves onto it (default: the stand-in plays llama.cpp)",
    )
    up.add_argument(
        "--ready-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the example replicas to be READY",
    )
    up.set_defaults(run=run)
    return up
