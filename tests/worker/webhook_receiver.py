"""A webhook receiver on 127.0.0.1 for the tests: a threaded HTTP server that records every
request and answers from a script ("ok", an HTTP status, or "slow": no answer before the
sender's timeout)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body)


class Receiver:
    def __init__(
        self, script: list[Any] | None = None, default: Any = 200, slow: float = 1.0,
        tls: Any = None,
    ):  # fmt: skip
        self.script, self.default, self.slow = list(script or []), default, slow
        self.received: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    receiver.received.append(
                        Received({k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    answer = receiver.script.pop(0) if receiver.script else receiver.default
                if answer == "slow":
                    time.sleep(receiver.slow)
                    answer = 200
                self.send_response(int(answer))
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:  # an https receiver (tls_context_for)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def verify(secret: str, received: Received, tolerance: float = 300) -> Any:
    """An independent Standard Webhooks verification (the spec, not worker.webhooks): the
    parsed body, or AssertionError."""
    h = received.headers
    msg_id, timestamp, signatures = h["webhook-id"], h["webhook-timestamp"], h["webhook-signature"]
    assert abs(time.time() - int(timestamp)) < tolerance
    key = base64.b64decode(secret.split("_", 1)[1])
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + received.body, hashlib.sha256)
    assert any(
        version == "v1" and hmac.compare_digest(base64.b64decode(sig), expected.digest())
        for version, _, sig in (s.partition(",") for s in signatures.split(" "))
    ), "no matching signature"
    return received.json


def tls_context_for(tmp_path: Any, hostname: str) -> tuple[Any, Any]:
    """(server SSLContext with a self-signed certificate for `hostname`, client SSLContext
    trusting only it)."""
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cafile=str(cert_file))
    return server, client
