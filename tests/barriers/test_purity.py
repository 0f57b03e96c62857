"""barriers/ is the pure protocol core: it must not import Spark, Kafka,
Arrow or S3 clients, directly or through anything it imports."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

FORBIDDEN = ("pyspark", "kafka", "pyarrow", "boto3", "botocore", "streaming", "operators")
PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "barriers"


def test_no_module_of_barriers_names_a_forbidden_import():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            offenders += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert offenders == []


def test_importing_every_module_loads_none_of_them():
    modules = [
        ".".join(("barriers", *p.relative_to(PACKAGE).with_suffix("").parts)).removesuffix(".__init__")
        for p in sorted(PACKAGE.rglob("*.py"))
    ]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted({{n.split('.')[0] for n in sys.modules}} & set({FORBIDDEN!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
