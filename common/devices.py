"""The one reading of a device flag (``--device``, ``--teacher-device``): ``auto`` or a torch device
this machine has."""

from __future__ import annotations

from typing import TYPE_CHECKING

from common.errors import UserError

if TYPE_CHECKING:
    import torch


def parse_device(name: str, flag: str, auto: torch.device | str | None = None) -> torch.device:
    """The device ``flag`` names: ``auto`` is ``auto`` (refused where the flag has none), else
    ``cpu``, ``cuda`` or ``cuda:N`` of a GPU this machine has."""
    import torch

    if name == "auto" and auto is not None:
        return torch.device(auto)
    choices = "cpu, cuda, cuda:N" + (" or auto" if auto is not None else "")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"{flag} {name!r} is not a device ({choices})") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"{flag} {name!r} is not a device this command runs on ({choices})")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{flag} {name}: CUDA is not available on this machine (use {flag} cpu)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"{flag} {name}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device
