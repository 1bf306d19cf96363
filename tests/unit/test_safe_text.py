"""Text safe to print: names match whole (a trailing newline is no name), every identifier and
free-text field of a model refuses terminal controls, direction overrides and line
separators, what nodes report is cleaned, `llmgw` escapes what it prints, and credentials in
a source URL are refused without being echoed."""

from __future__ import annotations

import io

import pytest

from fleet_svc.domain import catalog
from fleet_svc.domain.errors import InvalidModel
from llmgw.cli.output import table
from llmgw.cli.terminal import EscapingStream
from llmgw.common.v1 import common_pb2
from llmgw.identity import IdentityError, check_name
from llmgw.model import InvalidValue
from llmgw.rpc.common import inventory_from_proto, model_from_proto
from llmgw.sources import SourceRefused, parse_source, redacted
from llmgw.text import cleaned, escaped

UNSAFE = ["\x1b[2J", "\n", "\r", "\x00", "\x7f", "\x85", "\x9b", "\u202e", "\u2066", "\u2028"]
"""ESC (a screen clear), newline, CR, NUL, DEL, C1 NEL and CSI, a right-to-left override, an
isolate and the Unicode line separator."""


def test_names_match_whole() -> None:
    """`tokurl\\n` is neither a model name nor an identity name (`$` would have let it in)."""
    with pytest.raises(InvalidModel):
        catalog.check_name("tokurl\n")
    catalog.check_name("tokurl")
    with pytest.raises(IdentityError):
        check_name("mallory\n")
    with pytest.raises(SourceRefused):
        parse_source("hf://org/name@main\n")


def _model(**fields: object) -> common_pb2.Model:
    profile = common_pb2.Profile(name="p", engine="vllm", gpu_class="L4-24GB", args=["-tp", "1"])
    msg = common_pb2.Model(name="m", source="hf://org/name", profiles=[profile])
    for path, value in fields.items():
        target: object = msg
        *parents, leaf = path.split(".")
        for part in parents:
            target = getattr(target, part)[0] if part == "profiles" else getattr(target, part)
        if leaf == "args":
            target.args[:] = [value]  # type: ignore[attr-defined]
        elif leaf == "files":
            target.files.add(path=value, bytes=1)  # type: ignore[attr-defined]
        else:
            setattr(target, leaf, value)
    return msg


FIELDS = [
    ("name", "model.name"),
    ("origin.repo", "model.origin.repo"),
    ("origin.revision", "model.origin.revision"),
    ("origin.files", "model.origin.files[0].path"),
    ("profiles.name", "model.profiles[0].name"),
    ("profiles.engine", "model.profiles[0].engine"),
    ("profiles.gpu_class", "model.profiles[0].gpu_class"),
    ("profiles.engine_version", "model.profiles[0].engine_version"),
    ("profiles.args", "model.profiles[0].args[0]"),
]


@pytest.mark.parametrize("char", UNSAFE, ids=[f"U+{ord(c[0]):04X}" for c in UNSAFE])
@pytest.mark.parametrize(("path", "field"), FIELDS, ids=[f for f, _ in FIELDS])
def test_every_model_field_refuses_control_characters(path: str, field: str, char: str) -> None:
    """Each identifier and free-text field of a model refuses each unsafe character, naming
    the field and the code point (arguments keep newlines only: inline chat templates)."""
    msg = _model(**{path: f"x{char}y"})
    if path == "profiles.args" and char == "\n":
        model_from_proto(msg)
        return
    with pytest.raises(InvalidValue) as caught:
        model_from_proto(msg)
    assert caught.value.field == field
    assert f"U+{ord(char[0]):04X}" in caught.value.message


@pytest.mark.parametrize("char", UNSAFE, ids=[f"U+{ord(c[0]):04X}" for c in UNSAFE])
def test_sources_refuse_control_characters(char: str) -> None:
    """A source holding any unsafe character is refused by the sources' grammar (the fleet's
    INVALID_SOURCE, the agent's SOURCE_REFUSED)."""
    with pytest.raises(SourceRefused):
        parse_source(f"hf://org/name{char}")


def test_inventory_names_refuse_control_characters() -> None:
    """A node name or card class in an inventory refuses an ESC."""
    for name, gpu_class in (("n\x1b", "L4"), ("n", "L4\u202e")):
        inv = common_pb2.Inventory(nodes=[common_pb2.InventoryNode(name=name, gpu_class=gpu_class)])
        with pytest.raises(InvalidValue):
            inventory_from_proto(inv)


def test_reported_text_is_cleaned_and_printed_text_escaped() -> None:
    """What a node reports keeps its letters with each control replaced; what llmgw prints
    shows each control as an escape, in table cells newlines too."""
    assert cleaned("L4\x1b[2J\u202e") == "L4\ufffd[2J\ufffd"
    assert escaped("a\x1b[2Jb\u202ec\n", keep=frozenset("\n")) == "a\\x1b[2Jb\\u202ec\n"
    rows = table(("name", "note"), [["m\nall replicas LOST", "\x1b[2J"]])
    assert rows.splitlines()[1].split() == ["m\\nall", "replicas", "LOST", "\\x1b[2J"]
    sink = io.StringIO()
    stream = EscapingStream(sink)
    print("line one\n\tindented \x1b]0;owned\x07 \x9b31m", file=stream)
    assert sink.getvalue() == "line one\n\tindented \\x1b]0;owned\\x07 \\x9b31m\n"


@pytest.mark.parametrize(
    "url",
    [
        "https://huggingface.co/org/name/resolve/main/m.gguf?token=SECRET",
        "https://user:SECRET@huggingface.co/org/name/resolve/main/m.gguf",
        "https://cdn.example/m.gguf?X-Amz-Credential=a&X-Amz-Signature=SECRET",
        "https://host/m.gguf?access_token=SECRET&download=1",
        "https://host/m.gguf?sig=SECRET",
        "https://host/m.gguf?x=hf_SECRETSECRETSECRETSECRET",
    ],
)
def test_credentials_in_a_source_are_refused_and_not_echoed(url: str) -> None:
    """A URL with userinfo or a credential-carrying query parameter is refused, pointing at
    HF_TOKEN; neither the message nor the metadata holds the secret."""
    with pytest.raises(SourceRefused) as caught:
        parse_source(url)
    assert "HF_TOKEN" in caught.value.message
    assert "SECRET" not in caught.value.message
    assert "SECRET" not in str(caught.value.metadata())
    assert "SECRET" not in redacted(url)


def test_plain_query_parameters_pass() -> None:
    """A URL whose query carries no credential (the Hub's ?download=true) is a source."""
    parse_source("https://huggingface.co/org/name/resolve/main/m.gguf?download=true")
