"""The S3 payload store (``s3://bucket/prefix``), through boto3 (``pip install 'outrelay[s3]'``).

Credentials come from the SDK's chain (environment, profile, instance or
task role); ``endpoint_url`` points at MinIO, moto or a VPC endpoint. The
bucket must exist: outrelay creates none. For retention at scale prefer the
bucket's lifecycle rules (expire objects under the prefix); ``retention_days``
lists the prefix and deletes what is older, one request per 1,000 keys.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from outrelay.core.model.errors import EventError, MissingExtraError, RetryableError
from outrelay.plugins.claimcheck._reference import KEY_RE
from outrelay.plugins.claimcheck._stores import PayloadStore

__all__ = ["S3Store"]

_GONE = {"NoSuchKey", "404", "NotFound"}


class S3Store(PayloadStore):
    """Objects under ``s3://bucket/prefix`` (see the module docstring)."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, region: str | None = None) -> None:
        bucket, _, prefix = url[len("s3://") :].partition("/")
        self.bucket = bucket
        self.prefix = prefix if not prefix or prefix.endswith("/") else prefix + "/"
        self._endpoint = endpoint_url
        self._region = region
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:  # creating a boto3 client is not thread-safe; using one is
            if self._client is None:
                try:
                    import boto3
                    from botocore.config import Config
                except ImportError:
                    raise MissingExtraError(
                        "claim_check store s3:// needs boto3, which is not installed: pip install 'outrelay[s3]'"
                    ) from None
                config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"})
                self._client = boto3.client("s3", endpoint_url=self._endpoint, region_name=self._region, config=config)
            return self._client

    def location(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def _key(self, location: str) -> str | None:
        head = f"s3://{self.bucket}/{self.prefix}"
        if not location.startswith(head):
            return None
        key = location[len(head) :]
        return key if KEY_RE.match(key) else None

    def owns(self, location: str) -> bool:
        return self._key(location) is not None

    def put(self, key: str, data: bytes) -> None:
        s3 = self._s3()
        name = self.prefix + key
        try:
            try:
                s3.head_object(Bucket=self.bucket, Key=name)
                return  # stored by an earlier attempt or another destination
            except Exception as exc:
                if _code(exc) not in _GONE:
                    raise
            s3.put_object(Bucket=self.bucket, Key=name, Body=data, ContentType="application/octet-stream")
        except Exception as exc:
            raise RetryableError(
                f"cannot store a payload in s3://{self.bucket}/{self.prefix}: {_describe(exc)}"
            ) from None

    def get(self, location: str) -> bytes:
        key = self._key(location)
        if key is None:
            raise EventError(f"claim-check reference {location!r} is not a payload of s3://{self.bucket}/{self.prefix}")
        s3 = self._s3()
        try:
            body: bytes = s3.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        except Exception as exc:
            if _code(exc) in _GONE:
                raise EventError(f"claim-check payload {location} is gone (removed by retention?)") from None
            raise RetryableError(f"cannot read claim-check payload {location}: {_describe(exc)}") from None
        return body

    def prune(self, older_than: float) -> int:
        s3 = self._s3()
        removed = 0
        try:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                old = [
                    {"Key": o["Key"]}
                    for o in page.get("Contents", [])
                    if KEY_RE.match(o["Key"][len(self.prefix) :]) and _seconds(o["LastModified"]) < older_than
                ]
                if old:  # a page holds at most 1,000 keys: one delete request
                    s3.delete_objects(Bucket=self.bucket, Delete={"Objects": old, "Quiet": True})
                    removed += len(old)
        except Exception as exc:
            raise RetryableError(
                f"cannot prune payloads in s3://{self.bucket}/{self.prefix}: {_describe(exc)}"
            ) from None
        return removed

    def __repr__(self) -> str:
        return f"<S3Store s3://{self.bucket}/{self.prefix}>"


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(((response or {}).get("Error") or {}).get("Code", "")) if isinstance(response, dict) else ""


def _describe(exc: BaseException) -> str:
    """One line from a botocore error (its code and message; never the request's credentials)."""
    code = _code(exc)
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{code}: {text}" if code and code not in text else text


def _seconds(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)
