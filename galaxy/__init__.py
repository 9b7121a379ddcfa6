"""Generated gRPC code for the galaxy.v1 API (see proto/)."""
