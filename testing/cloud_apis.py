"""Local stand-ins for the Lambda Invoke and FC InvokeFunction APIs, which cannot run here.

They verify the real request signatures (SigV4 with botocore's own signer; FC's
``Authorization: FC id:signature`` by the documented formula) and hand the event to a real
function instance's ``/invoke`` endpoint, so the answer is the real function's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from testing.http import QuietHandler, http_server_thread

AWS_KEY, AWS_SECRET, REGION = "AKIDSPILLWAYTEST", "aws-secret-for-tests", "us-east-1"
FC_KEY, FC_SECRET = "LTAIspillwaytest", "fc-secret-for-tests"


@dataclass
class CloudFake:
    function_url: str
    mode: str = "healthy"
    valid: int = 0
    invalid: list[str] = field(default_factory=list)
    calls: int = 0
    url: str = ""
    paths: list[str] = field(default_factory=list)


def _sigv4_ok(handler: BaseHTTPRequestHandler, body: bytes) -> bool:
    """AWS's check: the canonical request over exactly the headers the client says it signed (as
    AWS does; botocore itself never signs User-Agent, other signers do), key derivation and
    signature by botocore's own signer."""
    auth = handler.headers.get("Authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return False
    parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 ") :].split(","))
    signed = parts["SignedHeaders"].split(";")
    lower = {k.lower(): v for k, v in handler.headers.items()}
    if any(name not in lower for name in signed):
        return False
    path, _, query = handler.path.partition("?")
    canonical = "\n".join(
        [
            handler.command,
            path,
            "&".join(sorted(query.split("&"))) if query else "",
            "".join(f"{name}:{' '.join(lower[name].split())}\n" for name in signed),
            ";".join(signed),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    request = AWSRequest(method=handler.command, url=f"http://{lower['host']}{handler.path}", data=body)
    request.context["timestamp"] = lower["x-amz-date"]
    signer = SigV4Auth(Credentials(AWS_KEY, AWS_SECRET), "lambda", REGION)
    scope = parts["Credential"].split("/", 1)[1]
    string_to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", lower["x-amz-date"], scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    return hmac.compare_digest(signer.signature(string_to_sign, request), parts["Signature"])


def _fc_ok(handler: BaseHTTPRequestHandler) -> bool:
    lower = {k.lower(): v for k, v in handler.headers.items()}
    canonical = "".join(f"{k}:{lower[k]}\n" for k in sorted(k for k in lower if k.startswith("x-fc-")))
    path = handler.path.split("?")[0]
    to_sign = "\n".join(
        [
            handler.command,
            lower.get("content-md5", ""),
            lower.get("content-type", ""),
            lower.get("date", ""),
            canonical + path,
        ]
    )
    digest = base64.b64encode(
        hmac.new(FC_SECRET.encode(), to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    return hmac.compare_digest(lower.get("authorization", ""), f"FC {FC_KEY}:{digest}")


@contextmanager
def cloud_fake(function_url: str) -> Iterator[CloudFake]:
    fake = CloudFake(function_url)

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            fake.calls += 1
            is_lambda = self.path.startswith("/2015-03-31/functions/")
            ok = _sigv4_ok(self, body) if is_lambda else _fc_ok(self)
            if not ok:
                fake.invalid.append(self.path)
                return self._send(403, b'{"message": "signature mismatch"}')
            fake.valid += 1
            if fake.mode == "broken":
                return self._send(500, b'{"message": "internal failure"}')
            if fake.mode == "hanging":
                time.sleep(3)
            request = urllib.request.Request(fake.function_url + "/invoke", data=body, method="POST")
            with urllib.request.urlopen(request, timeout=30) as answer:
                self._send(200, answer.read())

        def _send(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if status >= 400 and not self.path.startswith("/2015"):
                self.send_header("X-Fc-Error-Type", "ServiceError")
            self.end_headers()
            self.wfile.write(payload)

    with http_server_thread(Handler) as url:
        fake.url = url
        yield fake


@contextmanager
def function_url_fake(function_url: str) -> Iterator[CloudFake]:
    """A Lambda function URL with AWS_IAM auth: checks the SigV4 signature (service lambda), then
    hands the HTTP request, path and all, to a real function instance."""
    fake = CloudFake(function_url)

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            fake.calls += 1
            if not _sigv4_ok(self, body):
                fake.invalid.append(self.path)
                return self._send(403, b'{"message": "Forbidden"}', "application/json")
            fake.valid += 1
            fake.paths.append(self.path)
            request = urllib.request.Request(
                fake.function_url + self.path,
                data=body,
                method="POST",
                headers={"content-type": self.headers.get("content-type", "application/json")},
            )
            with urllib.request.urlopen(request, timeout=30) as answer:
                self._send(answer.status, answer.read(), answer.headers.get("content-type", ""))

        def _send(self, status: int, payload: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    with http_server_thread(Handler) as url:
        fake.url = url
        yield fake
