"""Bench: the planner's SizeContext rate over mutual TLS over its rate in plaintext.

Two planners run as child processes, as deployed (`python -m planner_svc`): one plaintext on
loopback, one with `--tls-cert/--tls-key/--tls-ca` (certificates made by `llmgw.certs` for the
run). One client channel to each keeps `concurrency` SizeContext calls (Llama-3.1-8B, inline
shape) in flight. Rounds alternate which planner goes first; the ratio is taken per round
(TLS rate over the plaintext rate of the same round), then the median, so the machine's
other load moves both sides of a ratio together. The server CPU per call of each is read
from /proc. A handshake is paid once per channel, so this is the steady cost of encryption
on a long-lived channel, which is how the fleet and the gateway call the planner.

Goal: >= 0.9. Run: `.venv/bin/python -m bench.planner_tls [--full]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from bench.planner_throughput import LLAMA_8B, burst, size_request, start_child, vllm_model
from llmgw import certs
from llmgw.planner.v1 import planner_pb2_grpc
from llmgw.tls import ClientTLS, aio_channel


async def measure(rounds: int, calls: int, concurrency: int, folder: Path) -> dict[str, float]:
    """Interleaved rounds against a plaintext and a mutual-TLS planner; the figures.

    Returns:
        `plain_per_s`, `mtls_per_s` (median rates), `plain_cpu_us`, `mtls_cpu_us` (median
        server CPU per call), `mtls_ratio` (median of per-round rate ratios) and
        `mtls_cpu_ratio` (server CPU per call, TLS over plaintext).
    """
    tls = certs.make_local_tls(folder / "tls", servers=("planner",), clients=("admin",))
    cert, key = tls.servers["planner"]
    common = ["--listen", "127.0.0.1:0", "--log-format", "json"]
    plain = await start_child("planner_svc", common, folder / "plain.log")
    try:
        mtls = await start_child(
            "planner_svc",
            [*common, "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(tls.ca_cert)],
            folder / "mtls.log",
        )
    except BaseException:
        await plain.stop()
        raise
    admin_cert, admin_key = tls.clients["admin"]
    client = ClientTLS(ca=tls.ca_cert, cert=admin_cert, key=admin_key)
    channels = {
        "plain": aio_channel(plain.address, None),
        "mtls": aio_channel(mtls.address, client),
    }
    servers = {"plain": plain, "mtls": mtls}
    request = size_request(vllm_model(shape=LLAMA_8B))
    try:
        stubs = {k: planner_pb2_grpc.PlannerServiceStub(c) for k, c in channels.items()}

        def caller(name: str) -> Callable[[], Awaitable[object]]:
            stub = stubs[name]
            return lambda: stub.SizeContext(request)

        for name, stub in stubs.items():
            answer = await stub.SizeContext(request)
            assert answer.change.after == 16384, answer
            await burst(caller(name), concurrency * 4, concurrency)
        rates: dict[str, list[float]] = {k: [] for k in stubs}
        cpus: dict[str, list[float]] = {k: [] for k in stubs}
        names = list(stubs)
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                before = servers[name].cpu_s()
                wall_s = await burst(caller(name), calls, concurrency)
                cpus[name].append((servers[name].cpu_s() - before) / calls)
                rates[name].append(calls / wall_s)
    finally:
        for channel in channels.values():
            await channel.close()
        await mtls.stop()
        await plain.stop()
    figures = {f"{k}_per_s": statistics.median(v) for k, v in rates.items()}
    figures |= {f"{k}_cpu_us": statistics.median(v) * 1e6 for k, v in cpus.items()}
    pairs = zip(rates["mtls"], rates["plain"], strict=True)
    figures["mtls_ratio"] = statistics.median(a / b for a, b in pairs)
    figures["mtls_cpu_ratio"] = figures["mtls_cpu_us"] / max(figures["plain_cpu_us"], 1e-9)
    return figures


def report(figures: dict[str, float], rounds: int, calls: int, concurrency: int) -> None:
    """Print the figures as a table."""
    print(
        f"two planners as child processes; one grpc.aio channel each, {concurrency} in flight; "
        f"{rounds} alternating rounds of {calls} SizeContext calls (inline shape)"
    )
    print(f"{'transport':<22} {'calls/s':>9} {'server CPU/call':>16}")
    for name, label in (("plain", "plaintext (loopback)"), ("mtls", "mutual TLS")):
        print(
            f"{label:<22} {figures[f'{name}_per_s']:>9,.0f} {figures[f'{name}_cpu_us']:>13,.0f} us"
        )
    print(
        f"goal: SizeContext over mutual TLS >= 0.9 of plaintext: {figures['mtls_ratio']:.2f} "
        f"(server CPU per call {figures['mtls_cpu_ratio']:.2f}x)"
    )


def run(full: bool) -> dict[str, float]:
    """The benchmark at its quick or full size; prints its table, returns its figures."""
    rounds, calls, concurrency = (9, 2000, 16) if full else (6, 600, 16)
    with tempfile.TemporaryDirectory(prefix="bench-planner-tls-") as tmp:
        figures = asyncio.run(measure(rounds, calls, concurrency, Path(tmp)))
    report(figures, rounds, calls, concurrency)
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    """Parse `--full`, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--full", action="store_true", help="the issue's sizes (longer)")
    run(parser.parse_args(argv).full)


if __name__ == "__main__":
    main()
