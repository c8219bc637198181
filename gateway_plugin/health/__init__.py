"""Whether the targets and the cluster answer: a breaker per cloud target (``breakers``) and the
cluster's own, per model (``local_health``), fed by outcomes and read through snapshots."""
