"""The layer markers stay honest: conftest's _LayerCheck (an audit hook) fails a `unit` test that opens a
socket or starts a process, and an `io` or `trio` test that starts a process, saying which marker it needs."""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest

from conftest import _LayerCheck


class _Item:
    """The little of a pytest item the check reads: its markers."""

    def __init__(self, *layers: str) -> None:
        self.layers = layers

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.layers else None


def _checked(check: _LayerCheck, *layers: str) -> str | None:
    """What check() says of a test with these markers: None when it passes, else its failure."""
    try:
        check.check(_Item(*layers))  # type: ignore[arg-type]
    except pytest.fail.Exception as failed:
        return str(failed)
    return None


@pytest.mark.io
def test_a_real_socket_fails_a_unit_test_and_names_the_marker() -> None:
    check = _LayerCheck()
    sys.addaudithook(check.audit)  # quiet between checks: seen is None outside start()..check()
    check.start()
    a, b = socket.socketpair()
    a.close()
    b.close()
    failure = _checked(check, "unit")
    assert failure is not None and "opens a socket" in failure and "@pytest.mark.io" in failure
    check.start()
    a, b = socket.socketpair()
    a.close()
    b.close()
    assert _checked(check, "io") is None
    check.start()
    assert _checked(check, "unit") is None  # nothing done, nothing said


@pytest.mark.unit  # by hand: the static derivation reads "subprocess" in its strings; the check proves it spawns none
def test_a_process_fails_every_in_process_layer_but_e2e() -> None:
    check = _LayerCheck()
    for layer in ("unit", "io", "trio", "slow"):
        check.start()
        check.audit("subprocess.Popen", ("/bin/true", ["/bin/true"], None, None))
        failure = _checked(check, layer)
        assert failure is not None and "starts a process" in failure and "@pytest.mark.e2e" in failure, layer
    for layer in ("e2e", "soak"):
        check.start()
        check.audit("os.posix_spawn", ("/bin/true", ["/bin/true"], {}))
        assert _checked(check, layer) is None, layer
    check.start()
    check.audit("subprocess.Popen", ("/sbin/ldconfig", ["/sbin/ldconfig", "-p"], None, None))  # find_library's
    assert _checked(check, "unit") is None
