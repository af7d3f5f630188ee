"""The advice: whether compression pays in a scenario, and the reasons in plain words.

The what-if model (:mod:`autocomp.advisor.whatif`) predicts numbers; this module turns one
scenario's predictions into a verdict -- compress (and with what), do not compress, or in
between -- using the thresholds of :class:`~autocomp.advisor.whatif.WhatIfModel.Config`. It
is kept apart because the wording and the thresholds change for reasons of their own (what
users misread), while the model changes only when the timeline arithmetic does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from autocomp.advisor.units import format_bytes, format_seconds
from autocomp.compressors import Collective
from autocomp.link_model import latency_hops

if TYPE_CHECKING:
    from autocomp.advisor.whatif import Evaluation, WhatIfModel

__all__ = ["DO_NOT_COMPRESS_COSTLY", "DO_NOT_COMPRESS_HIDDEN", "Verdict", "judge"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """The advice, with the numbers behind it."""

    kind: Literal["compress", "do_not_compress", "in_between"]
    headline: str
    option: str | None
    """Key of the recommended compressed option (None when compression does not pay)."""
    reasons: tuple[str, ...]
    top_layers: tuple[tuple[str, int, float], ...]
    """(name, bytes, fraction of all gradient bytes), largest first."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "headline": self.headline,
            "option": self.option,
            "reasons": list(self.reasons),
            "top_layers": [{"name": n, "bytes": b, "fraction": f} for n, b, f in self.top_layers],
        }


DO_NOT_COMPRESS_HIDDEN = (
    "compression does not pay: the link hides the communication; with memory the real "
    "constraint, consider FSDP/ZeRO"
)
DO_NOT_COMPRESS_COSTLY = (
    "compression does not pay: compressing costs more than the wire time it saves; "
    "with memory the real constraint, consider FSDP/ZeRO"
)


