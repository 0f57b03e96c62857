"""The layers of ``streaming/``, the boundaries of every module of the
project, and who may import pyspark.

Imports go down only: testing -> tools -> the engine and the local runtime
-> adapters -> api -> the bounded waits and owner-only files -> errors, the
protocol (``barriers``) and ``operators``;
never sideways between packages of one layer (the engine and the local
runtime know nothing of each other).  Inside the engine, its sub-packages
are layers too: task -> restore -> worker -> remote -> job, each importing
only those before it and the engine's own modules (``faults``, ``metrics``,
``kafka_retention``), which import no sub-package.  A ``"module:attr"``
string, by which code is loaded at run time, counts as an import of that
module.  No two modules import each other, by
any path, and no module imports another's ``_private`` names.  pyspark is
the Spark adapters' business: no module of the engine, the adapters (but
``streaming.adapters.spark``'s ``session``, ``query``, ``stage`` and ``decoding``), the api or ``operators``
names it, and importing any of them loads none of it."""

from __future__ import annotations

import ast
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
SPARK_ADAPTERS = (
    "streaming.adapters.spark.session",
    "streaming.adapters.spark.query",
    "streaming.adapters.spark.stage",
    "streaming.adapters.spark.decoding",
)

# a module may import modules of its own package and of lower layers, never
# another package of its own layer
LAYERS = {
    "streaming.errors": 0,
    "streaming.console": 0,
    "streaming.waits": 1,
    "streaming.private_files": 1,
    "streaming.api": 2,
    "streaming.adapters": 3,
    "streaming.engine": 4,
    "streaming.local": 4,
    "streaming.tools": 5,
    "streaming.testing": 6,
}
# the engine's sub-packages, from the bottom up; its modules outside them come first
ENGINE = (
    "streaming.engine.task",
    "streaming.engine.restore",
    "streaming.engine.worker",
    "streaming.engine.remote",
    "streaming.engine.job",
)
# every package of the repository, by the name it is imported as -> its directory: what setup.py
# installs (the examples as spark_abs_examples) and the benchmarks
PACKAGES = {
    "barriers": "barriers",
    "operators": "operators",
    "streaming": "streaming",
    "spark_abs_examples": "examples",
    "benchmarks": "benchmarks",
}
PROJECT = tuple(PACKAGES)
# what a user installs to run pipelines; the examples and the benchmarks are built on it, never in it
LIBRARY = ("barriers", "operators", "streaming")
WITHOUT_SPARK = ("operators", "streaming.api", "streaming.adapters", "streaming.engine", "streaming.errors")


def _directory(module: str) -> pathlib.Path:
    """Where ``module``'s file or package is, by the name it is imported as."""
    top, *rest = module.split(".")
    return ROOT.joinpath(PACKAGES.get(top, top), *rest)


def _modules(package: str) -> dict[str, pathlib.Path]:
    top = package.split(".")[0]
    base = _directory(package)
    return {
        ".".join((top, *p.relative_to(ROOT / PACKAGES[top]).with_suffix("").parts)).removesuffix(".__init__"): p
        for p in sorted(base.rglob("*.py"))
    }


def _is_module(name: str) -> bool:
    path = _directory(name)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


