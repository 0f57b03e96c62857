"""The layers of ``streaming/`` and who may import pyspark.

Imports go down only: tools -> engine -> adapters (and the local runtime)
-> api -> the protocol (``barriers``) and ``operators``.  pyspark is the
Spark adapter's business: no module of the engine, the adapters (but
``streaming.adapters.spark``), the api or ``operators`` names it, and
importing any of them loads none of it."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPARK_ADAPTER = "streaming.adapters.spark"

# a module of a layer may import modules of its own layer or lower ones
LAYERS = {
    "streaming.errors": 1,
    "streaming.api": 1,
    "streaming.adapters": 2,
    "streaming.local": 2,
    "streaming.engine": 3,
    "streaming.tools": 4,
    "streaming.testing": 4,
}
WITHOUT_SPARK = ("operators", "streaming.api", "streaming.adapters", "streaming.engine", "streaming.errors")


def _modules(package: str) -> dict[str, pathlib.Path]:
    base = ROOT / package.replace(".", "/")
    return {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
        for p in sorted(base.rglob("*.py"))
    }


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """Every module a file imports, anywhere in it (functions and
    ``TYPE_CHECKING`` blocks included): (line, module)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            # ``from streaming.engine import faults`` imports streaming.engine.faults
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _layer(module: str) -> int | None:
    for prefix, rank in LAYERS.items():
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return None


def test_imports_only_go_down_the_layers():
    offenders = []
    for module, path in _modules("streaming").items():
        own = _layer(module)
        if own is None:
            continue
        for line, imported in _imports(path):
            target = _layer(imported)
            if target is not None and target > own:
                offenders.append(f"{module}:{line} imports {imported}")
    assert offenders == []


def test_operators_import_nothing_of_streaming():
    offenders = [
        f"{module}:{line} imports {imported}"
        for module, path in _modules("operators").items()
        for line, imported in _imports(path)
        if imported.split(".")[0] == "streaming"
    ]
    assert offenders == []


def test_only_the_spark_adapter_names_pyspark():
    offenders = [
        f"{module}:{line} imports {imported}"
        for package in WITHOUT_SPARK
        for module, path in _modules(package).items()
        if module != SPARK_ADAPTER
        for line, imported in _imports(path)
        if imported.split(".")[0] == "pyspark"
    ]
    assert offenders == []
    assert any(
        imported.startswith("pyspark") for _, imported in _imports(_modules("streaming.adapters")[SPARK_ADAPTER])
    )


def test_importing_the_engine_the_adapters_and_operators_loads_no_spark():
    modules = [m for package in WITHOUT_SPARK for m in _modules(package) if m != SPARK_ADAPTER]
    assert "streaming.engine.worker" in modules and "streaming.engine.task" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'pyspark'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
