"""The documentation matches the code.  On every page under docs/ and in the
README, every module, package, file and ``Class.member`` named exists, every
``spark-abs`` (or ``python -m benchmarks``) option written is one its parser
takes, and every ``SPARK_ABS_*`` variable is one the code reads; the README's
links lead to files; docs/architecture/layers.md's module tree lists every module of
the protocol, the api, the adapters and the engine."""

from __future__ import annotations

import argparse
import ast
import importlib
import pathlib
import re
from unittest import mock

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text()
    for path in (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
}
ARCHITECTURE = PAGES["docs/architecture/layers.md"]
PACKAGES = ("barriers", "operators", "streaming")
# classes of other libraries the pages name members of
FOREIGN = {"ParquetWriter": "pyarrow.parquet.ParquetWriter", "DataFrame": "pyspark.sql.DataFrame"}


def _spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def _named(pattern: str) -> set[tuple[str, str]]:
    """(page, span) for every code span of every page that is all ``pattern``."""
    return {(page, s) for page, text in PAGES.items() for s in _spans(text) if re.fullmatch(pattern, s)}


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
    block = ARCHITECTURE.split("### The modules", 1)[1].split("```", 2)[1]
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
    names = _named(r"(barriers|operators|streaming)(\.\w+)*")
    assert len(names) > 40
    assert sorted((page, n) for page, n in names if not _resolves(n)) == []


def test_every_file_named_exists():
    files = _named(r"[\w./-]+\.(py|md|yaml|toml)")
    assert len(files) > 20
    assert sorted((page, f) for page, f in files if "/" in f and not (ROOT / f).exists()) == []


def test_every_class_member_named_exists():
    classes = _classes()
    named = {(page, s.split("(")[0]) for page, s in _named(r"[A-Z]\w*\.\w+(\(.*\))?")}
    assert len(named) > 20

    def exists(name: str) -> bool:
        cls, member = name.split(".")
        return member in classes[cls] if cls in classes else cls in FOREIGN and _resolves(f"{FOREIGN[cls]}.{member}")

    assert sorted((page, n) for page, n in named if not exists(n)) == []


def test_the_module_tree_names_what_exists_and_all_of_it():
    tree = _tree()
    assert sorted(p for p in tree if not (ROOT / p).exists() and not (ROOT / f"{p}").is_dir()) == []
    for package in ("barriers", "streaming/api", "streaming/adapters", "streaming/engine"):
        modules = {str(p.relative_to(ROOT)) for p in (ROOT / package).glob("*.py") if p.stem != "__init__"}
        modules |= {
            str(p.relative_to(ROOT)) for p in (ROOT / package).iterdir() if p.is_dir() and p.name != "__pycache__"
        }
        assert sorted(modules - set(tree)) == [], package


# --- command lines ---------------------------------------------------------------------------------------------


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _parser_of(main) -> argparse.ArgumentParser:
    """The parser a command's ``main`` builds, taken when it starts to parse (nothing runs)."""

    def caught(self, *args, **kwargs):
        raise _Built(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", caught), pytest.raises(_Built) as built:
        main([])
    return built.value.parser


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _command_options() -> dict[str, set[str]]:
    """Every command the pages may write (``spark-abs X``, ``python -m benchmarks``) and its options."""
    from benchmarks import __main__ as bench
    from benchmarks import state as bench_state
    from streaming.tools import cli

    top = cli.build_parser()
    shared = _options(top)  # --home, -v: before the command
    (commands,) = (a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    options = {f"spark-abs {name}": _options(parser) | shared for name, parser in commands.choices.items()}
    options["python -m benchmarks"] = _options(_parser_of(bench.main))
    options["python -m benchmarks.state"] = _options(_parser_of(bench_state.main))
    return options


_COMMAND = re.compile(r"(?:^|[\s/`$(\"'])(spark-abs [a-z][\w-]*|python -m benchmarks(?:\.state)?)(?![\w.])(.*)")


def _command_lines(commands: set[str]) -> list[tuple[str, str, str]]:
    """(page, command, what follows it on its line) for every command line written in a code block or span
    (shell continuations joined, comments and what follows ``|``, ``;`` or ``&&`` cut off).  A span may leave
    out ``spark-abs``: ``run --drain`` where it opens with one of ``commands`` and gives an option."""
    found = []
    for page, text in PAGES.items():
        text = text.replace("\\\n", " ")
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
        prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
        spans = [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
        spans = [f"spark-abs {s}" if s.split(" ", 1)[0] in commands and " -" in s else s for s in spans]
        for line in [*"\n".join(blocks).splitlines(), *spans]:
            for match in _COMMAND.finditer(line):
                found.append((page, match.group(1), re.split(r"\s#|\||;|&&", match.group(2))[0]))
    return found


def test_every_command_and_option_written_exists():
    options = _command_options()
    lines = _command_lines({command.split()[1] for command in options if command.startswith("spark-abs ")})
    assert len(lines) > 50
    written = {
        (page, command, flag) for page, command, rest in lines for flag in re.findall(r"(?<!\S)--?[a-z][\w-]*", rest)
    }
    assert len(written) > 60
    assert sorted({(page, command) for page, command, _ in lines if command not in options}) == []
    assert sorted((page, c, f) for page, c, f in written if c in options and f not in options[c]) == []


def test_every_environment_variable_named_is_read_and_the_configuration_lists_the_connection():
    from streaming.api.config import ENV

    source = "\n".join(p.read_text() for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    named = {(page, v) for page, text in PAGES.items() for v in re.findall(r"\bSPARK_ABS_[A-Z0-9_]*[A-Z0-9]", text)}
    assert len(named) > 10
    assert sorted((page, v) for page, v in named if f'"{v}"' not in source) == []
    configuration = PAGES["docs/operations/local-runtime.md"].split("## Configuration", 1)[1].split("\n## ", 1)[0]
    assert sorted(v for v in ENV.values() if f"`{v}`" not in configuration) == []


def test_the_readme_links_lead_to_files():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", PAGES["README.md"])
    local = [link for link in links if "://" not in link]
    assert len(local) > 15
    assert sorted(link for link in local if not (ROOT / link).is_file()) == []
