"""The stand-in as one member of a gang: it reads the multi-node flags the engine it stands in
for reads, refuses what that engine would refuse, and meets its peers over TCP as the engine
does (a head waits for every rank; a member that cannot reach the head, or loses it, fails).

- vLLM (vllm/engine/arg_utils.py, vllm/entrypoints/cli/serve.py): `--nnodes/-n`,
  `--node-rank/-r`, `--master-addr`, `--master-port`, `--headless`; ranks > 0 must run
  headless (only `run_headless` joins a head), a headless member serves no HTTP; the world
  (tensor × pipeline parallel) is the gang's nodes × the cards each sees.
- SGLang (sglang/srt/server_args.py): `--nnodes`, `--node-rank`, `--dist-init-addr HOST:PORT`;
  each node runs tp_size / nnodes ranks; ranks >= 1 answer only a dummy /health.
- llama.cpp: the head's `--rpc HOST:PORT,...` (common/arg.cpp) must each reach a listening
  `rpc-server -H HOST -p PORT` (tools/rpc), or llama-server fails to start.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.engines import registry
from llmgw.engines.errors import EngineRefuses

TIMEOUT_ENV = "LLMGW_STANDIN_GANG_TIMEOUT_S"
"""How long a head waits for its members and a member for its head (seconds)."""
DEFAULT_TIMEOUT_S = 60.0


class GangError(ValueError):
    """Multi-node flags the engine would refuse; the message is the engine-like error line."""


@dataclass(frozen=True)
class GangRole:
    """This process's part in a gang, as its flags say."""

    engine: str
    nnodes: int
    rank: int
    rendezvous: tuple[str, int] = ("", 0)
    """Where the gang meets (vLLM's master, SGLang's dist-init address)."""
    rpc: tuple[tuple[str, int], ...] = ()
    """llama.cpp's RPC servers the head offloads to."""
    serves_http: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def head(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0


def _value(argv: Sequence[str], names: Sequence[str]) -> str | None:
    """The last value given to any of `names` (`--flag value` or `--flag=value`)."""
    found = None
    for i, arg in enumerate(argv):
        name, eq, inline = arg.partition("=")
        if name in names:
            found = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return found


def _int(flag: str, value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise GangError(f"argument {flag}: invalid int value: {value!r}") from None


def _address(flag: str, value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GangError(f"argument {flag}: {value!r} is not HOST:PORT")
    return host, int(port)


def _ranks(engine: str, argv: Sequence[str]) -> int:
    """Tensor × pipeline parallel ranks as the engine reads them (1 when unset)."""
    found = registry.find(engine)
    tp_flag = getattr(found, "tp_flag", ())
    pp_flag = getattr(found, "pp_flag", ())
    if found is None:
        return 1
    try:
        tp = found.grammar.count(argv, tp_flag) if tp_flag else None
        pp = found.grammar.count(argv, pp_flag) if pp_flag else None
    except EngineRefuses as exc:
        raise GangError(f"error: {exc.message}") from exc
    return (tp or 1) * (pp or 1)


def read_role(
    engine: str, argv: Sequence[str], gpus: int, env: Mapping[str, str]
) -> GangRole | None:
    """The gang role the flags give, as `engine` reads them; None when they ask for none.

    Raises:
        GangError: what the engine would refuse (a rank outside the gang, no rendezvous,
            a member that is not headless, a world that is not nodes × cards).
    """
    timeout_s = float(env.get(TIMEOUT_ENV, "") or DEFAULT_TIMEOUT_S)
    found = registry.find(engine)
    name = found.name if found is not None else engine
    if name == "llamacpp":
        listed = _value(argv, ("--rpc",))
        if listed is None:
            return None
        servers = tuple(_address("--rpc", s) for s in listed.split(",") if s)
        if not servers:
            raise GangError("error: --rpc: no RPC servers given")
        return GangRole(name, len(servers) + 1, 0, rpc=servers, timeout_s=timeout_s)
    if name == "vllm":
        nnodes = _int("--nnodes", _value(argv, ("--nnodes", "-n")), 1)
        rank = _int("--node-rank", _value(argv, ("--node-rank", "-r")), 0)
        headless = "--headless" in argv
        if nnodes <= 1 and rank == 0:
            return None
        if nnodes < 1 or not 0 <= rank < nnodes:
            raise GangError(
                f"ValueError: node_rank ({rank}) must be in [0, nnodes) with nnodes={nnodes}"
            )
        if rank > 0 and not headless:
            # Only `vllm serve --headless` reaches run_headless, where a node of rank > 0
            # joins the head; without it the node would start an engine of its own.
            raise GangError(
                f"ValueError: a node of rank {rank} must run --headless to join the head node"
            )
        host = _value(argv, ("--master-addr",)) or "127.0.0.1"
        port = _int("--master-port", _value(argv, ("--master-port",)), 29501)
        role = GangRole(name, nnodes, rank, (host, port), serves_http=not headless)
    elif name == "sglang":
        nnodes = _int("--nnodes", _value(argv, ("--nnodes",)), 1)
        rank = _int("--node-rank", _value(argv, ("--node-rank",)), 0)
        if nnodes <= 1 and rank == 0:
            return None
        if nnodes < 1 or not 0 <= rank < nnodes:
            raise GangError(f"AssertionError: node_rank {rank} is not below nnodes {nnodes}")
        dist = _value(argv, ("--dist-init-addr", "--nccl-init-addr"))
        if not dist:
            raise GangError("ValueError: --dist-init-addr is required when --nnodes > 1")
        role = GangRole(name, nnodes, rank, _address("--dist-init-addr", dist))
    else:
        return None
    ranks = _ranks(name, argv)
    if ranks != nnodes * gpus:
        raise GangError(
            f"ValueError: the world size {ranks} (tensor x pipeline parallel) does not match "
            f"{nnodes} nodes x {gpus} GPUs each"
        )
    return GangRole(**{**role.__dict__, "timeout_s": timeout_s})


@dataclass
class GangLink:
    """This process's links to the rest of its gang, once running: `formed` once the gang
    met, `broken` with why when it fell apart."""

    role: GangRole
    formed: threading.Event = field(default_factory=threading.Event)
    broken: threading.Event = field(default_factory=threading.Event)
    why: str = ""
    _socks: list[socket.socket] = field(default_factory=list)
    _closing: bool = False

    def fail(self, why: str) -> None:
        """Record the first reason the gang broke."""
        if not self.broken.is_set():
            self.why = why
            self.broken.set()

    def close(self) -> None:
        """Drop every link (this process is going away)."""
        self._closing = True
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()

    def start(self, bind_host: str) -> None:
        """Meet the peers in the background: a head listens for its members, a member dials
        its head, llama.cpp's head dials its RPC servers."""
        role = self.role
        if role.rpc:
            target = self._dial_rpc
        elif role.head:
            target = self._listen
        else:
            target = self._join
        threading.Thread(target=target, args=(bind_host,), daemon=True, name="gang").start()

    def _watch(self, sock: socket.socket, what: str) -> None:
        """Fail the gang when the peer at the other end goes away."""

        def run() -> None:
            with contextlib.suppress(OSError):
                while sock.recv(64):
                    pass
            if not self._closing:
                self.fail(f"{what} went away")

        threading.Thread(target=run, daemon=True).start()

    def _dial(self, host: str, port: int) -> socket.socket | None:
        deadline = time.monotonic() + self.role.timeout_s
        while time.monotonic() < deadline and not self._closing:
            try:
                sock = socket.create_connection((host, port), timeout=2.0)
            except OSError:
                time.sleep(0.1)
                continue
            sock.settimeout(None)
            self._socks.append(sock)
            return sock
        return None

    def _join(self, bind_host: str) -> None:
        role = self.role
        host, port = role.rendezvous
        sock = self._dial(host, port)
        if sock is None:
            self.fail(f"could not reach the head node at {host}:{port} within {role.timeout_s:g} s")
            return
        sock.sendall(f"JOIN {role.engine} {role.nnodes} {role.rank}\n".encode())
        answer = sock.makefile("r").readline().strip()
        if answer != "OK":
            self.fail(f"the head node at {host}:{port} refused rank {role.rank}: {answer[3:]}")
            return
        self.formed.set()
        self._watch(sock, f"the head node at {host}:{port}")

    def _listen(self, bind_host: str) -> None:
        role = self.role
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((bind_host, role.rendezvous[1]))
        except OSError as exc:
            self.fail(f"cannot listen on {bind_host}:{role.rendezvous[1]}: {exc}")
            return
        server.listen(role.nnodes)
        server.settimeout(0.2)
        self._socks.append(server)
        joined: set[int] = set()
        deadline = time.monotonic() + role.timeout_s
        while len(joined) < role.nnodes - 1 and not self._closing:
            if time.monotonic() > deadline:
                missing = sorted(set(range(1, role.nnodes)) - joined)
                self.fail(f"ranks {missing} did not join within {role.timeout_s:g} s")
                return
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(5.0)
            try:
                words = sock.makefile("r").readline().split()
            except OSError:
                words = []
            why = self._refusal(words, joined)
            if why:
                with contextlib.suppress(OSError):
                    sock.sendall(f"NO {why}\n".encode())
                    sock.close()
                continue
            rank = int(words[3])
            sock.settimeout(None)
            sock.sendall(b"OK\n")
            self._socks.append(sock)
            joined.add(rank)
            self._watch(sock, f"rank {rank}")
        self.formed.set()

    def _refusal(self, words: list[str], joined: set[int]) -> str:
        """Why a joining member is not taken ("" when it is): torch.distributed would not
        form a group of another size, and a rank joins once."""
        role = self.role
        if len(words) != 4 or words[0] != "JOIN" or not (words[2] + words[3]).isdigit():
            return "not a member's hello"
        engine, nnodes, rank = words[1], int(words[2]), int(words[3])
        if engine != role.engine:
            return f"a {engine} member cannot join a {role.engine} gang"
        if nnodes != role.nnodes:
            return f"it counts {nnodes} nodes, the head {role.nnodes}"
        if not 1 <= rank < role.nnodes or rank in joined:
            return f"rank {rank} is not free"
        return ""

    def _dial_rpc(self, bind_host: str) -> None:
        for host, port in self.role.rpc:
            sock = self._dial(host, port)
            if sock is None:
                self.fail(f"failed to connect to RPC server at {host}:{port}")
                return
            sock.sendall(b"HELLO\n")
            if sock.makefile("r").readline().strip() != "OK":
                self.fail(f"RPC server at {host}:{port} did not answer")
                return
            self._watch(sock, f"RPC server {host}:{port}")
        self.formed.set()


def serve_rpc(host: str, port: int, stop: threading.Event) -> str:
    """Run as llama.cpp's rpc-server on host:port until `stop`: answer each head that
    connects. Returns "" on a clean stop, else why it could not serve."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((host, port))
    except OSError as exc:
        return f"cannot bind {host}:{port}: {exc}"
    server.listen(8)
    server.settimeout(0.2)

    def answer(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            if sock.makefile("r").readline().strip() == "HELLO":
                sock.sendall(b"OK\n")
                while sock.recv(64):
                    pass

    try:
        while not stop.is_set():
            try:
                sock, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=answer, args=(sock,), daemon=True).start()
    finally:
        server.close()
    return ""


def parse_rpc_server(argv: Sequence[str]) -> tuple[str, int]:
    """rpc-server's `-H HOST -p PORT` (its defaults: 127.0.0.1, 50052).

    Raises:
        GangError: a port that is not a number.
    """
    host = _value(argv, ("-H", "--host")) or "127.0.0.1"
    port = _int("-p", _value(argv, ("-p", "--port")), 50052)
    return host, port
