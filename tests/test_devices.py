"""The one device parser every device flag goes through (common/devices.py)."""

from __future__ import annotations

import pytest
import torch

from common.devices import parse_device
from common.errors import UserError


def test_a_device_flag_reads_cpu_and_auto():
    assert parse_device("cpu", "--device") == torch.device("cpu")
    assert parse_device("auto", "--teacher-device", auto=torch.device("cpu")) == torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gpu", "--device 'gpu' is not a device (cpu, cuda, cuda:N)"),
        ("meta", "--device 'meta' is not a device this command runs on"),
        ("auto", "--device 'auto' is not a device"),  # a flag without an ``auto``
    ],
)
def test_a_device_flag_refuses_what_is_not_a_device_in_one_line(name, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_device(name, "--device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_a_device_flag_refuses_cuda_on_a_machine_without_it():
    for flag in ("--device", "--teacher-device"):
        with pytest.raises(UserError, match=f"{flag} cuda:1: CUDA is not available on this machine"):
            parse_device("cuda:1", flag, auto="cpu")
