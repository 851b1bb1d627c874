"""systemd integration: sd_notify over a real datagram socket, the watchdog, socket activation, units.

The daemon runs as a subprocess with NOTIFY_SOCKET pointing at a datagram socket bound here; every
wait is on a real event (a datagram, a line of log) under trio.fail_after, never a sleep.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from daemon_process import DaemonProcess
from eurekamem.cli.main import main as cli_main
from eurekamem.daemon import systemd as sd


class NotifiedDaemon(DaemonProcess):
    """DaemonProcess with extra environment and, for socket activation, one passed listening socket."""

    def __init__(self, data_dir: Path, socket_path: Path, env: dict[str, str], listen_fd: int | None = None) -> None:
        super().__init__(data_dir, socket_path)
        self.extra_env = env
        self.listen_fd = listen_fd

    def argv(self) -> list[str]:
        argv = super().argv()
        if self.listen_fd is None:
            return argv
        # LISTEN_PID must be the daemon's own pid, unknown before exec: a tiny wrapper sets it, puts
        # the socket on fd 3 (SD_LISTEN_FDS_START) and execs the daemon in its own process.
        wrapper = (
            "import os, sys\n"
            "fd = int(sys.argv[1])\n"
            "if fd != 3:\n"
            "    os.dup2(fd, 3)\n"
            "    os.close(fd)\n"
            "os.set_inheritable(3, True)\n"
            "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1', LISTEN_FDNAMES='eurekamem.socket')\n"
            "os.execv(sys.argv[2], sys.argv[2:])\n"
        )
        return [sys.executable, "-c", wrapper, str(self.listen_fd), *argv]

    def start(self, expect_ready: bool = False) -> NotifiedDaemon:
        env = {k: v for k, v in os.environ.items() if k not in ("EUREKAMEM_SOCKET", "EUREKACLAW_DIR", "NOTIFY_SOCKET")}
        env.update(self.extra_env)
        self.log = []
        pass_fds = () if self.listen_fd is None else (self.listen_fd,)
        self.proc = subprocess.Popen(
            self.argv(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, pass_fds=pass_fds
        )
        import threading

        threading.Thread(target=self._drain, args=(self.proc,), daemon=True).start()
        return self


class NotifyListener:
    """The systemd side of sd_notify: a datagram socket; messages come out as {key: value} dicts."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.messages: list[dict[str, str]] = []

    async def bind(self) -> NotifyListener:
        await self.sock.bind(str(self.path))
        return self

    async def next(self) -> dict[str, str]:
        data = await self.sock.recv(4096)
        message = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.messages.append(message)
        return message

    async def until(self, key: str, value: str | None = None) -> dict[str, str]:
        while True:
            message = await self.next()
            if key in message and (value is None or message[key] == value):
                return message

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
async def notify_socket(sock_dir: Path) -> Any:
    listener = await NotifyListener(sock_dir / "notify").bind()
    yield listener
    listener.close()


async def _ping(path: Path) -> dict[str, Any]:
    conn = await RawConnection.open(path)
    try:
        return await conn.result("sys.ping")
    finally:
        await conn.aclose()


async def _wait_exit(proc: DaemonProcess) -> int:
    return await trio.to_thread.run_sync(proc.wait_exit)


# --- the daemon as systemd sees it -------------------------------------------------------------------


async def test_status_then_ready_then_serving_then_stopping(data_dir: Path, sock_dir: Path, notify_socket: NotifyListener) -> None:
    path = sock_dir / "s.sock"
    proc = NotifiedDaemon(data_dir, path, {"NOTIFY_SOCKET": str(notify_socket.path)}).start()
    try:
        with trio.fail_after(IO_TIMEOUT):
            ready = await notify_socket.until("READY", "1")
            before = notify_socket.messages[:-1]
            assert any(m.get("STATUS", "").startswith("recovering") for m in before), notify_socket.messages
            assert any("EXTEND_TIMEOUT_USEC" in m for m in before), notify_socket.messages
            assert ready["STATUS"].startswith("serving on")
            assert int(ready["MAINPID"]) == proc.proc.pid
            # READY=1 means the listener takes connections already
            assert await _ping(path) == {"pong": True}
            proc.proc.send_signal(signal.SIGTERM)
            stopping = await notify_socket.until("STOPPING", "1")
            assert "stopping" in stopping["STATUS"]
            assert await _wait_exit(proc) == 0
        assert not path.exists()  # our own socket: removed at exit
        assert not any("WATCHDOG" in m for m in notify_socket.messages)  # no WATCHDOG_USEC, no pings
    finally:
        proc.kill()


