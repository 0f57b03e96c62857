"""A griffe extension for the API reference: the docstrings' doctest examples
(a paragraph of ``>>>`` lines, which ``doctest`` runs) are shown as Python
console code instead of being read as Markdown, where ``>>>`` is a quote."""

from __future__ import annotations

import re

import griffe

# a paragraph whose first line starts with >>>: up to the next blank line
_EXAMPLE = re.compile(r"^([ \t]*)>>> .*(?:\n\1(?![ \t]*$).*)*", re.M)


def fenced(text: str) -> str:
    """``text`` with each doctest paragraph in a ```pycon fence at its indentation."""
    return _EXAMPLE.sub(lambda m: f"\n{m[1]}```pycon\n{m[0]}\n{m[1]}```\n", text)


class DoctestBlocks(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fenced(obj.docstring.value)
