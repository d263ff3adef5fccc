"""The control plane: one registry of deployments (a detached Ray actor), the replica life cycle,
autoscaling, and the gateways' cached view of the route table it publishes. Never on a request's
path: gateways route from their cache."""