async def test_watchdog_pings_at_half_the_interval(data_dir: Path, sock_dir: Path, notify_socket: NotifyListener) -> None:
    path = sock_dir / "s.sock"
    env = {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "200000"}  # no WATCHDOG_PID: ours
    proc = NotifiedDaemon(data_dir, path, env).start()
    try:
        with trio.fail_after(IO_TIMEOUT):
            await notify_socket.until("READY", "1")
            first = trio.current_time()
            for _ in range(4):
                await notify_socket.until("WATCHDOG", "1")
            # four pings at ~0.1 s each; generous bound for a loaded machine, still far below 4 timeouts
            assert trio.current_time() - first < 4 * 0.2 + 2.0
            assert await _ping(path) == {"pong": True}
            proc.proc.send_signal(signal.SIGTERM)
            await notify_socket.until("STOPPING", "1")
            assert await _wait_exit(proc) == 0
        assert "watchdog every 0.1 s" in proc.output
    finally:
        proc.kill()


async def test_serves_on_a_passed_socket_and_never_unlinks_it(data_dir: Path, sock_dir: Path, notify_socket: NotifyListener) -> None:
    path = sock_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    proc = NotifiedDaemon(data_dir, path, {"NOTIFY_SOCKET": str(notify_socket.path)}, listen_fd=listener.fileno())
    try:
        proc.start()
        with trio.fail_after(IO_TIMEOUT):
            await notify_socket.until("READY", "1")
            # the path answers: had the daemon tried to bind its own, it would have found a live socket there
            assert await _ping(path) == {"pong": True}
            conn = await RawConnection.open(path)
            stats = await conn.result("sys.stats")
            await conn.aclose()
            assert stats["socket"] == str(path)
            proc.proc.send_signal(signal.SIGTERM)
            await notify_socket.until("STOPPING", "1")
            assert await _wait_exit(proc) == 0
        assert "(socket activation)" in proc.output, proc.output
        assert stat.S_ISSOCK(os.lstat(path).st_mode), "the daemon removed systemd's socket"
        # systemd's socket still listens: the next connection waits there for the next daemon
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(str(path))
        probe.close()
    finally:
        proc.kill()
        listener.close()


async def test_a_passed_tcp_socket_is_refused(data_dir: Path, sock_dir: Path, notify_socket: NotifyListener) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    proc = NotifiedDaemon(data_dir, sock_dir / "s.sock", {"NOTIFY_SOCKET": str(notify_socket.path)}, listen_fd=listener.fileno())
    try:
        proc.start()
        with trio.fail_after(IO_TIMEOUT):
            assert await _wait_exit(proc) == 1
        assert "Unix sockets only" in proc.output, proc.output
        assert not any(m.get("READY") == "1" for m in notify_socket.messages)
    finally:
        proc.kill()
        listener.close()


# --- the pieces, in-process ----------------------------------------------------------------------------


async def test_notify_to_an_abstract_socket() -> None:
    name = f"eurekamem-test-{os.getpid()}-{id(object())}"
    receiver = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await receiver.bind(b"\0" + name.encode())
    try:
        assert sd.notify("READY=1\nSTATUS=hi", {"NOTIFY_SOCKET": "@" + name})
        with trio.fail_after(IO_TIMEOUT):
            assert await receiver.recv(4096) == b"READY=1\nSTATUS=hi"
    finally:
        receiver.close()


def test_notify_without_a_socket_is_a_no_op(sock_dir: Path) -> None:
    assert sd.notify("READY=1", {}) is False
    assert sd.notify("READY=1", {"NOTIFY_SOCKET": str(sock_dir / "nobody-listens")}) is False  # logged, not raised
    manager = sd.ServiceManager({})
    manager.ready("x")
    assert not manager.enabled and manager.sent == [] and manager.watchdog is None


