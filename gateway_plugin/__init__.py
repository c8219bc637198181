"""Spillway's gateway side: an APISIX external plugin runner and the overflow routing plugin."""

from gateway_plugin.plugin import HttpRequest, HttpResponse, Plugin, RequestAction, ResponseAction

__all__ = ["HttpRequest", "HttpResponse", "Plugin", "RequestAction", "ResponseAction"]
