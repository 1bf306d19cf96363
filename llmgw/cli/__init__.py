"""The `llmgw` command line.

gRPC's core library logs a refused TLS handshake on stderr at INFO (`I... ssl_transport_security.cc
... Handshake failed`) before the command prints what it means; the command line sets
GRPC_VERBOSITY to ERROR unless it is set, before gRPC is first imported (its core reads it
then). `llmgw up` gives its children the environment without it (GRPC_VERBOSITY_SET_HERE).
"""

import os

GRPC_VERBOSITY = "GRPC_VERBOSITY"
GRPC_VERBOSITY_SET_HERE = GRPC_VERBOSITY not in os.environ
"""Whether this package set GRPC_VERBOSITY (then the services it starts do not inherit it)."""
if GRPC_VERBOSITY_SET_HERE:
    os.environ[GRPC_VERBOSITY] = "ERROR"
