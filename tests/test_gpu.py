"""Tier 1: pure unit, no processes.

:mod:`autocomp.gpu` without a GPU: the real environment has no ``pynvml`` (so ``create()``
must return None quietly), and a fake ``pynvml`` injected into ``sys.modules`` drives
``sample()`` through utilization, PCIe, NVLink counter differencing, and the failure paths
(NVML errors, missing functions, failed init, no device).
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types
from typing import Any

import pytest

from autocomp.gpu import GpuMonitor, GpuSample


class FakeNVMLError(Exception):
    pass


class _Value:
    def __init__(self, value: int) -> None:
        self.ullVal = value


class _Field:
    def __init__(self, value: int, ret: int = 0) -> None:
        self.nvmlReturn = ret
        self.valueType = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        self.value = _Value(value)


def fake_nvml(**overrides: Any) -> types.ModuleType:
    """A minimal pynvml: one device, scripted readings, call log in ``module.calls``."""
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.NVML_SUCCESS = 0
    module.NVML_PCIE_UTIL_TX_BYTES = 0
    module.NVML_PCIE_UTIL_RX_BYTES = 1
    module.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
    module.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
    module.calls = []
    module.nvlink = {138: [1000, 3000], 139: [500, 500]}  # KiB totals per successive read

    def record(name: str) -> None:
        module.calls.append(name)

    def nvmlInit() -> None:
        record("init")

    def nvmlShutdown() -> None:
        record("shutdown")

    def nvmlDeviceGetCount() -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(index: int) -> str:
        return f"handle{index}"

    def nvmlDeviceGetUtilizationRates(handle: str) -> Any:
        return types.SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetPcieThroughput(handle: str, counter: int) -> int:
        return {0: 1200, 1: 3400}[counter]

    def nvmlDeviceGetFieldValues(handle: str, ids: list[int]) -> list[_Field]:
        return [_Field(module.nvlink[i].pop(0)) for i in ids]

    for function in (
        nvmlInit,
        nvmlShutdown,
        nvmlDeviceGetCount,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetUtilizationRates,
        nvmlDeviceGetPcieThroughput,
        nvmlDeviceGetFieldValues,
    ):
        setattr(module, function.__name__, function)
    for name, value in overrides.items():
        if value is None:
            delattr(module, name)
        else:
            setattr(module, name, value)
    return module


def test_absent_pynvml_is_silent(caplog: pytest.LogCaptureFixture) -> None:
    if importlib.util.find_spec("pynvml") is not None:
        pytest.skip("pynvml is installed here; absence is what this test checks")
    with caplog.at_level(logging.DEBUG, logger="autocomp.gpu"):
        assert GpuMonitor.create() is None
    messages = [r for r in caplog.records if r.name == "autocomp.gpu"]
    assert len(messages) == 1 and messages[0].levelno == logging.DEBUG


def test_sample_reads_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_nvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    clock = iter([10.0, 12.0])
    monkeypatch.setattr("autocomp.gpu.time.monotonic", lambda: next(clock))
    monitor = GpuMonitor.create()
    assert monitor is not None
    first = monitor.sample()
    assert first == GpuSample(
        index=0,
        time_s=10.0,
        utilization_percent=87.0,
        memory_utilization_percent=40.0,
        pcie_tx_kb_s=1200.0,
        pcie_rx_kb_s=3400.0,
        nvlink_tx_kib_s=None,  # a rate needs a previous reading of the cumulative counter
        nvlink_rx_kib_s=None,
    )
    second = monitor.sample()
    assert second.nvlink_tx_kib_s == pytest.approx((3000 - 1000) / 2.0)
    assert second.nvlink_rx_kib_s == 0.0
    monitor.close()
    monitor.close()
    assert module.calls.count("shutdown") == 1


def test_errors_and_missing_functions_become_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> Any:
        raise FakeNVMLError("Not Supported")

    module = fake_nvml(
        nvmlDeviceGetPcieThroughput=broken,
        nvmlDeviceGetFieldValues=None,  # an old pynvml without field values
    )
    monkeypatch.setitem(sys.modules, "pynvml", module)
    monitor = GpuMonitor.create()
    assert monitor is not None
    with caplog.at_level(logging.DEBUG, logger="autocomp.gpu"):
        for _ in range(3):
            sample = monitor.sample()
            assert sample.utilization_percent == 87.0
            assert sample.pcie_tx_kb_s is None and sample.pcie_rx_kb_s is None
            assert sample.nvlink_tx_kib_s is None and sample.nvlink_rx_kib_s is None
    # one debug line per unsupported query, not one per sample
    assert len([r for r in caplog.records if r.name == "autocomp.gpu"]) == 2


def test_field_error_code_gives_no_nvlink(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_supported(handle: str, ids: list[int]) -> list[_Field]:
        return [_Field(0, ret=3) for _ in ids]

    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(nvmlDeviceGetFieldValues=not_supported))
    monitor = GpuMonitor.create()
    assert monitor is not None
    monitor.sample()
    assert monitor.sample().nvlink_tx_kib_s is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"nvmlInit": lambda: (_ for _ in ()).throw(FakeNVMLError("Driver Not Loaded"))},
        {"nvmlDeviceGetCount": lambda: 0},
    ],
    ids=["init-fails", "no-device"],
)
def test_create_returns_none(monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any]) -> None:
    module = fake_nvml(**overrides)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    assert GpuMonitor.create() is None
    assert GpuMonitor.create(index=5) is None
