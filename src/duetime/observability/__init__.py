"""Observability: Prometheus metrics read from the components' `statistics()` snapshots."""
