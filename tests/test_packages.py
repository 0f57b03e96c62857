"""Every package opens with a docstring that names each of its modules and
sub-packages (as ``name``), so a newcomer finds what a package holds, and
what it says, in one place."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = sorted(
    init.parent
    for top in ("barriers", "operators", "streaming", "examples", "benchmarks")
    for init in (ROOT / top).rglob("__init__.py")
)


def _children(package: pathlib.Path) -> list[str]:
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    return sorted(modules | {d.name for d in package.iterdir() if (d / "__init__.py").is_file()})


def test_every_package_is_found():
    names = {p.relative_to(ROOT).as_posix() for p in PACKAGES}
    assert {"streaming/engine/task", "streaming/tools/drill", "examples", "operators"} <= names


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_package_docstring_names_every_module_of_the_package(package: pathlib.Path):
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    unnamed = [c for c in _children(package) if not re.search(rf"``(?:[\w.]+\.)?{re.escape(c)}(?:\.py)?``", docstring)]
    assert unnamed == [], f"{package.relative_to(ROOT)}/__init__.py does not name {unnamed}"
