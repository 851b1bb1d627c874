"""EurekaClaw on eurekamem: one call (`install()`) routes EurekaClaw's MemoryManager, its post-run
learning (SessionMemoryExtractor) and its SkillRegistry / SkillInjector to the daemon, and has its
prompts carry what earlier sessions learned (METHODS), without a line of EurekaClaw's code changed.

    from eurekamem.integrations import eurekaclaw
    eurekaclaw.install()          # before or after EurekaClaw is imported

or, with nothing edited: `python -m eurekamem.integrations.eurekaclaw prove "..." --domain "..."` (EurekaClaw's own
command, routed), or EUREKAMEM_EUREKACLAW=1 once the README's sitecustomize line is in place.

Rules kept here:
- Names are patched where EurekaClaw looks them up: the module attribute of the class's own module
  (eurekaclaw.memory.manager.MemoryManager, ...) and every attribute of an already imported
  `eurekaclaw.*` module bound to the original class (`from ... import MemoryManager` made copies:
  eurekaclaw.memory, eurekaclaw.orchestrator.meta_orchestrator, ...). A module imported later
  copies the patched name. Nothing of EurekaClaw is imported by install(): a defining module not
  imported yet is patched right after it is (a post-import hook on sys.meta_path, for those module
  names only), so EurekaClaw's import cost and order stay its own.
- A class EurekaClaw subclasses or keeps by identity (BaseAgent, its theory loop's LemmaDeveloper
  and Prover) is not replaced: the few methods in METHODS are set on the class itself, each a
  routed function that calls the original (kept to put back).
- install() twice is install() once; uninstall() puts every original back (in every module that
  holds a routed class, on every class that holds a routed method) and removes the hook. The
  routed classes subclass the originals, so annotations and isinstance checks in EurekaClaw's code
  still hold.
- Importing this package imports only the standard library; the client comes with install().
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from . import _options
from ._options import Options

__all__ = ["ENV", "METHODS", "TARGETS", "install", "install_from_env", "installed", "uninstall"]

log = logging.getLogger("eurekamem.integrations.eurekaclaw")

ENV = "EUREKAMEM_EUREKACLAW"
_ON = ("1", "true", "yes", "on")

# module -> class name: what is routed (see _routed.py for what each replacement does)
TARGETS: dict[str, str] = {
    "eurekaclaw.memory.manager": "MemoryManager",
    "eurekaclaw.skills.registry": "SkillRegistry",
    "eurekaclaw.skills.injector": "SkillInjector",
    "eurekaclaw.learning.memory_extractor": "SessionMemoryExtractor",
}

# module -> (class name, method names): methods routed in place (see _routed.py's routed_method)
METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "eurekaclaw.agents.base": ("BaseAgent", ("build_system_prompt",)),
    "eurekaclaw.agents.theory.inner_loop_yaml": ("LemmaDeveloper", ("run_iterative",)),
    "eurekaclaw.agents.theory.prover": ("Prover", ("attempt",)),
}
_HOOKED = frozenset(TARGETS) | frozenset(METHODS)


class _State:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.installed = False
        self.finder: _PatchOnImport | None = None
        self.routed: dict[type, type] = {}  # original class -> its routed subclass (made once)
        self.methods: dict[tuple[type, str], Any] = {}  # (class, method name) -> EurekaClaw's own function


_state = _State()


def installed() -> bool:
    """Is the routing installed?"""
    return _state.installed


def options() -> Options:
    return _options.current()


def install(
    *, socket_path: str | os.PathLike[str] | None = None, timeout: float | None = None, autostart: bool | None = None
) -> None:
    """Route EurekaClaw's MemoryManager, SessionMemoryExtractor, SkillRegistry and SkillInjector to
    the daemon, and its METHODS: those already imported now, the others as they are imported. Idempotent (a second
    call changes nothing, options included); EurekaClaw need not be importable yet."""
    with _state.lock:
        if _state.installed:
            return
        _options.use(Options(
            socket_path=os.fspath(socket_path) if socket_path is not None else None, timeout=timeout, autostart=autostart
        ))
        _state.finder = _PatchOnImport()
        sys.meta_path.insert(0, _state.finder)
        _state.installed = True
        for name in _HOOKED:
            module = sys.modules.get(name)
            if module is not None:
                _patch(name, module)
    log.info("EurekaClaw routed to eurekamem")


def uninstall() -> None:
    """Undo install(): every module attribute holding a routed class holds the original again, the
    import hook is gone, and the daemon links are closed. A no-op when not installed."""
    from . import _routed

    with _state.lock:
        if not _state.installed:
            return
        if _state.finder in sys.meta_path:
            sys.meta_path.remove(_state.finder)
        _state.finder = None
        _state.installed = False
        back = {routed: original for original, routed in _state.routed.items()}
        for module in _eurekaclaw_modules():
            for attr, value in list(vars(module).items()):
                if isinstance(value, type) and value in back:
                    setattr(module, attr, back[value])
        for (cls, method), function in _state.methods.items():
            setattr(cls, method, function)
        _state.methods.clear()
        _routed.close_links()


def install_from_env(environ: dict[str, str] | None = None) -> bool:
    """install() if $EUREKAMEM_EUREKACLAW is 1 (or true, yes, on); whether it did. The README's
    sitecustomize line calls this: without the variable it costs one lookup."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    if value.strip().lower() not in _ON:
        return False
    install()
    return True


