"""APISIX's ext-plugin wire protocol (internal): framing, one FlatBuffers reader and writer
(``flat``), the schema's field slots by name (``schema``), message views and encoders.

Schema: api7/ext-plugin-proto ``ext-plugin.fbs`` v0.6.1. The generated ``a6pluginprotos`` code is
used only by the tests, to check that what is read and written here is what the schema means.
"""
