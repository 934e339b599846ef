"""Each security check fails a ``line`` transport with the one defect it is meant to catch."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from outrelay.core.contract.transport import Message, RetryLater, SendResult
from outrelay.core.model.errors import PermanentError, RetryableError
from tests.conformance._broken import assert_fails
from tests.conformance._line import LineTransport, line_target

log = logging.getLogger("tests.conformance.broken")


class NaiveHeaderBlock(LineTransport):
    """Packs headers into one ``k=v; k=v`` string and the broker splits it again: values with ``; `` and ``=``
    turn into headers of their own."""

    def request(self, m: Message) -> dict[str, Any]:
        doc = super().request(m)
        packed = "; ".join(f"{k}={v}" for k, v in doc["h"].items())
        doc["h"] = dict(part.partition("=")[::2] for part in packed.split("; "))
        return doc


class SecretInError(LineTransport):
    """Puts the token in the URL its connection errors name."""

    async def check(self) -> str:
        try:
            return await super().check()
        except RetryableError:
            url = f"line://{self.cfg.token.get_secret_value()}@{self.cfg.host}:{self.cfg.port}"
            raise RetryableError(f"cannot reach {url}") from None


class SecretInLog(LineTransport):
    """Logs its connection settings, token included, at DEBUG."""

    async def open(self) -> None:
        log.debug("connecting to %s:%s with token %s", self.cfg.host, self.cfg.port, self.cfg.token.get_secret_value())
        await super().open()


class ForbiddenIsRetryable(LineTransport):
    """Treats "forbidden" as transient: the relay would retry for ever."""

    @staticmethod
    def classify(answer: str) -> SendResult:
        return RetryLater("forbidden, try later") if answer == "forbidden" else LineTransport.classify(answer)


class VagueCheck(LineTransport):
    """check() fails without saying what to fix."""

    async def check(self) -> str:
        try:
            return await super().check()
        except PermanentError:
            raise PermanentError("error 7") from None


def test_hostile_attributes_catches_header_splitting(tmp_path: Path) -> None:
    assert_fails(line_target(NaiveHeaderBlock), "hostile_attributes", tmp_path, "hostile")


def test_secret_never_leaks_catches_secret_in_error(tmp_path: Path) -> None:
    message = assert_fails(line_target(SecretInError), "secret_never_leaks", tmp_path, "the secret appears in")
    assert "s3cr3t" not in message  # the failure itself masks it


def test_secret_never_leaks_catches_secret_in_log(tmp_path: Path) -> None:
    assert_fails(line_target(SecretInLog), "secret_never_leaks", tmp_path, "the secret appears in a log record")


def test_forbidden_send_permanent_catches_retrying_for_ever(tmp_path: Path) -> None:
    assert_fails(line_target(ForbiddenIsRetryable), "forbidden_send_permanent", tmp_path, "retry for ever")


def test_forbidden_check_says_what_catches_vague_errors(tmp_path: Path) -> None:
    assert_fails(line_target(VagueCheck), "forbidden_check_says_what", tmp_path, "say what to fix")
