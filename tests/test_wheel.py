"""`pip install .` as a user does it: a wheel built from the source tree holds every package, and
every module of it imports from the installed wheel (not from the source tree).

The wheel is built from a copy of the tracked files (so the tree gets no build/ or egg-info) and
installed without dependencies into a fresh venv that borrows this venv's installed dependencies
through a path file (so no download is needed and no editable finder is in the way).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _pyproject() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _folder_of(package: str, package_dir: dict[str, str]) -> Path:
    """The source folder setuptools maps `package` to (the longest package-dir prefix)."""
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in package_dir:
            return REPO / package_dir[head] / Path(*parts[cut:])
    return REPO / Path(*parts)


def test_every_package_folder_is_listed_in_pyproject() -> None:
    """A subpackage added without listing it under [tool.setuptools] packages would be left out of
    the wheel (and of `pip install .`), though it imports fine from the source tree."""
    setup = _pyproject()["tool"]["setuptools"]
    listed = set(setup["packages"])
    for package in listed:
        assert (_folder_of(package, setup["package-dir"]) / "__init__.py").is_file(), package
    for top, folder in setup["package-dir"].items():
        # a subpackage is a folder whose __init__.py chain reaches the top one (tests/ has none, so
        # the stand-in packages under it are not part of eurekamem)
        pending = [(REPO / folder, top)]
        while pending:
            here, name = pending.pop()
            assert name in listed, f"{here} is a package but pyproject.toml does not list {name}"
            for child in sorted(here.iterdir()):
                if child.is_dir() and (child / "__init__.py").is_file():
                    pending.append((child, f"{name}.{child.name}"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    listing = subprocess.run(  # tracked files, and new ones not ignored (a change not committed yet)
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO, capture_output=True, check=True,
    ).stdout.decode()
    for name in filter(None, listing.split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(work / "dist"), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert "project.license" not in built.stdout + built.stderr  # the SPDX string: no deprecation warning
    (found,) = (work / "dist").glob("eurekamem-*.whl")
    yield found


def test_the_wheel_holds_every_listed_package_and_its_data(wheel: Path) -> None:
    setup = _pyproject()["tool"]["setuptools"]
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in setup["packages"]:
        folder = _folder_of(package, setup["package-dir"])
        path = package.replace(".", "/")
        assert f"{path}/__init__.py" in names, package
        for module in folder.glob("*.py"):
            assert f"{path}/{module.name}" in names, f"{path}/{module.name}"
    for package, files in setup.get("package-data", {}).items():
        for name in files:  # a file, or a glob of them (eurekamem.ui's templates/*.html)
            pattern = f"{package.replace('.', '/')}/{name}"
            assert fnmatch.filter(names, pattern), pattern
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(metadata).decode()
    assert "License-Expression: MIT" in text
    import eurekamem

    assert f"Version: {eurekamem.__version__}" in text


def test_every_module_imports_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True,
    ).stdout.strip())
    # this venv's dependencies, as a plain path (a path file's entries are not site dirs: the
    # editable install's finder in there is not loaded)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )
    if installed.returncode != 0 and "no such option: --python" in installed.stderr:  # pip < 22.3
        pytest.skip("this pip cannot install into another environment (--python)")
    assert installed.returncode == 0, installed.stderr[-3000:]
    check = """
import importlib, pkgutil, sys
import eurekamem
root = eurekamem.__path__[0]
assert root.startswith(sys.prefix), root
names = ["eurekamem"]
for info in pkgutil.walk_packages(eurekamem.__path__, "eurekamem."):
    if not info.name.endswith(".__main__"):  # `python -m` entry points run when imported
        names.append(info.name)
for name in names:
    module = importlib.import_module(name)
    assert module.__file__.startswith(sys.prefix), (name, module.__file__)
from importlib.resources import files
assert "## 1. The socket" in files("eurekamem.protocol").joinpath("PROTOCOL.md").read_text()
print(len(names))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(python), "-c", check], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.strip()) >= 40  # every module of every package
    version = subprocess.run([str(venv / "bin" / "eurekamem"), "--version"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert version.returncode == 0 and version.stdout.startswith("eurekamem "), version.stderr
    assert str(venv) in version.stdout  # the command of that environment
