"""APISIX's ext-plugin wire protocol (internal): framing, message views and encoders.

Schema: api7/ext-plugin-proto ``ext-plugin.fbs``. Generated readers come from ``a6pluginprotos``;
the tables it lacks (HTTPRespCall, ExtraInfo.RespBody, Rewrite's ``resp_headers`` and ``body``)
are read and written here by field slot, in the schema's order.
"""
