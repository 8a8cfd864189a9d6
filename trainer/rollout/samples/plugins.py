"""Loading user functions named on the command line (``--custom-rm-path``,
``--custom-generate-function-path``, ``--env-path``, ``--tool-parser``, the dynamic-sampling
filter): ``pkg.module:func``, ``pkg.module.func`` or ``path/to/file.py:func``. ``load_plugin``
also builds a class with its ``key=value`` options. Errors name the flag, so a bad path fails
at start-up."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable


def load_dotted(path: str, flag: str) -> Callable:
    """The callable (function or class) that ``path`` names; ``flag`` names it in errors."""
    where = f"{flag} {path!r}"
    module_name, attr = _split(path, where)
    module = _import_file(module_name, where) if module_name.endswith(".py") \
        else _import_module(module_name, where)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{where}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{where}: {attr!r} is not callable")
    return obj


def load_plugin(path: str, flag: str, options: dict, options_flag: str, **offered) -> Any:
    """What ``path`` names: a function as it is (``options`` must be empty), or a class built
    with ``options`` and each of ``offered`` (not None) that its constructor takes."""
    return build_plugin(load_dotted(path, flag), f"{flag} {path!r}", options, options_flag,
                        **offered)


def build_plugin(obj: Callable, where: str, options: dict, options_flag: str, **offered) -> Any:
    if not inspect.isclass(obj):
        if options:
            raise ValueError(f"{where} is a function; {options_flag} need a class")
        return obj
    params = inspect.signature(obj).parameters
    taken = {k: v for k, v in offered.items() if v is not None and k in params}
    try:
        return obj(**options, **taken)
    except TypeError as e:
        raise ValueError(f"{where}: bad {options_flag}: {e}") from None


def _split(path: str, where: str) -> tuple[str, str]:
    if ":" in path:
        module_name, attr = path.split(":", 1)
    elif "." in path:
        module_name, attr = path.rsplit(".", 1)
    else:
        module_name = attr = ""
    if not module_name or not attr:
        raise ValueError(f"{where}: expected 'pkg.module:func' or 'pkg.module.func'")
    return module_name, attr


def _import_file(module_name: str, where: str):
    file = Path(module_name)
    if not file.is_file():
        raise ValueError(f"{where}: file {file} not found")
    spec = importlib.util.spec_from_file_location(f"_plugin_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(f"{where}: importing {file} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_module(module_name: str, where: str):
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does, so local modules are found
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(f"{where}: cannot import module {module_name!r}: "
                         f"{type(exc).__name__}: {exc}") from exc
