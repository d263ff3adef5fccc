"""The Ray side: the replica actor that hosts an engine (`replica`), the per-model router
(`router`), the controller actor and its deployments (`controller`, `deployment`), what the
controller tells gateways (`route_table`), and the gateway's handle on the controller
(`controller_client`). Never imports an engine library."""
