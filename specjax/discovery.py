"""Registries filled by discovery: every module of a package that exports a table
({name: entry}) under an agreed attribute adds its entries, so an extension is its own file."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any


def exported(package: ModuleType, attribute: str, kind: str) -> dict[str, Any]:
    """The entries the modules of `package` export as `attribute`, by name (`kind` names what
    they are, for the error when two modules export one name)."""
    found: dict[str, Any] = {}
    for module in pkgutil.iter_modules(package.__path__):
        table = getattr(importlib.import_module(f"{package.__name__}.{module.name}"),
                        attribute, {})
        for name, entry in table.items():
            if name in found:
                raise ValueError(f"{kind} {name!r} is exported by two modules of "
                                 f"{package.__name__}")
            found[name] = entry
    return found
