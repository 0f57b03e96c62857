"""Errors raised by the adapters in ``streaming/``: one base class, one named
subclass for each thing that can go wrong, each with a message a person can act on."""

from __future__ import annotations

__all__ = [
    "SparkAbsError",
    "ConfigError",
    "ToolMissingError",
    "ArtifactResolutionError",
    "PortInUseError",
    "ServiceStartError",
    "RuntimeNotRunningError",
    "StoreError",
]


class SparkAbsError(Exception):
    """Base of every error spark-abs raises on purpose; the CLI prints its message
    without a traceback."""


class ConfigError(SparkAbsError, ValueError):
    """A setting is missing, malformed or conflicts with another; the message names it."""


class ToolMissingError(SparkAbsError):
    """A program the local runtime needs (java, mvn, go) is not on PATH."""


class ArtifactResolutionError(SparkAbsError):
    """Maven or the Go module proxy could not deliver an artifact (registry
    unreachable, version not published, build failed)."""


class PortInUseError(SparkAbsError):
    """A port the runtime was told to use is taken by another process."""


class ServiceStartError(SparkAbsError):
    """A local service exited or did not become ready in time; carries its log tail."""


class RuntimeNotRunningError(SparkAbsError):
    """No connection file: the local runtime was never started (or was purged)."""


class StoreError(SparkAbsError):
    """The snapshot or output store is unreachable or refused an operation."""
