"""A real S3 protocol server for tests: moto's server mode on 127.0.0.1, on a free port."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass

BUCKET = "nczbucket"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class S3Server:
    """A running moto server with one bucket; ``url(root)`` names a dataset in it."""

    endpoint: str
    server: object

    def url(self, root: str | None = None, mode: str = "nczarr,s3", bucket: str = BUCKET) -> str:
        return f"{self.endpoint}/{bucket}/{root or uuid.uuid4().hex}#mode={mode}"

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")

    def stop(self) -> None:
        self.server.stop()


def start_server() -> S3Server:
    """Start moto (credentials go in the environment, as S3 users set them) and create the bucket."""
    from moto.server import ThreadedMotoServer

    os.environ.update(CREDENTIALS)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    running = S3Server(f"http://127.0.0.1:{port}", server)
    running.client().create_bucket(Bucket=BUCKET)
    return running
