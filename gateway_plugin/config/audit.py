"""``audit:``: the audit trail of every decision, written by one of APISIX's own loggers."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from gateway_plugin.config.model import Model

# What each logger needs besides the log format (its own schema checks the rest when APISIX loads
# the route).
# http-logger is not among them: on the ext-plugin route it carries outcomes to the runner.
_REQUIRED = {
    "file-logger": "path",
    "kafka-logger": "brokers",
    "tcp-logger": "host",
    "elasticsearch-logger": "endpoint_addrs",
}


class AuditSettings(Model):
    """Which APISIX logger the routes carry for the audit trail, and its own settings; the log
    format is Spillway's (``request.audit.log_format``), the rest (where lines go, how they are
    batched, kept and rotated) is the logger's and the log system's."""

    logger: Literal["file-logger", "kafka-logger", "tcp-logger", "elasticsearch-logger"] | None = Field(
        default=None, description="null: no audit trail on the routes"
    )
    conf: dict[str, Any] = Field(
        default_factory=dict,
        description="the logger's settings as APISIX takes them (file-logger: path; kafka-logger: brokers, "
        "kafka_topic; tcp-logger: host, port; elasticsearch-logger: endpoint_addrs, field), without "
        "log_format",
    )

    @model_validator(mode="after")
    def _complete(self) -> AuditSettings:
        if "log_format" in self.conf:
            raise ValueError("audit.conf.log_format: the audit trail's format is Spillway's own; remove it")
        if self.logger is not None and _REQUIRED[self.logger] not in self.conf:
            raise ValueError(f"audit.conf needs {_REQUIRED[self.logger]!r} for {self.logger}")
        return self
