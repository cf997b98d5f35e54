"""Brook's wire contract: protobuf/gRPC definitions, their generated modules, and the
error codes (``proto.errors``) shared by every process and the client."""
