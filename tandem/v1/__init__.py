"""Generated protobuf/gRPC code for protos/tandem/v1/decoding.proto (made by scripts/bootstrap.sh;
never edited by hand, not committed)."""
