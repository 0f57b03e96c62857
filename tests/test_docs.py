"""docs/architecture.md matches the code: every module, package, file and
``Class.member`` it names exists, and its module tree lists every module of
the protocol, the api, the adapters and the engine."""

from __future__ import annotations

import ast
import importlib
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
PACKAGES = ("barriers", "operators", "streaming")


def _spans() -> list[str]:
    return re.findall(r"`([^`\n]+)`", DOC)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def _classes() -> dict[str, set[str]]:
    """Every class of the three packages and the names defined in its body."""
    members: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    names = members.setdefault(node.name, set())
                    for item in node.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            names.add(item.name)
                        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                            names.add(item.target.id)
                        elif isinstance(item, ast.Assign):
                            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return members


def _tree() -> list[str]:
    """The paths of the module tree (the code block after "### The modules")."""
    block = DOC.split("### The modules", 1)[1].split("```", 2)[1]
    paths, stack = [], []
    for line in block.splitlines():
        match = re.match(r"^( *)(\S+)", line)
        if not match or not re.fullmatch(r"[\w.]+/|[\w]+\.py", match.group(2)):
            continue
        depth = len(match.group(1)) // 2
        stack[depth:] = [match.group(2).rstrip("/")]
        paths.append("/".join(stack))
    return paths


def test_every_dotted_name_resolves():
    names = {s for s in _spans() if re.fullmatch(r"(barriers|operators|streaming)(\.\w+)*", s)}
    assert len(names) > 20
    assert sorted(n for n in names if not _resolves(n)) == []


def test_every_file_named_exists():
    files = {s for s in _spans() if re.fullmatch(r"[\w./-]+\.(py|md|yaml)", s) and "/" in s}
    assert sorted(f for f in files if not (ROOT / f).exists()) == []


def test_every_class_member_named_exists():
    classes = _classes()
    named = [s.split("(")[0] for s in _spans() if re.fullmatch(r"[A-Z]\w*\.\w+(\(.*\))?", s)]
    assert len(named) > 10
    assert (
        sorted(n for n in named if n.split(".")[0] in classes and n.split(".")[1] not in classes[n.split(".")[0]]) == []
    )
    assert sorted(n for n in named if n.split(".")[0] not in classes) == []


def test_the_module_tree_names_what_exists_and_all_of_it():
    tree = _tree()
    assert sorted(p for p in tree if not (ROOT / p).exists() and not (ROOT / f"{p}").is_dir()) == []
    for package in ("barriers", "streaming/api", "streaming/adapters", "streaming/engine"):
        modules = {str(p.relative_to(ROOT)) for p in (ROOT / package).glob("*.py") if p.stem != "__init__"}
        modules |= {
            str(p.relative_to(ROOT)) for p in (ROOT / package).iterdir() if p.is_dir() and p.name != "__pycache__"
        }
        assert sorted(modules - set(tree)) == [], package
