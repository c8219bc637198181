"""What the gateway keeps between requests: the state the decisions read as snapshots (``state``,
its façade) and the books each outcome closes (breakers, ledger, warm instances, the cluster's
health, cost series, metrics)."""
