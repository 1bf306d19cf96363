"""How a typed client says who calls: a bearer token in the `authorization` metadata, for a
caller with no client certificate (the Go gateway, a person with a token the operator
issued). The servers check it against their tokens file; a client certificate, when the
channel has one, is the other way (llmgw.tls)."""

from __future__ import annotations

AUTHORIZATION = "authorization"
"""The metadata key (gRPC's, lower case, as HTTP/2 carries it: RFC 6750's `Authorization`)."""


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata that carries `token` (`authorization: Bearer TOKEN`); none without one.

    Raises:
        ValueError: the token has whitespace or control characters (it could not travel as
            one header value, or would be read as another).
    """
    if not token:
        return ()
    if any(c.isspace() or ord(c) < 0x21 or ord(c) == 0x7F for c in token):
        raise ValueError("a bearer token is one word of printable characters")
    return ((AUTHORIZATION, f"Bearer {token}"),)
