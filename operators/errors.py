"""Errors raised by operators: one base class, one named subclass for each
thing that can go wrong, each with a message that names the operator and what
to fix."""

from __future__ import annotations

__all__ = [
    "OperatorError",
    "OperatorConfigError",
    "InputSchemaError",
    "StateRestoreError",
]


class OperatorError(Exception):
    """Base of every error an operator raises on purpose."""


class OperatorConfigError(OperatorError, ValueError):
    """An operator was built with arguments that cannot work (raised by the
    constructor, before any data flows); the message names the argument."""


class InputSchemaError(OperatorError):
    """A batch lacks a column the operator needs, or its values cannot be cast
    to the type the operator's state already has."""


class StateRestoreError(OperatorError):
    """``restore()`` was handed state it cannot take back: tables missing or
    unexpected, columns missing or of the wrong type, duplicate or null keys.
    The operator is left as it was before the call."""