def test_watchdog_interval_reads_usec_and_pid() -> None:
    assert sd.watchdog_interval({}) is None
    assert sd.watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 30.0
    assert sd.watchdog_interval({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid())}) == 0.2
    assert sd.watchdog_interval({"WATCHDOG_USEC": "200000", "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    assert sd.watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert sd.watchdog_interval({"WATCHDOG_USEC": "soon"}) is None


def test_listen_fds_only_for_our_pid_and_unsets_the_variables() -> None:
    env = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1", "LISTEN_FDNAMES": "x", "OTHER": "y"}
    assert sd.listen_fds(env) == []
    assert env == {"OTHER": "y"}
    assert sd.listen_fds({}) == []


class FakeManager(sd.ServiceManager):
    def __init__(self, watchdog: float) -> None:
        super().__init__({})
        self.enabled = True
        self.watchdog = watchdog

    def notify(self, *lines: str) -> None:
        self.sent.append("\n".join(lines))


async def test_no_watchdog_ping_while_an_actor_does_not_answer(autojump_clock: trio.testing.MockClock) -> None:
    manager = FakeManager(watchdog=10.0)
    answers = [[], ["memory"], ["memory"], []]
    timeouts: list[float] = []
    done = trio.Event()

    async def heartbeat(timeout: float) -> list[str]:
        timeouts.append(timeout)
        if len(timeouts) == len(answers):
            done.set()
        return answers[min(len(timeouts), len(answers)) - 1]

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sd.feed_watchdog, manager, heartbeat)
        await done.wait()
        nursery.cancel_scope.cancel()
    assert timeouts == [10.0] * 4
    assert manager.sent == ["WATCHDOG=1", "WATCHDOG=1"]  # the 1st and the 4th round only


async def test_heartbeat_names_a_stuck_actor(data_dir: Path, sock_dir: Path) -> None:
    import threading

    entered, release = threading.Event(), threading.Event()

    def hold(state: Any) -> None:
        entered.set()
        release.wait(IO_TIMEOUT)

    async with running_daemon(data_dir, sock_dir / "s.sock") as daemon:
        with trio.fail_after(IO_TIMEOUT):
            assert await daemon._heartbeat(IO_TIMEOUT) == []
            async with trio.open_nursery() as nursery:
                # tier 4 runs its state in a worker thread; hold it there
                nursery.start_soon(daemon.actors["memory"].run_internal, hold)
                assert await trio.to_thread.run_sync(entered.wait, IO_TIMEOUT)
                assert await daemon._heartbeat(0.2) == ["memory"]
                release.set()
            assert await daemon._heartbeat(IO_TIMEOUT) == []


# --- the unit files and install-service ------------------------------------------------------------


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_install_service_writes_both_units_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    config_home = tmp_path / "config"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cli_main(["install-service", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would write" in out and "[Socket]" in out
    assert not config_home.exists() and not (tmp_path / "home").exists()

    assert cli_main(["install-service"]) == 0
    out = capsys.readouterr().out
    folder = config_home / "systemd" / "user"
    assert _tree(tmp_path) == ["config", "config/systemd", "config/systemd/user",
                               "config/systemd/user/eurekamem.service", "config/systemd/user/eurekamem.socket"]
    for line in ("systemctl --user daemon-reload", "systemctl --user enable --now eurekamem.socket", "loginctl enable-linger $USER"):
        assert line in out
    assert f"wrote {folder / 'eurekamem.service'}" in out
    service = (folder / "eurekamem.service").read_text()
    exec_start = next(line for line in service.splitlines() if line.startswith("ExecStart="))
    command = exec_start.removeprefix("ExecStart=").split()
    assert os.path.isabs(command[0]) and os.access(command[0], os.X_OK), exec_start
    assert command[-1] == "serve"
    assert "Type=notify" in service and "WatchdogSec=30" in service and "NotifyAccess=main" in service
    socket_unit = (folder / "eurekamem.socket").read_text()
    assert "ListenStream=%t/eurekamem/eurekamem.sock" in socket_unit and "SocketMode=0600" in socket_unit

    assert cli_main(["install-service"]) == 0  # again: nothing changes
    assert "unchanged" in capsys.readouterr().out


def test_unit_files_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    folder = tmp_path / "units"
    folder.mkdir()
    for name, text in sd.render_units(sd.exec_start(sd.daemon_argv())).items():
        (folder / name).write_text(text)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    result = subprocess.run(
        [analyze, "verify", "--user", str(folder / "eurekamem.socket"), str(folder / "eurekamem.service")],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_the_units_in_the_source_tree_are_the_rendered_ones() -> None:
    folder = Path(__file__).resolve().parent.parent / "systemd"
    for name, text in sd.render_units().items():
        assert (folder / name).read_text() == text, f"systemd/{name} is stale: regenerate it from render_units()"


def test_exec_start_quotes_what_systemd_would_split() -> None:
    assert sd.exec_start(["/usr/bin/eurekamem", "serve"]) == "/usr/bin/eurekamem serve"
    assert sd.exec_start(["/home/a b/bin/python", "-m", "x%y"]) == '"/home/a b/bin/python" -m x%%y'


def test_unit_dir_respects_xdg_config_home(tmp_path: Path) -> None:
    assert sd.unit_dir({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "systemd" / "user"
    assert sd.unit_dir({"XDG_CONFIG_HOME": "relative"}) == Path.home() / ".config" / "systemd" / "user"
    assert json.dumps(sd.install_commands())  # plain strings
