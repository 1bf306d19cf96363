"""planner_svc.sources.policy: which origins, redirects and local paths the planner may read."""

from __future__ import annotations

import pytest

from llmgw.sources import parse_url
from planner_svc.domain.errors import InvalidShape
from planner_svc.sources.policy import (
    ANY_PORT,
    ENV_HOSTS,
    ENV_ROOTS,
    HostRule,
    SourceNotAllowed,
    SourcePolicy,
    network_failure,
    parse_host_rule,
)
from planner_svc.sources.resolver import ShapeResolver


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("models.example.org", HostRule("models.example.org", None)),
        ("Models.Example.org:8443", HostRule("models.example.org", 8443)),
        ("127.0.0.1:*", HostRule("127.0.0.1", ANY_PORT)),
        ("*.hf.co", HostRule("*.hf.co", None)),
        ("[::1]:8080", HostRule("::1", 8080)),
        ("http://10.1.2.3:9000", HostRule("10.1.2.3", 9000)),
        ("https://hub.internal", HostRule("hub.internal", 443)),
    ],
)
def test_host_rules_parse(text: str, rule: HostRule) -> None:
    """HOST, HOST:PORT, HOST:*, *.DOMAIN, [V6]:PORT and URL origins are host rules."""
    assert parse_host_rule(text) == rule


@pytest.mark.parametrize("text", ["", "host:0", "host:70000", "host:x", "*", "a.*.com", "*x.com"])
def test_bad_host_rules_are_refused(text: str) -> None:
    """Empty entries, bad ports and wildcards other than *.DOMAIN are configuration errors."""
    with pytest.raises(ValueError):
        parse_host_rule(text)


DEFAULT = SourcePolicy.from_settings()


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://huggingface.co/x/y/resolve/main/m.gguf", True),
        ("https://cdn-lfs.huggingface.co/repos/ab/cd/blob", True),
        ("https://cas-bridge.xethub.hf.co/xet-bridge/abc", True),
        ("https://huggingface.co:8443/x.gguf", False),
        ("https://evilhuggingface.co/x.gguf", False),
        ("https://huggingface.co.evil.com/x.gguf", False),
        ("http://127.0.0.1:6379/x.gguf", False),
        ("http://169.254.169.254/latest/meta-data/x.gguf", False),
        ("http://localhost:8080/x.gguf", False),
    ],
)
def test_the_default_policy_allows_the_hub_and_its_cdns_only(url: str, allowed: bool) -> None:
    """With nothing configured: huggingface.co on 443 and names under *.huggingface.co and
    *.hf.co; loopback, link-local metadata and look-alike names are refused."""
    if allowed:
        assert DEFAULT.check_url(url).url == url
    else:
        with pytest.raises(SourceNotAllowed) as caught:
            DEFAULT.check_url(url)
        assert caught.value.reason == "SOURCE_NOT_ALLOWED"
        assert "--allow-host" in caught.value.message


def test_the_hub_endpoint_is_allowed_exactly() -> None:
    """HF_ENDPOINT's origin is allowed on its own port, not its host's other ports."""
    policy = SourcePolicy.from_env({"HF_ENDPOINT": "http://127.0.0.1:5000"})
    assert policy.check_url("http://127.0.0.1:5000/files/tiny.gguf")
    with pytest.raises(SourceNotAllowed):
        policy.check_url("http://127.0.0.1:5001/files/tiny.gguf")


def test_flags_win_over_the_environment() -> None:
    """--allow-host and --allow-root replace LLMGW_PLANNER_ALLOW_HOSTS/ROOTS."""
    env = {ENV_HOSTS: "a.example:*,b.example", ENV_ROOTS: "/srv/a:/srv/b"}
    from_env = SourcePolicy.from_env(env)
    assert [str(r) for r in from_env.hosts] == ["a.example:*", "b.example"]
    assert from_env.roots == ("/srv/a", "/srv/b")
    flagged = SourcePolicy.from_env(env, allow_hosts=["c.example"], allow_roots=["/srv/c/"])
    assert [str(r) for r in flagged.hosts] == ["c.example"]
    assert flagged.roots == ("/srv/c",)
    with pytest.raises(ValueError, match="absolute"):
        SourcePolicy.from_env({ENV_ROOTS: "relative/dir"})


