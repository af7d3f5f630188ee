"""Prometheus ``/metrics`` for the sidecar, read from the run log at every scrape.

A custom collector rather than gauges updated in the background: the sidecar keeps no state
of its own, so a scrape is never staler than the log, and an unreadable log shows as
``autocomp_run_up 0`` instead of the last values it happened to hold.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from autocomp.guard_events import GUARD_NAMES
from autocomp.service.views import Reader, RunUnavailable, finite, layer_plans, window_summary

logger = logging.getLogger(__name__)


class RunCollector(Collector):
    """Reads the run log on every scrape, so /metrics is never staler than the log itself."""

    def __init__(self, open_run: Callable[[], contextlib.AbstractContextManager[Reader]]) -> None:
        self._open_run = open_run

    def describe(self) -> list:
        # Registering must not touch the run log (it may not exist yet).
        return []

    def collect(self) -> Iterator[Any]:
        up = GaugeMetricFamily("autocomp_run_up", "1 when the sidecar can read the run log.")
        try:
            with self._open_run() as reader:
                families = list(self._families(reader))
        except RunUnavailable as exc:
            logger.info("metrics: run log unavailable: %s", exc)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families

    def _families(self, reader: Reader) -> Iterator[Any]:
        meta = reader.meta()
        info = InfoMetricFamily("autocomp_run", "The run the sidecar serves.")
        info.add_metric(
            [],
            {
                "run_id": str(meta.get("run_id") or ""),
                "policy": str(meta.get("policy") or ""),
                "world_size": str(meta.get("world_size") or ""),
            },
        )
        yield info
        target = finite(meta.get("target_overlap"))
        if target is not None:
            yield _gauge("autocomp_target_overlap", "Overlap target of the policy.", target)

        window = reader.latest_window()
        summary = window_summary(window)
        if summary is not None:
            for name, doc, value in (
                ("autocomp_window_step", "Step of the latest window.", summary.step),
                (
                    "autocomp_bandwidth_bytes_per_second",
                    "Live link bandwidth fit.",
                    summary.bandwidth_bytes_per_s,
                ),
                ("autocomp_latency_seconds", "Live per-hop latency fit.", summary.latency_s),
                (
                    "autocomp_node_link_bytes_per_second",
                    "Hierarchical reduce: intra-node link bus bytes/s.",
                    summary.node_link_bytes_per_s,
                ),
                (
                    "autocomp_nic_bytes_per_second",
                    "Bytes/s sent on the interface torch.distributed uses.",
                    summary.nic_bytes_per_s,
                ),
                ("autocomp_step_seconds", "Median training step time.", summary.step_seconds),
                (
                    "autocomp_backward_seconds",
                    "Median backward compute time.",
                    summary.backward_seconds,
                ),
                (
                    "autocomp_exposed_seconds",
                    "Median communication left after the backward.",
                    summary.exposed_seconds,
                ),
                (
                    "autocomp_overlap_measured",
                    "Fraction of communication hidden behind backward, measured.",
                    summary.measured_overlap,
                ),
                (
                    "autocomp_overlap_predicted",
                    "Overlap the previous decision predicted for this window.",
                    summary.predicted_overlap,
                ),
                (
                    "autocomp_wire_bytes_per_step",
                    "Wire bytes one rank sent per step.",
                    summary.bytes_per_step,
                ),
                (
                    "autocomp_uncompressed_bytes_per_step",
                    "Bytes per step plain all-reduce would send.",
                    summary.uncompressed_bytes_per_step,
                ),
                (
                    "autocomp_compression_ratio",
                    "Uncompressed bytes / wire bytes per step.",
                    summary.compression_ratio,
                ),
                ("autocomp_loss", "Mean loss over the latest window.", summary.loss),
            ):
                if value is not None:
                    yield _gauge(name, doc, float(value))

        layers = GaugeMetricFamily(
            "autocomp_layer_wire_bytes",
            "Predicted wire bytes per step of one layer under its current compressor.",
            labels=["layer", "compressor"],
        )
        for plan in layer_plans(meta, reader.decisions()):
            if plan.wire_bytes is not None:
                layers.add_metric([plan.name, plan.compressor or ""], plan.wire_bytes)
        yield layers

        guards = CounterMetricFamily(
            "autocomp_guard_events", "Convergence-guard events by guard.", labels=["guard"]
        )
        counts = {name: 0 for name in GUARD_NAMES}
        counts.update({str(k): int(v) for k, v in reader.guard_counts().items()})
        for name, count in sorted(counts.items()):
            guards.add_metric([name], float(count))
        yield guards

        pending = sum(1 for o in reader.overrides() if o.get("applied_step") is None)
        yield _gauge(
            "autocomp_overrides_pending", "Operator overrides not applied yet.", float(pending)
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc)
    family.add_metric([], value)
    return family
