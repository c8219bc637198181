"""The on-prem cluster as the scrapes find it: its members (listed, discovered by DNS, or read from
Prometheus), their load, capacity and health, as the tracker (``load``) hands them to decisions."""
