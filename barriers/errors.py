"""Every error the protocol core raises on purpose, under one base.  Each
keeps the standard exception it has always been too (``BarrierRejected`` is
a ``ValueError``, the others ``RuntimeError``s), so callers may catch either."""

from __future__ import annotations

__all__ = ["BarrierError", "BarrierRejected", "ProtocolError", "CoordinatorError", "SimulationError"]


class BarrierError(Exception):
    """Base of every error ``barriers`` raises on purpose."""


class BarrierRejected(BarrierError, ValueError):
    """A record claims to be a barrier or a cancellation but cannot be one."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class ProtocolError(BarrierError, RuntimeError):
    """The handler was driven in a way the protocol does not allow."""


class CoordinatorError(BarrierError, RuntimeError):
    """The coordinator was asked for something its state does not allow."""


class SimulationError(BarrierError, RuntimeError):
    """The simulation was set up or driven in a way it cannot run."""
