"""Several gateways as one: the leases and rounds that keep budgets, caps and breakers across nodes
(``view``), kept in step with Redis by the edge (``gateway_plugin.shared_sync``, ``shared_store``)."""
