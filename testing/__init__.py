"""The real-process harness the tests and the benchmarks share (development only, not shipped).

What the tests stand Spillway among, each module a kind of thing: a real APISIX for a config and
routes (``apisix``) and the stand-ins it fronts (``standins``: upstreams that say who they are, a
Triton metrics feed); real tritonservers replaced one at a time (``tritons``); the cloud function as
processes (``function``) and the cloud APIs' stand-ins (``cloud_apis``, ``secrets_manager``); a
real dnsmasq (``dns``), redis-server (``redis``), images (``images``); the runner in-process
(``runner``) or as the development gateway (``gateway``); loopback HTTP and TLS (``http``,
``tls``); the Terraform reader (``terraform``); where the checkout's files are (``paths``).

``tests/conftest.py`` offers the fixtures built on it; ``bench/`` imports it too. Nothing here
imports ``tests``.
"""
