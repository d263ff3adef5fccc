"""What the gateway tells operators: Prometheus metrics named like vLLM's (`metrics`), the recent
history the web console charts (`metrics_history`), and logs that carry the request id (`logs`)."""
