"""Where eurekamem lives on disk and where its socket is (protocol/PROTOCOL.md §1, "The socket").

The daemon uses these too (daemon/config.py, through the names eurekamem.client exports), so that
both sides agree without talking; this module imports only the standard library, never the daemon.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "ConfigFileError",
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
