"""``headers``: a small example plugin that sets or deletes request and response headers.

Route conf: ``{"set": {"x-team": "search"}, "delete": ["cookie"], "response": {"x-served-by": "spillway"}}``.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gateway_plugin.plugin import HttpRequest, Plugin, RequestAction


class HeadersConf(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    set: dict[str, str] = Field(default_factory=dict, description="request headers to set")
    delete: list[str] = Field(default_factory=list, description="request headers to remove")
    response: dict[str, str] = Field(default_factory=dict, description="headers added to the client's answer")


class HeadersPlugin(Plugin[HeadersConf]):
    name = "headers"
    config_model = HeadersConf

    async def request_filter(self, conf: HeadersConf, request: HttpRequest, action: RequestAction) -> None:
        for name, value in conf.set.items():
            action.set_header(name, value)
        for name in conf.delete:
            action.delete_header(name)
        for name, value in conf.response.items():
            action.add_response_header(name, value)