# a reference by which code is loaded at run time (``load_pipeline``, ``compare``'s
# ``--pipeline``): ``package.module:attr``
_LOADED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):[A-Za-z_]\w*")


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
    """Every module a file imports, anywhere in it (functions and
    ``TYPE_CHECKING`` blocks included), every name it imports from one, and
    every project module a ``"module:attr"`` string in it names: (line,
    module or ``module.name``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _LOADED.fullmatch(node.value.split("?")[0])
            if match and match.group(1).split(".")[0] in PROJECT and _is_module(match.group(1)):
                found.append((node.lineno, match.group(1)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                # ``from streaming.engine import faults`` imports the module streaming.engine.faults
                found += (
                    [(node.lineno, name)] if _is_module(name) else [(node.lineno, node.module), (node.lineno, name)]
                )
    return list(dict.fromkeys(found))


def _package(module: str) -> str | None:
    """The package of LAYERS ``module`` belongs to."""
    return next((prefix for prefix in LAYERS if module == prefix or module.startswith(prefix + ".")), None)


def _layer(module: str) -> int | None:
    package = _package(module)
    return None if package is None else LAYERS[package]


def _project_modules() -> dict[str, pathlib.Path]:
    return {module: path for package in PROJECT for module, path in _modules(package).items()}


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """A cycle through every back edge of a depth-first walk of ``graph``
    (none when there is none), as ``a -> b -> a``."""
    found: list[str] = []
    done: set[str] = set()

    def walk(module: str, path: list[str]) -> None:
        if module in path:
            found.append(" -> ".join([*path[path.index(module) :], module]))
            return
        if module in done:
            return
        path.append(module)
        for imported in sorted(graph[module]):
            walk(imported, path)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        walk(module, [])
    return found


def _private_owner(imported: str) -> str | None:
    """Whose ``_private`` name ``imported`` reaches (``a.b`` for ``a.b._c``
    and ``a.b._c.d``), or None when every part of it is public."""
    parts = imported.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:index])
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


def test_no_import_goes_sideways_within_a_layer():
    offenders = [
        f"{module}:{line} imports {imported}, of {_package(imported)} on the same layer"
        for module, path in _modules("streaming").items()
        if _package(module) is not None
        for line, imported in _imports(path)
        if _layer(imported) == _layer(module) and _package(imported) != _package(module)
    ]
    assert offenders == []


def _engine_rank(module: str) -> int | None:
    """Where ``module`` stands among the engine's sub-packages (-1: a module
    of the engine outside them), or None when it is not the engine's."""
    if module != "streaming.engine" and not module.startswith("streaming.engine."):
        return None
    return next((rank for rank, sub in enumerate(ENGINE) if module == sub or module.startswith(sub + ".")), -1)


def test_the_engine_sub_packages_import_only_those_below_them():
    offenders = [
        f"{module}:{line} imports {imported}"
        for module, path in _modules("streaming.engine").items()
        if module != "streaming.engine"
        for line, imported in _imports(path)
        if (target := _engine_rank(imported)) is not None
        and imported != "streaming.engine"
        and target > _engine_rank(module)
    ]
    assert offenders == []


def test_no_modules_import_each_other():
    modules = _project_modules()
    graph = {
        module: {imported for _, imported in _imports(path) if imported in modules and imported != module}
        for module, path in modules.items()
    }
    assert _cycles(graph) == []


def test_no_module_imports_a_private_name_of_another():
    """``_name`` is its module's own (``a._b``, a private module, its package's)."""
    offenders = [
        f"{module}:{line} imports {imported}"
        for module, path in _project_modules().items()
        for line, imported in _imports(path)
        if imported.split(".")[0] in PROJECT
        and (owner := _private_owner(imported)) is not None
        and not (module == owner or module.startswith(owner + "."))
    ]
    assert offenders == []


def test_the_engine_reaches_kafka_only_through_the_adapters():
    offenders = [
        f"{module}:{line} imports {imported}"
        for module, path in _modules("streaming.engine").items()
        for line, imported in _imports(path)
        if imported.split(".")[0] == "kafka"
    ]
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
        if module not in SPARK_ADAPTERS
        for line, imported in _imports(path)
        if imported.split(".")[0] == "pyspark"
    ]
    assert offenders == []
    for adapter in SPARK_ADAPTERS:
        assert any(imported.startswith("pyspark") for _, imported in _imports(_modules("streaming.adapters")[adapter]))


def test_importing_the_engine_the_adapters_and_operators_loads_no_spark():
    modules = [m for package in WITHOUT_SPARK for m in _modules(package) if m not in SPARK_ADAPTERS]
    assert "streaming.engine.worker.worker" in modules and "streaming.engine.task.stage_task" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'pyspark'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_every_package_of_the_repository_is_scanned():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages == set(PACKAGES.values())


def test_the_library_does_not_import_the_examples_or_the_benchmarks():
    """The demo and ``compare`` take the example pipelines by name (their
    entry points), so the library runs without the examples installed."""
    offenders = [
        f"{module}:{line} imports {imported}"
        for package in LIBRARY
        for module, path in _modules(package).items()
        for line, imported in _imports(path)
        if imported.split(".")[0] in set(PROJECT) - set(LIBRARY)
    ]
    assert offenders == []
