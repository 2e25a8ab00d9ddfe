"""Execution: ONNX Runtime sessions, each owned by one instance thread."""
