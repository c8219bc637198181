"""Field slots of api7/ext-plugin-proto ``ext-plugin.fbs`` (v0.6.1), by name.

A FlatBuffers field's slot is its position in the table's declaration; a union takes two: its type
byte, then the reference. Everything that reads or writes a message names its fields from here.
"""

from __future__ import annotations

from enum import IntEnum


class TextEntry(IntEnum):
    NAME = 0
    VALUE = 1


class ErrResp(IntEnum):
    CODE = 0


class PrepareConfReq(IntEnum):
    CONF = 0
    KEY = 1


class PrepareConfResp(IntEnum):
    CONF_TOKEN = 0


class HttpReqCallReq(IntEnum):
    ID = 0
    SRC_IP = 1
    METHOD = 2
    PATH = 3
    ARGS = 4
    HEADERS = 5
    CONF_TOKEN = 6


class HttpReqCallResp(IntEnum):
    ID = 0
    ACTION_TYPE = 1
    ACTION = 2


class Action(IntEnum):
    """The ``Action`` union's types."""

    NONE = 0
    STOP = 1
    REWRITE = 2


class Stop(IntEnum):
    STATUS = 0
    HEADERS = 1
    BODY = 2


class Rewrite(IntEnum):
    PATH = 0
    HEADERS = 1
    ARGS = 2
    RESP_HEADERS = 3
    BODY = 4


class ExtraInfoReq(IntEnum):
    INFO_TYPE = 0
    INFO = 1


class Info(IntEnum):
    """The ``Info`` union's types."""

    NONE = 0
    VAR = 1
    REQ_BODY = 2
    RESP_BODY = 3


class Var(IntEnum):
    NAME = 0


class ExtraInfoResp(IntEnum):
    RESULT = 0


class HttpRespCallReq(IntEnum):
    ID = 0
    STATUS = 1
    HEADERS = 2
    CONF_TOKEN = 3


class HttpRespCallResp(IntEnum):
    ID = 0
    STATUS = 1
    HEADERS = 2
    BODY = 3


# The ``Method`` enum, in declaration order.
METHODS = (
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "MKCOL",
    "COPY",
    "MOVE",
    "OPTIONS",
    "PROPFIND",
    "PROPPATCH",
    "LOCK",
    "UNLOCK",
    "PATCH",
    "TRACE",
)
