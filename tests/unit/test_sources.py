"""llmgw.sources: the grammar of a model source, table-driven over real forms and hostile ones."""

from __future__ import annotations

import pytest

from llmgw.sources import (
    MAX_SOURCE_CHARS,
    HubSource,
    PathSource,
    SourceRefused,
    UrlSource,
    check_path_under,
    check_revision,
    parse_source,
    path_is_under,
    revision_problem,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "hf://meta-llama/Llama-3.2-1B-Instruct",
            HubSource("meta-llama/Llama-3.2-1B-Instruct", None),
        ),
        ("hf://Qwen/Qwen3-8B@main", HubSource("Qwen/Qwen3-8B", "main")),
        ("hf://org/name@v1.2.0", HubSource("org/name", "v1.2.0")),
        ("hf://org/name@refs/pr/12", HubSource("org/name", "refs/pr/12")),
        (
            "hf://org/name@0123456789abcdef0123456789abcdef01234567",
            HubSource("org/name", "0123456789abcdef0123456789abcdef01234567"),
        ),
        (
            "https://huggingface.co/x/y/resolve/main/m-Q4_K_M.gguf?download=true",
            UrlSource(
                "https://huggingface.co/x/y/resolve/main/m-Q4_K_M.gguf?download=true",
                "https",
                "huggingface.co",
                443,
                "/x/y/resolve/main/m-Q4_K_M.gguf",
            ),
        ),
        (
            "http://127.0.0.1:8080/files/tiny.gguf",
            UrlSource(
                "http://127.0.0.1:8080/files/tiny.gguf",
                "http",
                "127.0.0.1",
                8080,
                "/files/tiny.gguf",
            ),
        ),
        (
            "HTTP://Models.Example.ORG",
            UrlSource("HTTP://Models.Example.ORG", "http", "models.example.org", 80, "/"),
        ),
    ],
)
def test_accepted_forms_parse_to_their_parts(text: str, expected: object) -> None:
    """URLs and hf:// repos (pinned or not) parse to their parts."""
    assert parse_source(text) == expected


def test_a_path_is_a_source_only_where_paths_are_allowed() -> None:
    """An absolute path is a PathSource for the agent, refused where paths are not sources."""
    assert parse_source("/models/llama.gguf", allow_paths=True) == PathSource("/models/llama.gguf")
    with pytest.raises(SourceRefused, match="https:// or http:// URL"):
        parse_source("/models/llama.gguf")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("--trust-remote-code", "cannot start with '-'"),
        ("-x", "cannot start with '-'"),
        ("--worker-cls=evilpkg.Worker", "cannot start with '-'"),
        ("-/models/x.gguf", "cannot start with '-'"),
        ("hf://a/b@..", "'..'"),
        ("hf://a/b@main/../../x", "'..'"),
        ("hf://org/name@main/../../../../tmp/x", "'..'"),
        ("hf://a/b@-x", "cannot start with '-'"),
        ("hf://a/b@", "empty"),
        ("hf://a/b@main//x", "'//'"),
        ("hf://a/b@main/", "end with"),
        ("hf://a/b@main/.hidden", "start with '.'"),
        ("hf://a/b@x.lock", ".lock"),
        ("hf://a/b@%2e%2e", "letters, digits"),
        ("hf://a/b@ma in", "letters, digits"),
        ("hf://a/b@" + "a" * 300, "longer than 255"),
        ("hf://a/b/c", "hf://ORG/NAME"),
        ("hf://a", "hf://ORG/NAME"),
        ("hf://a/..", "hf://ORG/NAME"),
        ("hf://a--b/c", "hf://ORG/NAME"),
        ("hf://-a/b", "hf://ORG/NAME"),
        ("file:///etc/passwd", "https:// or http://"),
        ("file:/etc/passwd", "https:// or http://"),
        ("ftp://example.org/x.gguf", "https:// or http://"),
        ("s3://bucket/x.gguf", "https:// or http://"),
        ("https:///x.gguf", "no host"),
        ("https://user:secret@example.org/x.gguf", "user name or password"),
        ("https://example.org:0/x.gguf", "port 0"),
        ("https://example.org:99999/x.gguf", "not a valid URL"),
        ("https://example.org/a b.gguf", "spaces"),
        ("https://example.org\\@evil/x", "backslashes"),
        ("/models/x.gguf\x00.txt", "control characters"),
        ("hf://a/b\nX-Header: 1", "control characters"),
        ("\t/models/x.gguf", "control characters"),
        (" /models/x.gguf", "whitespace"),
        ("llama3", "https:// or http://"),
        ("", "required"),
        ("x" * (MAX_SOURCE_CHARS + 1), "longer than"),
        ("https://example.org/" + "a" * 10_000_000, "longer than"),
    ],
)
def test_hostile_and_malformed_sources_are_refused_saying_why(text: str, words: str) -> None:
    """Flags, climbing revisions, other schemes, credentials, control bytes and huge strings
    are refused with a reason that names the rule (and a bounded message)."""
    with pytest.raises(SourceRefused) as caught:
        parse_source(text, allow_paths=True)
    assert words in caught.value.message
    assert caught.value.field == "source"
    assert caught.value.reason == "INVALID_SOURCE"
    assert len(caught.value.message) < 600
    assert len(caught.value.source) <= 200


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("models/x.gguf", "absolute"),
        ("/models/../etc/x.gguf", "'..'"),
        ("/models/./x.gguf", "'.'"),
        ("/models//x.gguf", "'//'"),
        ("/models/", "not a folder"),
    ],
)
def test_paths_must_be_absolute_and_normalized(text: str, words: str) -> None:
    """A relative path, one with '.'/'..' segments or '//' runs is refused, not normalized."""
    with pytest.raises(SourceRefused, match=words):
        parse_source(text, allow_paths=True)


def test_a_refusal_names_the_field_it_was_given() -> None:
    """The request field a caller names travels in the refusal (for BadRequest)."""
    with pytest.raises(SourceRefused) as caught:
        parse_source(42, field="model.source")
    assert caught.value.field == "model.source"


@pytest.mark.parametrize(
    ("revision", "ok"),
    [
        ("main", True),
        ("v2.0", True),
        ("refs/pr/1", True),
        ("release/2024-01", True),
        ("a" * 255, True),
        ("a" * 256, False),
        ("..", False),
        ("a..b", False),
        ("/main", False),
        ("main.", False),
        ("_x", False),
    ],
)
def test_revision_rule(revision: str, ok: bool) -> None:
    """A revision is a branch, tag or commit that cannot climb or read as a flag."""
    assert (revision_problem(revision) == "") is ok
    if ok:
        assert check_revision(revision) == revision
    else:
        with pytest.raises(SourceRefused):
            check_revision(revision)


@pytest.mark.parametrize(
    ("path", "roots", "inside"),
    [
        ("/models/x.gguf", ["/models"], True),
        ("/models/a/b/x.gguf", ["/data", "/models/"], True),
        ("/models2/x.gguf", ["/models"], False),
        ("/etc/passwd", ["/models"], False),
        ("/models", ["/models"], True),
        ("/anything", ["/"], True),
        ("/models/x.gguf", [], False),
    ],
)
def test_paths_under_roots(path: str, roots: list[str], inside: bool) -> None:
    """A path is under a root only inside its folder, never beside it with a shared prefix."""
    assert path_is_under(path, roots) is inside
    if inside:
        assert check_path_under(path, roots) == path
    else:
        with pytest.raises(SourceRefused):
            check_path_under(path, roots)
