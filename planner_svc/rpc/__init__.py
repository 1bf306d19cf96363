"""The gRPC edge: servicers, proto<->domain conversion, the error table."""
