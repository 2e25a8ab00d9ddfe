"""Front ends: adapters from the wire (HTTP/REST, gRPC) to the Engine and back."""