# --- patching ---------------------------------------------------------------------------------


def _eurekaclaw_modules() -> list[ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if (name == "eurekaclaw" or name.startswith("eurekaclaw.")) and isinstance(module, ModuleType)
    ]


def _patch(module_name: str, module: ModuleType) -> None:
    """Route what `module` holds: its METHODS in place, its TARGETS class by the routed subclass."""
    if module_name in METHODS:
        _patch_methods(module_name, module)
    if module_name in TARGETS:
        _patch_class(module_name, module)


def _patch_methods(module_name: str, module: ModuleType) -> None:
    """Set each routed method of METHODS on the module's class, the original kept for uninstall()."""
    from . import _routed

    class_name, methods = METHODS[module_name]
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        log.error("%s has no class %s: not routed (an EurekaClaw version this integration does not know)",
                  module_name, class_name)
        return
    for method in methods:
        own = vars(cls).get(method)
        if not callable(own):
            log.error("%s.%s has no method %s: not routed (an EurekaClaw version this integration does not know)",
                      module_name, class_name, method)
            continue
        if (cls, method) in _state.methods:
            continue  # already routed
        _state.methods[(cls, method)] = own
        setattr(cls, method, _routed.routed_method(class_name, method, own))


def _patch_class(module_name: str, module: ModuleType) -> None:
    """Replace the target class of `module` by its routed subclass, there and wherever an imported
    eurekaclaw module bound the original."""
    from . import _routed

    class_name = TARGETS[module_name]
    original = getattr(module, class_name, None)
    if not isinstance(original, type):
        log.error("%s has no class %s: not routed (an EurekaClaw version this integration does not know)",
                  module_name, class_name)
        return
    if original in _state.routed.values():
        return  # already the routed class
    routed = _state.routed.get(original)
    if routed is None:
        routed = _routed.make(class_name, original)
        _state.routed[original] = routed
        unrouted = _routed.unrouted_methods(original, routed)
        if unrouted:
            log.warning("%s.%s has public methods this integration does not route: %s",
                        module_name, class_name, ", ".join(unrouted))
    for other in _eurekaclaw_modules():
        for attr, value in list(vars(other).items()):
            if value is original:
                setattr(other, attr, routed)


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the patch; every other attribute is the own loader's."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create: Callable[[importlib.machinery.ModuleSpec], ModuleType | None] | None = getattr(
            self._loader, "create_module", None
        )
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        with _state.lock:
            if _state.installed:
                _patch(self._name, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """For the target modules only: find them as the other finders do, patch after they run."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _HOOKED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None
