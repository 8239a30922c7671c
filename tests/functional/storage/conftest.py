"""A real S3 protocol server on 127.0.0.1 for the object-storage tests: ``moto_server`` as a subprocess (not
moto's in-process mock), with real checkpoints uploaded by boto3. Skipped, with the reason, where the test
extra's ``moto[server]`` or the ``s3`` extra's s3fs is not installed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures import fixture_path

BUCKET = "ckpts"
# small real checkpoints covering DCP (FSDP2), DeepSpeed ZeRO-2 (torch zip files), an HF Trainer FSDP2 run and
# a sharded safetensors model
UPLOADED = ("fsdp2-dcp", "hf-ds-zero2", "hf-fsdp2", "hf-model-sharded")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def moto_server_exe() -> str:
    exe = Path(sys.executable).with_name("moto_server")
    return str(exe) if exe.exists() else (shutil.which("moto_server") or "")


def base_env(endpoint: str) -> dict:
    """This process's environment with dummy keys and ``endpoint``, and no credentials from elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return env | {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


class MotoServer:
    def __init__(self, log: Path, extra_env: dict | None = None):
        exe = moto_server_exe()
        if not exe:
            pytest.skip("moto_server is not installed (pip install 'moto[server]': the test extra)")
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = base_env(self.endpoint)
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(
            [exe, "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=self.env | (extra_env or {}),
        )
        deadline = time.monotonic() + 60
        while True:  # ready when it answers, not after a number of seconds
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"moto_server did not start: see {log}") from None
                time.sleep(0.05)

    def client(self, service: str = "s3", **keys):
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=keys.get("key", "testing"),
            aws_secret_access_key=keys.get("secret", "testing"),
        )

    def upload(self, bucket: str, src: Path, prefix: str) -> None:
        s3 = self.client()
        for f in sorted(Path(src).rglob("*")):
            if f.is_file():
                s3.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(src).as_posix()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """The moto server with the bucket ``ckpts`` holding UPLOADED under their fixture names."""
    pytest.importorskip("s3fs", reason="the s3 extra is not installed (pip install 'ckpt-tui[s3]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (the test extra)")
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto_server.log")
    try:
        server.client().create_bucket(Bucket=BUCKET)
        for name in UPLOADED:
            server.upload(BUCKET, fixture_path(name), name)
        yield server
    finally:
        server.stop()
