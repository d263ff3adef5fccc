"""The request path through the cluster: choosing a replica (`router`, `affinity`, from the
`route_table` the controller publishes) and carrying a generation's deltas back from the replica
actor (`replica`) over Ray or a Unix socket (`socket_stream`)."""
