"""Test and demo support shipped inside the package (as structlog.testing does): real servers
and peers that the tests, the demo and bench/ share."""
