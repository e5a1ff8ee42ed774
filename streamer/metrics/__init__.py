"""Prometheus metrics of the service and the building blocks of every role's metrics, served over HTTP."""
