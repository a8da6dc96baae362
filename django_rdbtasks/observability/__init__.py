"""Optional integrations an operator scrapes or traces: Prometheus metrics
(``metrics``, the ``metrics`` extra) and OpenTelemetry spans (``tracing``, the
``tracing`` extra). Neither is imported unless enabled."""
