"""Text safe to print, against a real fleet and planner and the real `llmgw ctl`: a name with
a trailing newline, a field with an ESC and a source carrying a token are refused (the token
never echoed), a node's card model with terminal controls is stored cleaned, and `llmgw ctl`
prints an argument's newline as an escape, never as a forged line."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_status import rpc_status
from structlog.testing import capture_logs

from llmgw.common.v1 import common_pb2
from llmgw.fleet.v1 import fleet_pb2
from llmgw.planner.v1 import planner_pb2
from llmgw.rpc.status import error_info
from llmgw.testing.eventually import assert_eventually
from llmgw.testing.scripted_agent import ScriptedAgent
from tests.integration.test_cli_ctl import ctl, running_fleet
from tests.support.planner import running_planner

SECRET = "hf_SeCrEtTokenValue1234567890"


def _model(name: str = "safe", args: tuple[str, ...] = ()) -> common_pb2.Model:
    p = common_pb2.Profile(
        name="gpu", engine="vllm", gpu_class="H100-80GB", replicas=0, args=list(args)
    )
    return common_pb2.Model(
        name=name, source="hf://Qwen/Qwen3-8B", context_length=8192, profiles=[p]
    )


async def _refusal(call: object) -> tuple[grpc.aio.AioRpcError, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    status = rpc_status.from_call(caught.value)
    assert status is not None
    info = error_info(status)
    assert info is not None
    return caught.value, info.reason


async def test_fleet_refuses_newline_names_control_fields_and_url_tokens(tmp_path: Path) -> None:
    """`tokurl\\n` beside `tokurl`, a profile name with an ESC and a source with ?token= are
    refused INVALID_MODEL / INVALID_SOURCE; the refusal's every byte lacks the token, and only
    `tokurl` is in the catalog."""
    async with running_fleet(tmp_path) as (_fleet, stub):
        await stub.CreateModel(fleet_pb2.CreateModelRequest(model=_model("tokurl")))
        _, reason = await _refusal(
            stub.CreateModel(fleet_pb2.CreateModelRequest(model=_model("tokurl\n")))
        )
        assert reason == "INVALID_MODEL"
        bad = _model("esc")
        bad.profiles[0].name = "gpu\x1b[2J"
        _, reason = await _refusal(stub.CreateModel(fleet_pb2.CreateModelRequest(model=bad)))
        assert reason == "INVALID_MODEL"
        leaky = _model("leaky")
        leaky.source = f"https://huggingface.co/o/n/resolve/main/m.gguf?token={SECRET}"
        err, reason = await _refusal(stub.CreateModel(fleet_pb2.CreateModelRequest(model=leaky)))
        assert reason == "INVALID_SOURCE"
        assert "HF_TOKEN" in (err.details() or "")
        assert SECRET not in str(err.trailing_metadata()) + (err.details() or "")
        listed = (await stub.ListModels(fleet_pb2.ListModelsRequest())).models
        names = [m.model.name for m in listed]
        assert names == ["tokurl"]


async def test_planner_refuses_url_tokens_without_echoing_them() -> None:
    """DescribeModel of a GGUF URL with a credential is refused SOURCE_NOT_ALLOWED; neither
    its message, its details nor the planner's log lines carry the token."""
    source = f"https://huggingface.co/o/n/resolve/main/m.gguf?X-Amz-Signature={SECRET}"
    with capture_logs() as logs:
        async with running_planner() as (_server, stub, _channel):
            err, reason = await _refusal(
                stub.DescribeModel(planner_pb2.DescribeModelRequest(source=source))
            )
            model = common_pb2.Model(name="m", source=source)
            answer = await stub.SizeContext(
                planner_pb2.SizeContextRequest(model=model, tokens=4096)
            )
    assert reason == "SOURCE_NOT_ALLOWED"
    assert SECRET not in str(err.trailing_metadata()) + (err.details() or "")
    assert SECRET not in answer.change.note
    assert SECRET not in str(logs)


async def test_ctl_shows_node_controls_cleaned_and_arg_newlines_escaped(tmp_path: Path) -> None:
    """A node whose card model holds a screen clear and an overline is listed by `llmgw ctl
    node list` with neither an ESC nor a bidi override on the screen; an argument holding a
    newline shows as `\\n` on its one line in `llmgw ctl model show`."""
    async with running_fleet(tmp_path) as (fleet, stub):
        agent = ScriptedAgent(f"127.0.0.1:{fleet.port}", "node-a", gpu_class="H100\x1b[2J\u202e")
        agent.start()
        try:

            async def listed() -> bool:
                nodes = (await stub.ListNodes(fleet_pb2.ListNodesRequest())).nodes
                return bool(nodes and nodes[0].cards)

            await assert_eventually(listed, what="node-a listed with its cards")
            model = _model("tmpl", args=("--chat-template", "{{ x }}\nall replicas LOST"))
            await stub.CreateModel(fleet_pb2.CreateModelRequest(model=model))
            nodes = await ctl(fleet.port, "node", "list")
            shown = await ctl(fleet.port, "model", "show", "tmpl")
            as_json = await ctl(fleet.port, "node", "list", "--json")
        finally:
            await agent.stop()
    assert nodes.code == 0, nodes.err
    for text in (nodes.out, as_json.out):
        assert "\x1b" not in text and "\u202e" not in text, text
    assert "\ufffd" in nodes.out or "\\ufffd" in as_json.out
    assert shown.code == 0, shown.err
    assert not any(line.startswith("all replicas LOST") for line in shown.out.splitlines())
    assert "{{ x }}\\nall replicas LOST" in shown.out
