"""GPU utilization and interconnect throughput from NVML, when NVML is there.

Compression trades link time for compute; on a GPU the controller wants to know whether the
GPU is already busy and how much PCIe / NVLink traffic is flowing. This reads those figures
through ``pynvml`` (package ``nvidia-ml-py``, the ``gpu`` extra) and degrades to nothing when
it is missing: :meth:`GpuMonitor.create` returns None, and every figure NVML cannot provide is
None in the sample rather than an exception.

Caveat: this module was written against the NVML API documentation and tested only with a
fake ``pynvml`` module; it has NOT been run on a real GPU.
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["GpuMonitor", "GpuSample"]

logger = logging.getLogger(__name__)

_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
"""NVML_VALUE_TYPE_* -> member of the nvmlValue_t union holding the value."""
_NVLINK_TX_FIELD = "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX"
_NVLINK_RX_FIELD = "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of a GPU; a figure NVML could not provide is None."""

    index: int
    """NVML device index (NVML ignores ``CUDA_VISIBLE_DEVICES``)."""
    time_s: float
    """``time.monotonic()`` of the reading."""
    utilization_percent: float | None
    """Percent of the last sample period in which a kernel was running."""
    memory_utilization_percent: float | None
    """Percent of the last sample period in which device memory was read or written."""
    pcie_tx_kb_s: float | None
    """PCIe transmit throughput in KB/s, as NVML reports it (a ~20 ms window)."""
    pcie_rx_kb_s: float | None
    """PCIe receive throughput in KB/s."""
    nvlink_tx_kib_s: float | None
    """NVLink data transmitted, KiB/s since the previous sample (None on the first one)."""
    nvlink_rx_kib_s: float | None
    """NVLink data received, KiB/s since the previous sample (None on the first one)."""


class GpuMonitor:
    """Reads one GPU's utilization and interconnect throughput. Create with :meth:`create`."""

    def __init__(self, nvml: Any, handle: Any, index: int) -> None:
        self._nvml = nvml
        self._handle = handle
        self.index = index
        error = getattr(nvml, "NVMLError", None)
        errors: list[type[BaseException]] = [AttributeError, TypeError, OSError]
        if isinstance(error, type) and issubclass(error, BaseException):
            errors.append(error)
        self._errors = tuple(errors)
        self._failed: set[str] = set()
        self._previous_nvlink: tuple[float, float, float] | None = None
        self._closed = False

    @classmethod
    def create(cls, index: int = 0) -> GpuMonitor | None:
        """A monitor of NVML device ``index``, or None (one debug log) if NVML is unusable."""
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            logger.debug("GPU monitoring off: pynvml (nvidia-ml-py) is not installed")
            return None
        try:
            nvml.nvmlInit()
        except Exception as err:  # NVMLError subclasses, or a missing libnvidia-ml.so (OSError)
            logger.debug("GPU monitoring off: nvmlInit failed (%s)", err)
            return None
        try:
            count = int(nvml.nvmlDeviceGetCount())
            if not 0 <= index < count:
                raise LookupError(f"NVML sees {count} device(s), asked for index {index}")
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:
            logger.debug("GPU monitoring off: %s", err)
            _shutdown(nvml)
            return None
        return cls(nvml, handle, index)

    def _call(self, name: str, *args: Any) -> Any | None:
        """``pynvml.<name>(*args)``, or None if the function is missing or NVML refuses."""
        function = getattr(self._nvml, name, None)
        if function is None:
            self._note_failure(name, "not in this pynvml")
            return None
        try:
            return function(*args)
        except self._errors as err:
            self._note_failure(name, str(err) or type(err).__name__)
            return None

    def _note_failure(self, name: str, why: str) -> None:
        if name not in self._failed:  # one line per unsupported query, not one per sample
            self._failed.add(name)
            logger.debug("NVML %s unavailable on device %d: %s", name, self.index, why)

    def _pcie(self, constant: str, fallback: int) -> float | None:
        counter = getattr(self._nvml, constant, fallback)
        value = self._call("nvmlDeviceGetPcieThroughput", self._handle, counter)
        return None if value is None else float(value)

    def _nvlink_totals(self) -> tuple[float, float] | None:
        """Cumulative NVLink data KiB (tx, rx), or None where NVML has no such counters."""
        tx_id = getattr(self._nvml, _NVLINK_TX_FIELD, None)
        rx_id = getattr(self._nvml, _NVLINK_RX_FIELD, None)
        if tx_id is None or rx_id is None:
            return None
        values = self._call("nvmlDeviceGetFieldValues", self._handle, [tx_id, rx_id])
        if values is None:
            return None
        success = getattr(self._nvml, "NVML_SUCCESS", 0)
        totals = []
        try:
            for value in values:
                if getattr(value, "nvmlReturn", success) != success:
                    self._note_failure("NVLink throughput fields", f"code {value.nvmlReturn}")
                    return None
                member = _VALUE_FIELDS.get(int(value.valueType))
                if member is None:
                    return None
                totals.append(float(getattr(value.value, member)))
        except (*self._errors, ValueError) as err:
            self._note_failure("NVLink throughput fields", repr(err))
            return None
        if len(totals) != 2:
            return None
        return totals[0], totals[1]

    def sample(self) -> GpuSample:
        """Read the device now; NVLink rates are averaged since the previous call."""
        now = time.monotonic()
        utilization = (
            None if self._closed else self._call("nvmlDeviceGetUtilizationRates", self._handle)
        )
        gpu_percent = getattr(utilization, "gpu", None)
        memory_percent = getattr(utilization, "memory", None)
        tx = rx = nvlink_tx = nvlink_rx = None
        if not self._closed:
            tx = self._pcie("NVML_PCIE_UTIL_TX_BYTES", 0)
            rx = self._pcie("NVML_PCIE_UTIL_RX_BYTES", 1)
            totals = self._nvlink_totals()
            if totals is not None:
                previous = self._previous_nvlink
                self._previous_nvlink = (now, *totals)
                if previous is not None and now > previous[0]:
                    elapsed = now - previous[0]
                    sent, received = totals[0] - previous[1], totals[1] - previous[2]
                    if sent >= 0 and received >= 0:  # a counter reset yields no rate
                        nvlink_tx, nvlink_rx = sent / elapsed, received / elapsed
        return GpuSample(
            index=self.index,
            time_s=now,
            utilization_percent=None if gpu_percent is None else float(gpu_percent),
            memory_utilization_percent=None if memory_percent is None else float(memory_percent),
            pcie_tx_kb_s=tx,
            pcie_rx_kb_s=rx,
            nvlink_tx_kib_s=nvlink_tx,
            nvlink_rx_kib_s=nvlink_rx,
        )

    def close(self) -> None:
        """Release NVML (idempotent); later samples hold only None figures."""
        if not self._closed:
            self._closed = True
            _shutdown(self._nvml)


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception as err:  # shutting down must never raise into training
        logger.debug("nvmlShutdown failed: %s", err)
