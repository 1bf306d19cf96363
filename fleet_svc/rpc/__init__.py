"""The gRPC edge of the fleet: servicers, conversion, the error table."""
