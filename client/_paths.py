"""Where eurekamem lives on disk and where its socket is (protocol/PROTOCOL.md §1, "The socket").

The daemon uses these too (daemon/config.py, through the names eurekamem.client exports), so that
both sides agree without talking; this module imports only the standard library, never the daemon,
and tomllib only when a config file is there to read (a client command starts in tens of ms).

Finding a running daemon: a client tries the socket the rules give; when nothing listens there, the
socket the daemon holding the data root wrote into the root's LOCK beside its pid (lock_text, written
at listen and cleared at a clean stop, daemon/paths.py); when neither answers, unreachable() says
which paths were tried and which pid holds the root. One rule for every client: socket_paths().
"""

from __future__ import annotations

import _socket  # the C module: socket.py's import (selectors, enums) would cost a client command milliseconds
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = [
    "LOCK_PARTS",
    "ConfigFileError",
    "connect_unix",
    "find_socket",
    "lock_text",
    "read_lock",
    "recorded_socket",
    "socket_paths",
    "unreachable",
    "data_root",
    "default_config_path",
    "default_socket_path",
    "eurekaclaw_dir",
    "resolve_locations",
    "root_socket_path",
]

SOCKET_NAME = "eurekamem.sock"


def _env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    value = (os.environ if environ is None else environ).get(name)
    return value if value else None  # an empty variable counts as unset


