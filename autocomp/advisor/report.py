"""The advice in three forms: a terminal table (rich), JSON, and a self-contained HTML page.

The HTML page embeds everything (inline CSS and SVG, no scripts, no CDN), so it can be mailed,
attached to an issue or opened offline years later. Its charts: predicted step time of every
option across a log-spaced bandwidth sweep (10 Mbit/s to 400 Gbit/s) with the what-if
bandwidth marked, and gradient bytes per layer colored by what the adaptive plan does with them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from autocomp.advisor.profile import LinkMeasurement, ModelProfile, Profile
from autocomp.advisor.units import format_bandwidth, format_bytes, format_seconds
from autocomp.advisor.whatif import Evaluation, Verdict, WhatIfModel

__all__ = [
    "REPORT_VERSION",
    "SWEEP_MAX_BITS",
    "SWEEP_MIN_BITS",
    "Advice",
    "render_html",
    "render_terminal",
    "sweep_bandwidths",
    "to_json",
]

REPORT_VERSION = 1
"""Version of the JSON written by ``recommend --json``."""
SWEEP_MIN_BITS = 10e6
"""Low end of the HTML bandwidth sweep (10 Mbit/s)."""
SWEEP_MAX_BITS = 400e9
"""High end of the HTML bandwidth sweep (400 Gbit/s)."""

_COLORS = (
    "#444444",
    "#1f77b4",
    "#2ca02c",
    "#17becf",
    "#9467bd",
    "#ff7f0e",
    "#d62728",
    "#e377c2",
    "#8c564b",
)


def sweep_bandwidths(points: int = 33) -> list[float]:
    """Log-spaced bandwidths in bytes/s from 10 Mbit/s to 400 Gbit/s inclusive."""
    if points < 2:
        raise ValueError("a sweep needs at least 2 points")
    low, high = math.log(SWEEP_MIN_BITS), math.log(SWEEP_MAX_BITS)
    return [math.exp(low + (high - low) * i / (points - 1)) / 8 for i in range(points)]


@dataclass(slots=True, kw_only=True)
class Advice:
    """Everything ``recommend`` computed, ready to render."""

    profile: Profile
    profile_path: str
    model: WhatIfModel
    evaluation: Evaluation
    verdict: Verdict
    latency_source: str
    """Where the latency came from ('--latency', 'measured on the profiling link', ...)."""
    sweep_bandwidths: list[float] = field(default_factory=list)
    sweep: dict[str, list[float]] = field(default_factory=dict)
    plan_path: str | None = None
    cost_path: str | None = None
    model_requested: bool = False
    """The model was chosen with ``--model`` (else: the one with the most gradient bytes)."""


# ---- JSON ------------------------------------------------------------------------------------


def to_json(advice: Advice) -> dict[str, Any]:
    """The whole advice as a JSON-friendly dict (``recommend --json``)."""
    model = advice.model.model
    profile = advice.profile
    evaluation = advice.evaluation
    adaptive = _adaptive_plan(evaluation)
    total = model.total_bytes or 1
    return {
        "autocomp_advice_version": REPORT_VERSION,
        "profile": {
            "path": advice.profile_path,
            "created": profile.created,
            "complete": profile.complete,
            "status": profile.status,
            "notes": list(profile.notes),
            "script": profile.script.to_dict(),
            "world_size": profile.world_size,
            "link": None if profile.link is None else _link_summary(profile),
            "model": {
                "index": model.index,
                "module_class": model.module_class,
                "layers": len(model.layers),
                "buckets": len(model.buckets),
                "gradient_bytes": model.total_bytes,
                "timing": model.timing.to_dict(),
            },
            "models_in_profile": len(profile.models),
        },
        "scenario": evaluation.scenario.to_dict(),
        "latency_source": advice.latency_source,
        "policy": advice.model.rules.name,
        "target_overlap": advice.model.target_overlap,
        "compute_step_s": evaluation.compute_step_s,
        "options": [r.to_dict(with_plan=False) for r in evaluation.results],
        "verdict": advice.verdict.to_dict(),
        "adaptive_decision": None if evaluation.decision is None else evaluation.decision.to_dict(),
        "layers": [
            {
                "name": layer.name,
                "shape": list(layer.shape),
                "bytes": layer.sent_bytes,
                "fraction": layer.sent_bytes / total,
                "bucket": layer.bucket,
                "adaptive": adaptive.get(layer.name, "none"),
            }
            for layer in model.layers
        ],
        "sweep": {
            "bandwidth_bytes_per_s": advice.sweep_bandwidths,
            "step_s": advice.sweep,
        },
        "plan_out": advice.plan_path,
        "cost_model_out": advice.cost_path,
    }


def _link_summary(profile: Profile) -> dict[str, Any]:
    link = profile.link
    assert link is not None
    return {
        "bandwidth_bytes_per_s": link.bandwidth_bytes_per_s,
        "latency_s": link.latency_s,
        "rel_residual": link.rel_residual,
        "world_size": link.world_size,
        "contention_seconds_per_byte": link.contention_seconds_per_byte,
        "half_sum_seconds_per_element": dict(link.half_sum_seconds_per_element),
    }


def _machine_costs(link: LinkMeasurement) -> str:
    """The profiling machine's costs beside the link, when measured and not zero."""
    parts = []
    if link.contention_seconds_per_byte > 0:
        parts.append(
            f"a transfer takes {link.contention_seconds_per_byte * 1e9:.2g} ns of compute "
            "per byte sent"
        )
    halves = [
        f"{name} +{cost * 1e9:.2g} ns"
        for name, cost in link.half_sum_seconds_per_element
        if cost > 0
    ]
    if halves:
        parts.append("half sums per element: " + ", ".join(halves))
    return f" ({'; '.join(parts)})" if parts else ""


