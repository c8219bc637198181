"""Spillway's cloud function: a Triton sidecar behind a KServe v2 handler.

Import-light on purpose: the gateway and the warm-up pinger import the wire contract from here.
"""

__version__ = "0.1.0"