def data_root(data_dir: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Path:
    """The data root: `data_dir` if given (`--data-dir`), else $EUREKACLAW_DIR, else ~/.eurekaclaw."""
    if data_dir is not None and os.fspath(data_dir):
        return Path(data_dir).expanduser()
    env = _env("EUREKACLAW_DIR", environ)
    if env is not None:
        return Path(env).expanduser()
    return Path.home() / ".eurekaclaw"


def default_socket_path(
    data_dir: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> str:
    """The socket path when none is given explicitly (`--socket` / `path=`).

    $EUREKAMEM_SOCKET, else $XDG_RUNTIME_DIR/eurekamem/eurekamem.sock, else
    <data root>/run/eurekamem.sock, where the data root is `data_dir` if given, else
    $EUREKACLAW_DIR, else ~/.eurekaclaw. `data_dir` only matters for the last fallback. A relative
    $XDG_RUNTIME_DIR is ignored, as the XDG base directory spec asks. `environ` defaults to
    os.environ (the daemon passes the environment its configuration was read from).
    """
    env = _env("EUREKAMEM_SOCKET", environ)
    if env is not None:
        return os.path.expanduser(env)
    runtime = _env("XDG_RUNTIME_DIR", environ)
    if runtime is not None and os.path.isabs(runtime):
        return os.path.join(runtime, "eurekamem", SOCKET_NAME)
    return str(data_root(data_dir, environ=environ) / "run" / SOCKET_NAME)


class ConfigFileError(ValueError):
    """The config file named by --config is missing, or a config file cannot be read as TOML."""


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """$XDG_CONFIG_HOME/eurekamem/config.toml (an absolute $XDG_CONFIG_HOME), else ~/.config/eurekamem/config.toml."""
    base = _env("XDG_CONFIG_HOME", environ) or ""
    folder = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return folder / "eurekamem" / "config.toml"


def _file_locations(config: str | os.PathLike[str] | None, environ: Mapping[str, str] | None) -> dict[str, str]:
    """data_dir and socket from the config file (relative paths from the file's folder, `~` expanded)."""
    if config is not None:
        path = Path(config).expanduser()
        if not path.is_file():
            raise ConfigFileError(f"config file {path} (from --config) does not exist")
    else:
        path = default_config_path(environ)
        if not path.is_file():
            return {}
    import tomllib  # here: ~10 ms of a command's start, and most users have no config file

    try:
        doc = tomllib.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigFileError(f"config file {path}: cannot be read as TOML: {exc}") from None
    out = {}
    for key in ("data_dir", "socket"):
        value = doc.get(key)
        if isinstance(value, str) and value:
            p = Path(value).expanduser()
            out[key] = str(p if p.is_absolute() else path.parent / p)
    return out


def resolve_locations(
    socket: str | os.PathLike[str] | None = None,
    data_dir: str | os.PathLike[str] | None = None,
    config: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[Path, str]:
    """(data root, socket path) as `eurekamem serve` picks them, for the commands that only talk to it.

    Each is the flag (`socket`, `data_dir`), else its variable ($EUREKAMEM_SOCKET, $EUREKACLAW_DIR),
    else the config file's key (`config`, else the default file; see default_config_path), else the
    default: ~/.eurekaclaw, and default_socket_path() of that data root. daemon/config.py applies the
    same order to every setting; tests/test_cli.py checks that the two agree. Only the standard
    library, so `eurekamem socket` and `eurekamem call` start in a few tens of milliseconds.
    Raises ConfigFileError for a missing --config file or a file that is not TOML.
    """
    from_file = _file_locations(config, environ)
    if data_dir is not None and os.fspath(data_dir):
        root = Path(data_dir).expanduser()
    elif _env("EUREKACLAW_DIR", environ) is not None:
        root = data_root(None, environ=environ)
    elif "data_dir" in from_file:
        root = Path(from_file["data_dir"])
    else:
        root = Path.home() / ".eurekaclaw"
    if socket is not None and os.fspath(socket):
        path = os.path.expanduser(os.fspath(socket))
    elif _env("EUREKAMEM_SOCKET", environ) is None and "socket" in from_file:
        path = from_file["socket"]
    else:
        path = default_socket_path(root, environ=environ)
    return root, path


def _read_dotenv(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as python-dotenv reads them (what EurekaClaw's pydantic-settings uses):
    `export ` prefixes, single or double quotes, `#` comments after unquoted values."""
    out: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return out
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        name, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if value[:1] in ("'", '"') and value.find(value[0], 1) > 0:
            value = value[1 : value.find(value[0], 1)]  # quoted: what follows the closing quote is a comment
        else:
            hash_at = value.find(" #")
            if hash_at >= 0:
                value = value[:hash_at].rstrip()
        out[name.strip()] = value
    return out


def eurekaclaw_dir(cwd: str | os.PathLike[str] | None = None) -> Path:
    """EurekaClaw's data root as its own settings find it: EUREKACLAW_DIR from the environment, else
    from the `.env` file in the working directory, else ~/.eurekaclaw (names case-insensitive, as
    pydantic-settings matches them; `~` expanded)."""
    for name, value in os.environ.items():
        if name.upper() == "EUREKACLAW_DIR" and value:
            return Path(value).expanduser()
    dotenv = _read_dotenv(Path(cwd if cwd is not None else os.getcwd()) / ".env")
    for name, value in dotenv.items():
        if name.upper() == "EUREKACLAW_DIR" and value:
            return Path(value).expanduser()
    return Path.home() / ".eurekaclaw"


def root_socket_path(root: str | os.PathLike[str]) -> str:
    """The socket a daemon started on demand for `root` listens on: <root>/run/eurekamem.sock."""
    return str(Path(root) / "run" / SOCKET_NAME)


# --- the running daemon's own record: <data root>/memory/journal/LOCK ------------------------------

LOCK_PARTS = ("memory", "journal", "LOCK")  # the file the daemon holds an flock on while it runs
_SOCKET_LINE = "socket "


def lock_file(root: str | os.PathLike[str]) -> Path:
    return Path(root).joinpath(*LOCK_PARTS)


def lock_text(pid: int, socket: str | None = None) -> str:
    """The LOCK's content: the holder's pid on the first line, then the socket it listens on (once
    it listens). The daemon writes it in one write, so a reader sees the old or the new text."""
    return f"{pid}\n" + (f"{_SOCKET_LINE}{socket}\n" if socket else "")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def read_lock(root: str | os.PathLike[str]) -> tuple[int | None, str | None]:
    """(pid, socket) from the root's LOCK: the pid of a live process that wrote it (None when the
    file is missing or empty, as a clean stop leaves it, or that process is gone) and the socket it
    recorded (None when it recorded none, or is gone). A line without its newline is a write in
    progress and is not read."""
    try:
        with open(lock_file(root), "rb") as f:
            text = f.read(8192).decode("utf-8", errors="replace")
    except OSError:
        return None, None
    lines = text.split("\n")[:-1]  # whole lines only
    if not lines or not lines[0].strip().isdigit():
        return None, None
    pid = int(lines[0].strip())
    if pid <= 0 or not _alive(pid):
        return None, None
    socket = next((line[len(_SOCKET_LINE) :] for line in lines[1:] if line.startswith(_SOCKET_LINE)), None)
    return pid, socket or None


def recorded_socket(root: str | os.PathLike[str]) -> str | None:
    """The socket the live daemon holding `root` listens on, as it recorded it; None if none does."""
    return read_lock(root)[1]


def socket_paths(path: str, root: str | os.PathLike[str] | None) -> Iterator[str]:
    """The sockets a client tries, in order: `path` (the rules' answer, or the caller's own), then,
    when a data root is known, the one its daemon recorded, if another. The LOCK is read only when
    the first did not answer (a generator)."""
    yield path
    if root is not None:
        recorded = recorded_socket(root)
        if recorded is not None and recorded != path:
            yield recorded


def find_socket(path: str, root: str | os.PathLike[str] | None, timeout: float = 1.0) -> str:
    """The socket a client reaches (`eurekamem socket` prints it): `path` when something listens
    there or no data root is known, else the one the data root's daemon recorded, if something
    listens there, else `path`. (A probe connects and closes at once.)"""
    if root is None:
        return path
    for candidate in socket_paths(path, root):
        try:
            connect_unix(candidate, timeout).close()
        except OSError:
            continue
        return candidate
    return path


def connect_unix(path: str, timeout: float | None) -> _socket.socket:
    """A blocking socket connected to `path` (the OSError of connect() otherwise): the C module's
    socket object, which has what a blocking client needs (sendall, recv, settimeout, close)."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return sock


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__


def unreachable(tried: list[tuple[str, BaseException]], root: str | os.PathLike[str] | None) -> str:
    """Why no daemon could be reached: every path tried and why, and who holds the data root."""
    first, error = tried[0]
    text = f"cannot connect to eurekamem at {first}: {_reason(error)}"
    if len(tried) > 1:
        text += "; tried " + ", ".join(f"{path} ({_reason(exc)})" for path, exc in tried)
    if root is None:
        return text + " (is the daemon running? `eurekamem serve`)"
    pid, recorded = read_lock(root)
    if pid is None:
        return text + f" (no daemon holds the data root {root}: is the daemon running? `eurekamem serve`)"
    if recorded is None:
        return text + (
            f" (pid {pid} holds the data root {root} and records no socket: a daemon still starting, "
            "or `eurekamem verify`/`repair`/`migrate` at work)"
        )
    if all(path != recorded for path, _exc in tried):
        return text + f" (pid {pid} holds the data root {root} and listens on {recorded})"
    return text + f" (pid {pid} holds the data root {root}: stuck, or stopping?)"
