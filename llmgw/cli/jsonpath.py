"""`-o jsonpath=TEMPLATE`: kubectl's JSONPath templates over an answer's JSON.

The part of kubectl's syntax (https://kubernetes.io/docs/reference/kubectl/jsonpath/) that
reads plain data: text outside braces printed as it is; `{.a.b}` a field, `{.items[0]}` an
element, `{.items[-1]}` from the end, `{.items[*].name}` every element's, `{.a['b-c']}` a key by
name, `{@}` the current value, `{"\\n"}` / `{'\\t'}` a string literal, and `{range .items[*]}...
{end}` the inner template once per element. Several results of one expression are joined by
spaces; a mapping or a list prints as JSON; a path that is not there prints nothing (kubectl
refuses it; here it answers "" so a table of optional fields keeps its shape). Anything else
(filters, slices with steps, recursive descent) is refused when the template is read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

MAX_TEMPLATE = 4096
"""The longest template read."""

_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[(-?\d+|\*)\]|\[['\"]([^'\"]*)['\"]\]")


class TemplateError(ValueError):
    """A template outside the supported syntax; the message says where."""


@dataclass(frozen=True)
class _Path:
    steps: tuple[str | int, ...]
    """Field names, indices, and "*" for every element."""


@dataclass(frozen=True)
class _Range:
    path: _Path
    body: list[Any] = field(default_factory=list)


def _path(text: str) -> _Path:
    text = text.strip()
    if text.startswith("$"):
        text = text[1:]
    if text.startswith("@"):
        text = text[1:]
    steps: list[str | int] = []
    pos = 0
    while pos < len(text):
        match = _STEP.match(text, pos)
        if match is None:
            raise TemplateError(f"jsonpath: cannot read {text[pos:]!r} (at {pos + 1} of {text!r})")
        name, index, key = match.groups()
        if name is not None:
            steps.append(name)
        elif key is not None:
            steps.append(key)
        else:
            steps.append("*" if index == "*" else int(index))
        pos = match.end()
    return _Path(tuple(steps))


def _literal(text: str) -> str | None:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].encode().decode("unicode_escape")
    return None


def parse(template: str) -> list[Any]:
    """A template's parts: text, paths and ranges.

    Raises:
        TemplateError: unsupported syntax, an unclosed brace or range.
    """
    if len(template) > MAX_TEMPLATE:
        raise TemplateError(f"jsonpath: a template of at most {MAX_TEMPLATE} characters")
    root: list[Any] = []
    stack: list[list[Any]] = [root]
    pos = 0
    while pos < len(template):
        start = template.find("{", pos)
        if start < 0:
            stack[-1].append(template[pos:])
            break
        if start > pos:
            stack[-1].append(template[pos:start])
        end = template.find("}", start)
        if end < 0:
            raise TemplateError(f"jsonpath: unclosed {{ at {start + 1}")
        inner = template[start + 1 : end].strip()
        pos = end + 1
        literal = _literal(inner)
        if literal is not None:
            stack[-1].append(literal)
        elif inner.startswith("range "):
            node = _Range(_path(inner[len("range ") :]))
            stack[-1].append(node)
            stack.append(node.body)
        elif inner == "end":
            if len(stack) == 1:
                raise TemplateError("jsonpath: {end} without {range}")
            stack.pop()
        else:
            stack[-1].append(_path(inner))
    if len(stack) != 1:
        raise TemplateError("jsonpath: {range} without {end}")
    return root


def _select(value: Any, steps: tuple[str | int, ...]) -> list[Any]:
    found = [value]
    for step in steps:
        nxt: list[Any] = []
        for v in found:
            if step == "*":
                if isinstance(v, list):
                    nxt.extend(v)
                elif isinstance(v, dict):
                    nxt.extend(v.values())
            elif isinstance(step, int):
                if isinstance(v, list) and -len(v) <= step < len(v):
                    nxt.append(v[step])
            elif isinstance(v, dict) and step in v:
                nxt.append(v[step])
        found = nxt
    return found


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(parts: list[Any], data: Any) -> str:
    """A parsed template applied to `data`."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, _Range):
            out.extend(render(part.body, item) for item in _select(data, part.path.steps))
        else:
            out.append(" ".join(_text(v) for v in _select(data, part.steps)))
    return "".join(out)
