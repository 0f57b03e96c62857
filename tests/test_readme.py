"""The README's commands and its pipeline example stay true."""

from __future__ import annotations

import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert [l for l in ci.splitlines() if l.strip() and not l.startswith("#")][-1].strip() == "make test"


def test_the_pipeline_example_builds_and_is_valid(tmp_path):
    code = re.search(r"```python\n(# orders\.py.*?)```", README, re.S).group(1)
    path = tmp_path / "orders.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("orders", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the __main__ part does not run
    pipeline = module.orders()
    assert [t.name for t in pipeline.tasks()] == ["valid-0", "valid-1", "totals-0"]
    assert pipeline.internal_topics() == {"spark-abs.orders.valid": 2}
