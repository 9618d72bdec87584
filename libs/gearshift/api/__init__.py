"""Generated protobuf and gRPC code, one package per proto: gearshift.api.<service>.v1 (make protos)."""
