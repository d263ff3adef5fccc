"""The Ray side, in four rooms. Never imports an engine library.

- `control/`: the control plane: the controller actor and its deployments, autoscaling decisions,
  restart budgets, Xinference registrations, and the gateway's cached view of it all.
- `routing/`: the request path: the per-model router, prefix affinity, the route table it reads,
  the replica actor that hosts an engine, and the Unix-socket stream between the two.
- `stores/`: what is persisted: the registry file and the stored-responses database and actor.
- `runtime/`: Ray plumbing: joining or starting Ray, the embedded cluster, placement, and Ray's
  errors as the typed error tree.
"""
