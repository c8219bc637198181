"""Local stand-ins for the Lambda Invoke and FC InvokeFunction APIs (and their provisioned-concurrency
APIs), which cannot run here.

They verify the real request signatures (SigV4 with botocore's own signer; FC's
``Authorization: FC id:signature`` by the documented formula) and hand the event to a real
function instance's ``/invoke`` endpoint, so the answer is the real function's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
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


LAMBDA_PROVISIONED = "/2019-09-30/functions/"
DENIED = "User: arn:aws:iam::123456789012:user/warmup is not authorized to perform this action"


@dataclass
class ProvisioningFake:
    """Lambda's and FC's provisioned-concurrency APIs: every call as sent, and the counts set."""

    url: str = ""
    refuse: bool = False
    allocate: bool = True
    calls: list[tuple[str, str, bytes]] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    requested: dict[str, int] = field(default_factory=dict)

    def sent(self, method: str) -> list[tuple[str, bytes]]:
        return [(path, body) for m, path, body in self.calls if m == method]


def _lambda_config(fake: ProvisioningFake, key: str) -> dict[str, object]:
    n = fake.requested[key]
    return {
        "RequestedProvisionedConcurrentExecutions": n,
        "AllocatedProvisionedConcurrentExecutions": n if fake.allocate else 0,
        "AvailableProvisionedConcurrentExecutions": n if fake.allocate else 0,
        "Status": "READY" if fake.allocate else "IN_PROGRESS",
        "LastModified": "2024-05-01T00:00:00+0000",
    }


@contextmanager
def provisioning_fake() -> Iterator[ProvisioningFake]:
    """Answers as the platforms do, after checking each call's real signature (SigV4 for Lambda,
    ``FC id:signature`` for FC); ``refuse`` answers 403 as to a caller without the permission."""
    fake = ProvisioningFake()

    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def _any(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            fake.calls.append((self.command, self.path, body))
            is_lambda = self.path.startswith(LAMBDA_PROVISIONED)
            if not (_sigv4_ok(self, body) if is_lambda else _fc_ok(self)):
                fake.invalid.append(self.path)
                return self._error(is_lambda, 403, "InvalidSignatureException", "signature mismatch")
            if fake.refuse:
                return self._error(is_lambda, 403, "AccessDeniedException", DENIED)
            key = self.path
            if is_lambda:
                return self._lambda(key, body)
            if self.command == "PUT":
                fake.requested[key] = json.loads(body)["target"]
            n = fake.requested.get(key, 0)
            current = n if fake.allocate else 0
            return self._json(200, {"resource": "1#s#live#f", "target": n, "current": current})

        def _lambda(self, key: str, body: bytes) -> None:
            if self.command == "DELETE":
                fake.requested.pop(key, None)
                return self._json(204, None)
            if self.command == "PUT":
                fake.requested[key] = json.loads(body)["ProvisionedConcurrentExecutions"]
                return self._json(202, _lambda_config(fake, key))
            if key not in fake.requested:
                return self._error(True, 404, "ProvisionedConcurrencyConfigNotFoundException", "No config")
            return self._json(200, _lambda_config(fake, key))

        def _error(self, is_lambda: bool, status: int, code: str, message: str) -> None:
            header = ("x-amzn-ErrorType", code) if is_lambda else ("X-Fc-Error-Type", "ClientError")
            self._json(status, {"Type": "User", "message": message, "ErrorCode": code}, header)

        def _json(self, status: int, data: object, header: tuple[str, str] | None = None) -> None:
            payload = b"" if data is None else json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            if header is not None:
                self.send_header(*header)
            self.end_headers()
            self.wfile.write(payload)

        do_PUT = do_GET = do_DELETE = _any

    with http_server_thread(Handler) as url:
        fake.url = url
        yield fake
