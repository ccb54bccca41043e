"""Pick the device that the book's code runs on."""

from __future__ import annotations

import os

import torch

__all__ = ["get_device"]

_VALID = ("cuda", "mps", "cpu")

# The first float exp that two CPU threads compute at once in a process (torch's CPU build uses MKL's vector
# math for it) sometimes returns one thread's share 1.5e-4 off; one single-threaded exp beforehand prevents it.
torch.exp(torch.zeros(1))


def _available(kind: str) -> bool:
    if kind == "mps":
        return bool(getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available())
    return torch.cuda.is_available() if kind == "cuda" else kind == "cpu"


def get_device(prefer: str | torch.device | None = None) -> torch.device:
    """Return the device the book should run on.

    Precedence: the environment variable ``ATTNLIB_DEVICE`` (e.g. ``cpu`` or ``cuda:1``), then
    ``prefer`` (a device string or ``torch.device``), then the first available of ``cuda``,
    ``mps``, ``cpu``. ``ValueError`` if the requested device is unknown or not available here.

    >>> get_device().type in ("cuda", "mps", "cpu")
    True
    """
    if prefer is not None and not isinstance(prefer, (str, torch.device)):
        raise ValueError(f"prefer must be a device string such as 'cpu' or 'cuda:0', got {type(prefer).__name__}")
    requested = os.environ.get("ATTNLIB_DEVICE") or prefer
    if requested is None:
        return torch.device(next(kind for kind in _VALID if _available(kind)))  # cpu is always available
    return _checked(requested, "ATTNLIB_DEVICE" if os.environ.get("ATTNLIB_DEVICE") else "prefer")


def _checked(requested: str | torch.device, source: str = "device") -> torch.device:
    """``torch.device(requested)`` if it exists on this machine (a CUDA index too), else ``ValueError``."""
    try:
        device = torch.device(requested)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"unknown device {requested!r}; expected one of {', '.join(_VALID)} (e.g. 'cuda:0')") from err
    if device.type not in _VALID:
        raise ValueError(f"device type {device.type!r} is not supported; expected one of {', '.join(_VALID)}")
    if not _available(device.type) or (device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count()):
        raise ValueError(f"device {requested!r} (from {source}) is not available on this machine")
    return device
