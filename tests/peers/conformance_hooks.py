"""Helpers for wiring the conformance kit's v2 hooks to the real test peers.

:func:`skip_fault_checks` states *why* a target declares no ``upstream`` /
``make_transport_via`` (the fault proxy cannot stay between client and
broker), instead of the kit's generic "the target declares no upstream".
:data:`VIA_TIMEOUT` bounds the fault checks' waits.
:func:`long_secret` makes a password long and random enough that the
``secret_never_leaks`` grep cannot match by accident; :func:`rabbitmq_users`
creates (and removes) RabbitMQ users with such a password.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
from collections.abc import Iterator, Mapping

import pytest

__all__ = ["VIA_TIMEOUT", "long_secret", "rabbitmq_users", "skip_checks", "skip_fault_checks"]

#: Seconds the transports the fault checks build through the suite's proxy (``make_transport_via``) wait
#: for a broker's answer (ack, confirm, reply, read). Every stalled or black-holed call costs a fault check
#: this long, and a loopback broker answers in milliseconds: 3-5 s made each such check take 3-6 s.
VIA_TIMEOUT = 1.5


def skip_fault_checks(request: pytest.FixtureRequest, reason: str) -> None:
    """Skip the current test with ``reason`` when it is one of the suite's ``test_fault_*`` checks.

    Call it from an autouse fixture of a ``ConformanceSuite`` subclass. It is a skip by declared
    limitation (not a missing service), so ``OUTRELAY_REQUIRE_SERVICES=1`` does not turn it into a failure.
    """
    name = getattr(request.node, "originalname", request.node.name)
    if name.startswith("test_fault_"):
        pytest.skip(f"fault proxy not applicable: {reason}")


def skip_checks(request: pytest.FixtureRequest, reasons: Mapping[str, str]) -> None:
    """Skip the current test when it runs one of the checks named in ``reasons`` (check name -> why).

    For hooks a peer cannot support (``secret``, ``make_forbidden``...): the report then says what the
    peer lacks instead of the kit's generic "the target declares no <hook>". Call it from an autouse
    fixture of a ``ConformanceSuite`` subclass; like :func:`skip_fault_checks` it is a skip by declared
    limitation, which ``OUTRELAY_REQUIRE_SERVICES=1`` leaves a skip.
    """
    name = getattr(request.node, "originalname", request.node.name)
    reason = reasons.get(name.removeprefix("test_"))
    if reason is not None:
        pytest.skip(reason)


def long_secret(prefix: str = "orsecret") -> str:
    """A 40+ character random password (letters and digits only: safe in URLs and config files)."""
    return f"{prefix}{secrets.token_hex(20)}"


def _erl(s: str) -> str:
    """An Erlang binary literal of ``s`` (letters, digits and ``./*^$_-`` only: nothing to escape)."""
    if not re.fullmatch(r"[A-Za-z0-9./*^$_-]*", s):
        raise ValueError(f"{s!r} is not safe inside an Erlang binary literal here")
    return f'<<"{s}">>'


def rabbitmq_users(password: str, users: Mapping[str, str | tuple[str, str, str]]) -> Iterator[str | None]:
    """Create RabbitMQ users on the local broker (``rabbitmqctl eval``: one call, ~1 s), each with ``password``
    and on vhost ``/`` the configure/write/read permission regex given — one for all three, or a
    ``(configure, write, read)`` triple (``""``: none) — and delete them when the generator resumes. Yields
    ``None`` when they exist, else why not (no local ``rabbitmqctl``, an external broker...): the caller then
    leaves out the hooks that need them, and those checks skip."""
    ctl = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"
    acting = _erl("outrelay-tests")

    def run(code: str) -> str | None:
        try:
            done = subprocess.run([ctl, "eval", code], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{ctl}: {exc}"
        out = (done.stdout + done.stderr).replace(password, "***")  # never echo the secret
        return None if done.returncode == 0 and "error" not in out.lower() else out.strip()[:300]

    perms = {u: (p, p, p) if isinstance(p, str) else p for u, p in users.items()}
    create = ", ".join(
        f"ok = rabbit_auth_backend_internal:add_user({_erl(u)}, {_erl(password)}, {acting}), "
        f"ok = rabbit_auth_backend_internal:set_permissions({_erl(u)}, {_erl('/')}, "
        f"{_erl(conf)}, {_erl(write)}, {_erl(read)}, {acting})"
        for u, (conf, write, read) in perms.items()
    )
    problem = run(create + ".")
    if problem is not None:
        yield f"cannot create the test users with {ctl}: {problem}"
        return
    try:
        yield None
    finally:
        run(", ".join(f"rabbit_auth_backend_internal:delete_user({_erl(u)}, {acting})" for u in users) + ".")