def judge(whatif: WhatIfModel, evaluation: Evaluation) -> Verdict:
    """compress / does not pay / in between, with reasons (thresholds in ``whatif.config``)."""
    cfg = whatif.config
    none = evaluation.results[0]
    compressed = [r for r in evaluation.results[1:] if r.compressed_layers > 0]
    top = whatif.top_layers()
    compute = evaluation.compute_step_s
    reasons = [
        f"uncompressed: {format_seconds(none.comm_s)} of communication per step "
        f"({format_bytes(none.link_bytes)} per rank on the link), "
        f"{format_seconds(none.exposed_s)} of it exposed after the backward "
        f"(overlap {none.overlap:.0%}); step {format_seconds(none.step_s)} against "
        f"{format_seconds(compute)} on one rank (efficiency {none.efficiency:.0%})",
        f"the backward leaves {format_seconds(whatif.model.timing.hideable_s)} after the "
        f"first bucket is ready for communication to hide behind",
    ]
    scenario = evaluation.scenario
    hops = latency_hops(Collective.ALL_REDUCE, scenario.world_size)
    latency = len(whatif.model.buckets) * hops * scenario.latency_s
    if none.comm_s > 0 and latency >= 0.5 * none.comm_s:
        reasons.append(
            f"{format_seconds(latency)} of the uncompressed communication is latency "
            f"({len(whatif.model.buckets)} buckets x {hops} ring hops x "
            f"{format_seconds(scenario.latency_s)}); compression cannot shrink latency, "
            "fewer buckets (a larger bucket_cap_mb) can"
        )
    last = max(whatif.model.buckets, key=lambda b: (b.ready_s, b.index))
    last_share = last.bytes / max(1, sum(b.bytes for b in whatif.model.buckets))
    exposed_matters = none.exposed_s > cfg.hidden_fraction * none.step_s
    if exposed_matters and len(whatif.model.buckets) > 0 and last_share >= 0.5:
        reasons.append(
            f"{last_share:.0%} of the gradient bytes are in the last bucket, ready only when "
            "the backward ends, so their communication cannot overlap with it; a smaller "
            "bucket_cap_mb (a DDP argument) would let more of it start earlier"
        )
    top_text = ", ".join(f"{name} {share:.0%}" for name, _, share in top)
    reasons.append(f"bytes are dominated by: {top_text}")
    if not compressed:
        return Verdict(
            kind="do_not_compress",
            headline="compression does not apply: no layer is large enough to compress",
            option=None,
            reasons=tuple(reasons),
            top_layers=top,
        )
    # Only what the policy could run is advised (its candidates, and the adaptive plan); a
    # faster option it leaves out on evidence is named, not recommended.
    offered_keys = {o.key for o in whatif.config.options if whatif.offered(o)}
    eligible = [r for r in compressed if r.key in offered_keys] or compressed
    fastest = min(eligible, key=lambda r: (r.step_s, r.rel_error))
    near = [r for r in eligible if r.step_s <= fastest.step_s * (1 + whatif.near_best)]
    choice = min(near, key=lambda r: (r.rel_error, r.step_s))
    # Progress per second decides, as in the engine's search: a slower, more accurate option
    # outside the near-best band wins when its error costs that much less of each step's
    # progress. Like the engine's ascent it only climbs towards accuracy: the band already
    # chose least error among the equally fast, and rate alone would undo that.
    accurate = [r for r in eligible if r.progress >= choice.progress]
    by_rate = max(accurate, key=lambda r: (r.progress / r.step_s, -r.rel_error))
    if by_rate.progress / by_rate.step_s > choice.progress / choice.step_s:
        choice = by_rate
    gain = none.step_s / choice.step_s - 1.0
    detail = (
        f"{choice.label}: step {format_seconds(choice.step_s)} ({gain:+.0%} throughput "
        f"against uncompressed), efficiency {choice.efficiency:.0%}, "
        f"{format_bytes(choice.link_bytes)} per rank on the link, compression work "
        f"{format_seconds(choice.compress_s)}, gradient-weighted error in use "
        f"{choice.rel_error:.2g}"
    )
    if choice is not fastest and choice in near:
        detail += (
            f"; {fastest.label} is fastest ({format_seconds(fastest.step_s)}) but loses "
            f"more of the gradient (error {fastest.rel_error:.2g}), and is within "
            f"{whatif.near_best:.0%}"
        )
    elif choice is not fastest:
        detail += (
            f"; {fastest.label} is fastest ({format_seconds(fastest.step_s)}) but a step of "
            f"it delivers {fastest.progress:.0%} of an uncompressed step's progress against "
            f"{choice.progress:.0%}, so it learns less per second"
        )
    reasons.append(detail)
    left_out = [r for r in compressed if r not in eligible and r.step_s < choice.step_s]
    if left_out:
        quicker = min(left_out, key=lambda r: r.step_s)
        reasons.append(
            f"{quicker.label} predicts a shorter step ({format_seconds(quicker.step_s)}) but "
            f"is not among the {whatif.rules.name} policy's candidates, so the adaptive "
            "controller would not run it (docs/policy.md says why the default preset stops "
            "at PowerSGD rank 4: rank 1 learned less per second in training)"
        )
    gathered = [
        r.label for r in compressed if r.key.startswith("topk") and r.link_bytes > none.link_bytes
    ]
    if gathered:
        reasons.append(
            f"{', '.join(gathered)} send more than uncompressed at "
            f"{evaluation.scenario.world_size} ranks: top-k payloads are all-gathered, so "
            "every rank receives N-1 of them"
        )
    # What the choice's error costs per step (the policy's error_cost, docs/policy.md): its
    # shorter step must buy that back, as the engine requires of its own plans.
    progress_cost = 1.0 - choice.progress
    shorter = 1.0 - choice.step_s / none.step_s if none.step_s > 0 else 0.0
    pays_for_error = shorter >= progress_cost
    if not pays_for_error:
        reasons.append(
            f"{choice.label} shortens the step by {shorter:.0%}, less than the "
            f"{progress_cost:.0%} of per-step progress its error costs (error_cost "
            f"{whatif.rules.error_cost:g} x the mean squared error, weighed as the engine "
            "weighs it)"
        )
    if gain >= cfg.compress_gain and pays_for_error:
        return Verdict(
            kind="compress",
            headline=f"compress with {choice.label}",
            option=choice.key,
            reasons=tuple(reasons),
            top_layers=top,
        )
    if gain < cfg.min_gain:
        hidden = none.exposed_s <= cfg.hidden_fraction * none.step_s
        return Verdict(
            kind="do_not_compress",
            headline=DO_NOT_COMPRESS_HIDDEN if hidden else DO_NOT_COMPRESS_COSTLY,
            option=None,
            reasons=tuple(reasons),
            top_layers=top,
        )
    return Verdict(
        kind="in_between",
        headline=f"in between: benchmark both (uncompressed and {choice.label})",
        option=choice.key,
        reasons=(
            *reasons,
            f"a predicted gain of {gain:.1%} is between the {cfg.min_gain:.0%} noise level "
            f"and the {cfg.compress_gain:.0%} needed to recommend compression"
            if pays_for_error
            else f"a predicted gain of {gain:.1%} does not buy back what the error costs per "
            "step; the adaptive policy would stay uncompressed here",
        ),
        top_layers=top,
    )