def _adaptive_plan(evaluation: Evaluation) -> dict[str, str]:
    if evaluation.decision is None:
        return {}
    return {d.name: d.spec for d in evaluation.decision.layers}


# ---- terminal --------------------------------------------------------------------------------


def _count(n: int) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _model_choice(advice: Advice) -> str:
    """Which of several DDP models the advice is about, so nobody reads it for another one."""
    profile, model = advice.profile, advice.model.model

    def describe(m: ModelProfile) -> str:
        return f"{m.module_class}, {_count(sum(layer.numel for layer in m.layers))} params"

    how = "as asked" if advice.model_requested else "the one with the most gradient bytes"
    others = "; ".join(f"{m.index} ({describe(m)})" for m in profile.models if m is not model)
    return (
        f"model {model.index} of {len(profile.models)} ({describe(model)}), {how}; "
        f"others: {others}; --model I to choose"
    )


def render_terminal(advice: Advice, console: Console) -> None:
    """Tables and the verdict on ``console`` (rich)."""
    evaluation, verdict, model = advice.evaluation, advice.verdict, advice.model.model
    profile = advice.profile
    link = profile.link
    measured = (
        "link not measured"
        if link is None
        else f"profiled on {format_bandwidth(link.bandwidth_bytes_per_s)}, "
        f"{format_seconds(link.latency_s)}/hop between {link.world_size} ranks"
        + _machine_costs(link)
    )
    console.print(
        f"[bold]{profile.script.path}[/bold]: {model.module_class}, {len(model.layers)} "
        f"layers, {format_bytes(model.total_bytes)} of gradients in {len(model.buckets)} "
        f"buckets; step {format_seconds(model.timing.step_s)} "
        f"(compute only {format_seconds(evaluation.compute_step_s)}), {measured}"
    )
    if len(profile.models) > 1:
        console.print(_model_choice(advice))
    if not profile.complete:
        console.print(f"[yellow]partial profile: {profile.status}[/yellow]")
    scenario = evaluation.scenario
    table = Table(
        title=f"What if: {scenario.describe()} (latency {advice.latency_source})",
        box=box.SIMPLE_HEAVY,
    )
    for name, justify in (
        ("option", "left"),
        ("layers", "right"),
        ("link/rank", "right"),
        ("comm", "right"),
        ("compress", "right"),
        ("exposed", "right"),
        ("step", "right"),
        ("efficiency", "right"),
        ("vs none", "right"),
        ("error", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    chosen = verdict.option
    for result in evaluation.results:
        style = "bold green" if result.key == chosen else None
        table.add_row(
            result.label,
            str(result.compressed_layers),
            format_bytes(result.link_bytes),
            format_seconds(result.comm_s),
            format_seconds(result.compress_s),
            format_seconds(result.exposed_s),
            format_seconds(result.step_s),
            f"{result.efficiency:.0%}",
            f"{result.speedup:.2f}x",
            f"{result.rel_error:.2g}",
            style=style,
        )
    console.print(table)
    color = {"compress": "green", "do_not_compress": "yellow", "in_between": "cyan"}[verdict.kind]
    body = "\n".join(f"- {reason}" for reason in verdict.reasons)
    console.print(
        Panel(body, title=f"[bold {color}]{verdict.headline}[/]", border_style=color, expand=True)
    )
    adaptive = _adaptive_plan(evaluation)
    layers = Table(title="Layers with the most gradient bytes", box=box.SIMPLE)
    layers.add_column("layer")
    layers.add_column("shape")
    layers.add_column("bytes", justify="right")
    layers.add_column("share", justify="right")
    layers.add_column("adaptive plan")
    shapes = {layer.name: layer.shape for layer in model.layers}
    for name, size, share in verdict.top_layers:
        layers.add_row(
            name,
            "x".join(map(str, shapes[name])),
            format_bytes(size),
            f"{share:.0%}",
            adaptive.get(name, "none"),
        )
    console.print(layers)
    for note in profile.notes:
        console.print(f"[dim]note: {note}[/dim]")
    if advice.plan_path:
        console.print(f"plan written to {advice.plan_path} (cost model: {advice.cost_path})")


# ---- HTML ------------------------------------------------------------------------------------


def _log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks within [low, high] on a log axis (decades only when the span is wide)."""
    ticks = []
    start = math.floor(math.log10(low))
    stop = math.ceil(math.log10(high))
    steps = (1.0,) if stop - start > 4 else (1.0, 2.0, 5.0)
    for exponent in range(start, stop + 1):
        for step in steps:
            value = step * 10**exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks


def _line_chart(
    xs_bits: Sequence[float],
    series: Mapping[str, Sequence[float]],
    labels: Mapping[str, str],
    *,
    marker_bits: float,
    ideal_s: float,
    highlight: str | None,
) -> str:
    """Step time (log) against bandwidth (log) as inline SVG, one polyline per option."""
    width, height = 820, 420
    left, right, top, bottom = 70, 190, 20, 50
    plot_w, plot_h = width - left - right, height - top - bottom
    values = [v for ys in series.values() for v in ys if v > 0 and math.isfinite(v)]
    values.append(ideal_s)
    y_low, y_high = min(values) / 1.15, max(values) * 1.15
    x_low, x_high = min(xs_bits), max(xs_bits)

    def sx(x: float) -> float:
        span = math.log(x_high) - math.log(x_low) or 1.0
        return left + plot_w * (math.log(x) - math.log(x_low)) / span

    def sy(y: float) -> float:
        span = math.log(y_high) - math.log(y_low) or 1.0
        return top + plot_h * (1 - (math.log(y) - math.log(y_low)) / span)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'class="chart" role="img" aria-label="step time against bandwidth">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fff" '
        'stroke="#999"/>',
    ]
    for tick in _log_ticks(x_low, x_high):
        x = sx(tick)
        parts.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#eee"/>'
            f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle" '
            f'class="tick">{html.escape(format_bandwidth(tick / 8))}</text>'
        )
    for tick in _log_ticks(y_low, y_high):
        y = sy(tick)
        parts.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" '
            f'class="tick">{html.escape(format_seconds(tick))}</text>'
        )
    ideal_y = sy(ideal_s)
    parts.append(
        f'<line x1="{left}" y1="{ideal_y:.1f}" x2="{left + plot_w}" y2="{ideal_y:.1f}" '
        f'stroke="#000" stroke-dasharray="2,4"><title>compute only (one rank): '
        f"{html.escape(format_seconds(ideal_s))}</title></line>"
    )
    mx = sx(min(max(marker_bits, x_low), x_high))
    parts.append(
        f'<line x1="{mx:.1f}" y1="{top}" x2="{mx:.1f}" y2="{top + plot_h}" stroke="#c00" '
        f'stroke-dasharray="6,4"><title>what-if bandwidth '
        f"{html.escape(format_bandwidth(marker_bits / 8))}</title></line>"
    )
    for index, (key, ys) in enumerate(series.items()):
        color = _COLORS[index % len(_COLORS)]
        points = [
            (sx(x), sy(y), x, y)
            for x, y in zip(xs_bits, ys, strict=True)
            if y > 0 and math.isfinite(y)
        ]
        stroke = 3.5 if key == highlight else 1.8
        dash = ' stroke-dasharray="5,3"' if key == "none" else ""
        path = " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in points)
        parts.append(
            f'<polyline fill="none" stroke="{color}" stroke-width="{stroke}"{dash} '
            f'points="{path}"/>'
        )
        for px, py, x, y in points:
            tip = f"{labels[key]}: {format_seconds(y)} at {format_bandwidth(x / 8)}"
            parts.append(
                f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.2" fill="{color}">'
                f"<title>{html.escape(tip)}</title></circle>"
            )
        ly = top + 14 + index * 18
        parts.append(
            f'<line x1="{left + plot_w + 12}" y1="{ly - 4}" x2="{left + plot_w + 36}" '
            f'y2="{ly - 4}" stroke="{color}" stroke-width="{stroke}"{dash}/>'
            f'<text x="{left + plot_w + 42}" y="{ly}" class="legend">'
            f"{html.escape(labels[key])}</text>"
        )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle" class="axis">'
        "bandwidth per rank (log)</text>"
        f'<text x="16" y="{top + plot_h / 2}" text-anchor="middle" class="axis" '
        f'transform="rotate(-90 16 {top + plot_h / 2})">predicted step time (log)</text>'
        "</svg>"
    )
    return "".join(parts)


def _bar_chart(rows: Sequence[tuple[str, int, float, str]]) -> str:
    """Horizontal bars: gradient bytes per layer (largest first), colored by adaptive spec."""
    width, bar_h, gap, label_w = 820, 16, 4, 300
    height = 20 + len(rows) * (bar_h + gap) + 10
    largest = max((size for _, size, _, _ in rows), default=1) or 1
    specs = sorted({spec for _, _, _, spec in rows})
    palette = {spec: _COLORS[(i + 1) % len(_COLORS)] for i, spec in enumerate(specs)}
    palette["none"] = "#999999"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" class="chart" '
        'role="img" aria-label="gradient bytes per layer">'
    ]
    for index, (name, size, share, spec) in enumerate(rows):
        y = 10 + index * (bar_h + gap)
        bar = (width - label_w - 280) * size / largest
        short = name if len(name) <= 44 else "..." + name[-41:]
        tip = f"{name}: {format_bytes(size)} ({share:.1%}), adaptive plan: {spec}"
        parts.append(
            f'<text x="{label_w - 6}" y="{y + bar_h - 4}" text-anchor="end" class="tick">'
            f"{html.escape(short)}</text>"
            f'<rect x="{label_w}" y="{y}" width="{max(bar, 1):.1f}" height="{bar_h}" '
            f'fill="{palette[spec]}"><title>{html.escape(tip)}</title></rect>'
            f'<text x="{label_w + bar + 6:.1f}" y="{y + bar_h - 4}" class="tick">'
            f"{html.escape(format_bytes(size))} ({share:.0%}) {html.escape(spec)}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, sans-serif; margin: 2em auto;
       max-width: 960px; color: #222; line-height: 1.45; padding: 0 1em; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.8em; }
.verdict { border-left: 6px solid #888; padding: .6em 1em; background: #f6f6f6; }
.compress { border-color: #2a2; } .do_not_compress { border-color: #d90; }
.in_between { border-color: #29c; }
.verdict h2 { margin: 0 0 .4em 0; }
table { border-collapse: collapse; font-size: .9em; width: 100%; }
th, td { padding: .25em .6em; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child { text-align: left; }
tr.chosen td { font-weight: bold; background: #eefbe9; }
.chart { width: 100%; height: auto; }
.tick { font-size: 11px; fill: #444; } .legend { font-size: 12px; fill: #222; }
.axis { font-size: 12px; fill: #222; }
.small { font-size: .85em; color: #555; }
code { background: #f0f0f0; padding: 0 .2em; }
"""


def render_html(advice: Advice) -> str:
    """A self-contained page: verdict, the option table, and the two charts."""
    evaluation, verdict, model = advice.evaluation, advice.verdict, advice.model.model
    profile = advice.profile
    scenario = evaluation.scenario
    esc = html.escape
    labels = {option.key: option.label for option in advice.model.config.options}
    rows = []
    for result in evaluation.results:
        cls = ' class="chosen"' if result.key == verdict.option else ""
        rows.append(
            f"<tr{cls}><td>{esc(result.label)}</td><td>{result.compressed_layers}</td>"
            f"<td>{esc(format_bytes(result.link_bytes))}</td>"
            f"<td>{esc(format_seconds(result.comm_s))}</td>"
            f"<td>{esc(format_seconds(result.compress_s))}</td>"
            f"<td>{esc(format_seconds(result.exposed_s))}</td>"
            f"<td>{esc(format_seconds(result.step_s))}</td>"
            f"<td>{result.efficiency:.0%}</td><td>{result.speedup:.2f}x</td>"
            f"<td>{result.rel_error:.2g}</td></tr>"
        )
    reasons = "".join(f"<li>{esc(reason)}</li>" for reason in verdict.reasons)
    adaptive = _adaptive_plan(evaluation)
    total = model.total_bytes or 1
    ranked = sorted(model.layers, key=lambda layer: (-layer.sent_bytes, layer.name))[:40]
    bars = _bar_chart(
        [
            (
                layer.name,
                layer.sent_bytes,
                layer.sent_bytes / total,
                adaptive.get(layer.name, "none"),
            )
            for layer in ranked
        ]
    )
    more = len(model.layers) - len(ranked)
    line = ""
    if advice.sweep:
        line = _line_chart(
            [b * 8 for b in advice.sweep_bandwidths],
            advice.sweep,
            labels,
            marker_bits=scenario.bandwidth_bytes_per_s * 8,
            ideal_s=evaluation.compute_step_s,
            highlight=verdict.option,
        )
    link = profile.link
    measured = (
        "not measured (one rank)"
        if link is None
        else f"{format_bandwidth(link.bandwidth_bytes_per_s)}, "
        f"{format_seconds(link.latency_s)}/hop between {link.world_size} ranks"
    )
    timing = model.timing
    notes = "".join(f"<li>{esc(note)}</li>" for note in profile.notes)
    plan = (
        f"<p>Plan written to <code>{esc(advice.plan_path)}</code>, cost model to "
        f"<code>{esc(advice.cost_path or '')}</code>.</p>"
        if advice.plan_path
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>autocomp advisor: {esc(profile.script.path)}</title>
<style>{_CSS}</style></head>
<body>
<h1>autocomp advisor: <code>{esc(profile.script.path)}</code></h1>
<p class="small">What if: <b>{esc(scenario.describe())}</b> (latency {esc(advice.latency_source)}),
adaptive target overlap {advice.model.target_overlap:g}, policy {esc(advice.model.rules.name)}.
Profile <code>{esc(advice.profile_path)}</code> of {profile.created}, {esc(profile.status)}.</p>
<div class="verdict {verdict.kind}"><h2>{esc(verdict.headline)}</h2><ul>{reasons}</ul></div>
<h2>Options</h2>
<table><tr><th>option</th><th>layers</th><th>link/rank</th><th>comm</th><th>compress</th>
<th>exposed</th><th>step</th><th>efficiency</th><th>vs none</th><th>error</th></tr>
{"".join(rows)}</table>
<p class="small">link/rank: bytes each rank sends per step (ring all-reduce 2(N-1)/N of the
payload, all-gather N-1 payloads). comm: collectives plus decode. compress: sending-side work
on the backward's thread. exposed: communication left after the backward. efficiency:
compute-only step / predicted step. error: gradient-weighted relative error in use (under
error feedback).</p>
<h2>Step time against bandwidth ({scenario.world_size} ranks,
{esc(format_seconds(scenario.latency_s))}/hop)</h2>
{line}
<p class="small">Dotted black: compute only (perfect scaling). Dashed red: the what-if
bandwidth. Hover a point for its value.</p>
<h2>Gradient bytes per layer</h2>
{bars}
<p class="small">{len(ranked)} largest of {len(model.layers)} layers
{f"({more} smaller ones not drawn)" if more > 0 else ""}; colors show the adaptive plan.</p>
<h2>Profile</h2>
<ul class="small">
<li>{esc(model.module_class)}: {len(model.layers)} layers, {esc(format_bytes(model.total_bytes))}
of gradients in {len(model.buckets)} buckets</li>
<li>step {esc(format_seconds(timing.step_s))}, forward {esc(format_seconds(timing.forward_s))},
backward {esc(format_seconds(timing.backward_s))} (hideable
{esc(format_seconds(timing.hideable_s))}), compute only
{esc(format_seconds(timing.compute_step_s))}, over {timing.steps_used} steps</li>
<li>profiling link: {esc(measured)}</li>
{notes}
</ul>
{plan}
</body></html>
"""
