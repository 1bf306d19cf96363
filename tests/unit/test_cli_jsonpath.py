"""`-o jsonpath=...`: kubectl's templates over an answer's data (llmgw.cli.jsonpath)."""

from __future__ import annotations

import pytest

from llmgw.cli.jsonpath import TemplateError, parse, render

DATA = {
    "models": [
        {"model": {"name": "a", "profiles": [{"name": "gpu", "replicas": 2}]}, "revision": "3"},
        {"model": {"name": "b", "profiles": []}, "revision": "1"},
    ],
    "odd-key": True,
}


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("{.models[*].model.name}", "a b"),
        ("{.models[0].revision}", "3"),
        ("{.models[-1].model.name}", "b"),
        ("{['odd-key']}", "true"),
        ("{.models[0].model.profiles[0]}", '{"name":"gpu","replicas":2}'),
        ('{range .models[*]}{.model.name}={.revision}{"\\n"}{end}', "a=3\nb=1\n"),
        ("names: {.models[*].model.name}!", "names: a b!"),
        ("{.nothing.here}", ""),
        ("{$.models[1].model.name}", "b"),
    ],
)
def test_templates(template: str, want: str) -> None:
    """Fields, indices, every element, keys by name, ranges and literals, as kubectl reads
    them."""
    assert render(parse(template), DATA) == want


@pytest.mark.parametrize(
    "template", ["{.models[?(@.x)]}", "{.models", "{range .models[*]}", "{end}", "{..name}"]
)
def test_unsupported_templates_are_refused(template: str) -> None:
    """Filters, recursive descent and unbalanced templates are refused when read."""
    with pytest.raises(TemplateError):
        parse(template)
