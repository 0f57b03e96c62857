"""The README's commands and its pipeline example (there and on the page
"Writing a pipeline") stay true."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    block = re.search(r"```sh\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert [l for l in ci.splitlines() if l.strip() and not l.startswith("#")][-1].strip() == "make test"


@pytest.mark.parametrize("page", ["README.md", "docs/pipelines/writing.md"])
def test_the_pipeline_example_is_the_orders_example_and_passes_the_check(page, tmp_path):
    from spark_abs_examples import orders
    from streaming.api.partitioning import check

    # the first Python block under the heading "Writing a pipeline"
    code = re.search(r"^#+ Writing a pipeline\n.*?```python\n(.*?)```", (ROOT / page).read_text(), re.S | re.M).group(1)
    path = tmp_path / "readme_orders.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("readme_orders", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shown, real = module.pipeline(), orders.pipeline()
    check(shown)

    def shape(pipeline):
        return (
            pipeline.ingress,
            [
                (s.name, s.inputs, s.parallelism, s.key, s.sink, s.spark, repr(s.make_operator()))
                for s in pipeline.stages
            ],
        )

    assert shape(shown) == shape(real)
    assert [t.name for t in shown.tasks()][:2] == ["valid-orders-0", "valid-orders-1"]