@pytest.mark.parametrize(
    ("from_url", "to_url", "allowed"),
    [
        ("https://huggingface.co/a/b/resolve/main/x.gguf", "https://cdn-lfs.hf.co/blob", True),
        ("https://huggingface.co/a/x.gguf", "/a/other.gguf", True),
        ("https://huggingface.co/a/x.gguf", "//cdn-lfs.huggingface.co/blob", True),
        ("https://huggingface.co/a/x.gguf", "http://cdn-lfs.hf.co/blob", False),
        ("https://huggingface.co/a/x.gguf", "https://127.0.0.1:22/x", False),
        ("https://huggingface.co/a/x.gguf", "//evil.example/x", False),
        ("https://huggingface.co/a/x.gguf", "file:///etc/passwd", False),
    ],
)
def test_redirects_go_only_to_allowed_origins_and_never_down_to_http(
    from_url: str, to_url: str, allowed: bool
) -> None:
    """check_redirect resolves a relative Location and checks the target like a source; an
    https source may not be sent on over plain http."""
    if allowed:
        assert DEFAULT.check_redirect(from_url, to_url).startswith("https://")
    else:
        with pytest.raises(SourceNotAllowed, match="redirected to"):
            DEFAULT.check_redirect(from_url, to_url)


@pytest.mark.parametrize(
    ("real", "allowed"),
    [
        ("/srv/models/llama.gguf", True),
        ("/srv/models/sub/llama.GGUF", True),
        ("/srv/models-old/llama.gguf", False),
        ("/etc/shadow", False),
        ("/srv/models/notes.txt", False),
        ("relative.gguf", False),
    ],
)
def test_local_paths_need_a_root_and_the_gguf_suffix(real: str, allowed: bool) -> None:
    """A local source is a .gguf whose real path is under a root; the refusal names the
    roots and reads the same whatever the file is."""
    policy = SourcePolicy.from_settings(allow_roots=["/srv/models"])
    if allowed:
        assert policy.check_path(real, real) == real
    else:
        with pytest.raises(SourceNotAllowed, match="under /srv/models"):
            policy.check_path(real, "given")


def test_no_roots_reads_no_local_file() -> None:
    """By default the planner reads no local file, and says how to allow a folder."""
    with pytest.raises(SourceNotAllowed, match="--allow-root"):
        DEFAULT.check_path("/srv/models/llama.gguf", "/srv/models/llama.gguf")


def test_the_network_failure_names_only_the_url() -> None:
    """One message for every transport failure: the URL and nothing of what the port did."""
    one = network_failure("http://10.0.0.1:22/x.gguf").message
    two = network_failure("http://10.0.0.1:80/x.gguf").message
    assert one.replace(":22", ":80") == two
    assert "no HTTP answer" in one


@pytest.mark.parametrize(
    "source",
    ["--trust-remote-code.gguf", "-x.gguf", "hf://org/name@main/../../x", "hf://a/b@-x"],
)
async def test_the_resolver_refuses_flags_and_climbing_revisions_unfetched(source: str) -> None:
    """Whatever the policy, a source starting with '-' or an hf:// revision that climbs is
    InvalidShape before any reader is called."""
    calls: list[object] = []

    async def reader(source: str) -> object:
        calls.append(source)
        raise AssertionError("read")

    async def hub(*args: object, **kwargs: object) -> tuple[dict[str, object], int]:
        calls.append(args)
        raise AssertionError("fetched")

    resolver = ShapeResolver(gguf_reader=reader, hf_fetcher=hub)  # type: ignore[arg-type]
    with pytest.raises(InvalidShape, match=r"refused|starts with '-'"):
        await resolver.resolve(source)
    assert calls == []


def test_a_hub_mirror_s_origin_is_allowed_as_the_hub_s() -> None:
    """LLMGW_HF_MIRRORS' endpoints are allowed origins (their GGUF URLs pass), the listed hosts
    stay as they were, and a malformed mirror is refused."""
    policy = SourcePolicy.from_env({"LLMGW_HF_MIRRORS": "llmgw-demo=http://127.0.0.1:50053"})
    assert policy.allows_url(parse_url("http://127.0.0.1:50053/files/tiny.gguf"))
    assert not policy.allows_url(parse_url("http://127.0.0.1:50054/files/tiny.gguf"))
    assert policy.allows_url(parse_url("https://huggingface.co/x/y/resolve/main/m.gguf"))
    with pytest.raises(ValueError, match="LLMGW_HF_MIRRORS"):
        SourcePolicy.from_env({"LLMGW_HF_MIRRORS": "llmgw-demo"})
