"""Scheduled warm-up: keep as many function instances warm as the expected overflow needs, and prove it."""
