"""llmgw.metrics: the --metrics address, and the RPC interceptor's status codes."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from llmgw.metrics import split_address, status_code_name


@pytest.mark.parametrize(
    ("listen", "want"),
    [
        ("127.0.0.1:9090", ("127.0.0.1", 9090)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9090", ("::1", 9090)),
        (":9090", ("0.0.0.0", 9090)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_split_address_reads_host_and_port(listen: str, want: tuple[str, int]) -> None:
    """HOST:PORT, [V6]:PORT and :PORT (every address) are read as a host and a port."""
    assert split_address(listen) == want


@pytest.mark.parametrize("listen", ["9090", "host:", "host:http", "host:65536", "host:-1", ""])
def test_split_address_refuses_what_is_not_host_port(listen: str) -> None:
    """A missing, named or out-of-range port is refused with what was given."""
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        split_address(listen)


class _Context:
    """The part of a servicer context the interceptor reads: the code the handler set."""

    def __init__(self, code: grpc.StatusCode | None) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode | None:
        return self._code


@pytest.mark.parametrize(
    ("set_code", "error", "want"),
    [
        (None, None, "OK"),
        (grpc.StatusCode.NOT_FOUND, None, "NOT_FOUND"),
        (grpc.StatusCode.FAILED_PRECONDITION, RuntimeError("aborted"), "FAILED_PRECONDITION"),
        (None, asyncio.CancelledError(), "CANCELLED"),
        (None, ValueError("a bug"), "UNKNOWN"),
    ],
)
def teststatus_code_name_is_what_the_caller_sees(
    set_code: grpc.StatusCode | None, error: BaseException | None, want: str
) -> None:
    """An RPC is counted under the code its caller gets: the one the handler set (an abort),
    CANCELLED for a cancelled call, UNKNOWN for an exception nothing mapped, else OK."""
    assert status_code_name(_Context(set_code), error) == want
