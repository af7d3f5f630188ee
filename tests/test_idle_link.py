"""Tier 1: pure unit, no processes.

``autocomp.policy.idle_link.IdleLink``: a compressed window's link reading that moved 2x
from the last uncompressed one is replaced by the uncompressed reading and a probe is asked;
a probe that reads the idle link unchanged keeps the replacement for ``confirm_windows``
windows, one that reads a moved link ends it, a probe that never comes ends it, and the
state survives a checkpoint. The planner-level behaviour (what the engine prices, the probe
it asks for) is in ``tests/test_planner.py``.
"""

from __future__ import annotations

import pytest

from autocomp.link_model import LinkEstimate
from autocomp.policy.idle_link import IdleLink

MB = 1e6


def reading(mb_per_s: float) -> LinkEstimate:
    return LinkEstimate(
        latency_s=5e-5, bandwidth_bytes_per_s=mb_per_s * MB, samples=20, rel_residual=0.05
    )


def test_an_uncompressed_reading_always_counts() -> None:
    idle = IdleLink()
    for window, rate in enumerate((1000, 300, 1000)):
        priced = idle.priced(
            window, reading(rate), compressed=False, reference=True, probe_agrees=None
        )
        assert priced is not None and priced.bandwidth_bytes_per_s == rate * MB
    assert not idle.probe_wanted() and idle.replaced == 0
    assert idle.priced(3, None, compressed=True, reference=True, probe_agrees=None) is None


def test_a_compressed_reading_within_the_link_change_counts() -> None:
    idle = IdleLink()
    idle.priced(0, reading(1000), compressed=False, reference=True, probe_agrees=None)
    priced = idle.priced(1, reading(550), compressed=True, reference=True, probe_agrees=None)
    assert priced is not None and priced.bandwidth_bytes_per_s == 550 * MB
    assert not idle.probe_wanted()


def test_a_moved_compressed_reading_is_replaced_until_a_probe_tells() -> None:
    """The MLP LM on loopback (seed 3): 961 MB/s uncompressed, then 291 MB/s in its first
    PowerSGD window. The decision goes by 961 and asks for a probe; the probe read the idle
    link at its old rate, so the next compressed windows go by 961 too."""
    idle = IdleLink(IdleLink.Config(confirm_windows=3))
    idle.priced(0, reading(961), compressed=False, reference=True, probe_agrees=None)
    priced = idle.priced(1, reading(291), compressed=True, reference=True, probe_agrees=None)
    assert priced is not None and priced.bandwidth_bytes_per_s == 961 * MB
    assert idle.probe_wanted() and not idle.probe_wanted()  # asked once
    # The probe agrees: replaced, and no new probe for confirm_windows windows.
    for window in (2, 3, 4):
        agrees = True if window == 2 else None
        priced = idle.priced(
            window, reading(300), compressed=True, reference=True, probe_agrees=agrees
        )
        assert priced is not None and priced.bandwidth_bytes_per_s == 961 * MB
        assert not idle.probe_wanted(), window
    # The confirmation has aged: the next moved reading asks again (and is still replaced).
    priced = idle.priced(5, reading(300), compressed=True, reference=True, probe_agrees=None)
    assert priced is not None and priced.bandwidth_bytes_per_s == 961 * MB
    assert idle.probe_wanted()
    assert idle.replaced == 5


def test_a_probe_that_reads_a_moved_link_ends_the_replacement() -> None:
    """A link that really slowed while compressed costs one decision on the old rate."""
    idle = IdleLink()
    idle.priced(0, reading(1000), compressed=False, reference=True, probe_agrees=None)
    idle.priced(1, reading(200), compressed=True, reference=True, probe_agrees=None)
    assert idle.probe_wanted()
    priced = idle.priced(2, reading(200), compressed=True, reference=True, probe_agrees=False)
    assert priced is not None and priced.bandwidth_bytes_per_s == 200 * MB
    # The uncompressed reading is forgotten: later compressed readings count as they are.
    priced = idle.priced(3, reading(90), compressed=True, reference=True, probe_agrees=None)
    assert priced is not None and priced.bandwidth_bytes_per_s == 90 * MB
    assert not idle.probe_wanted()


def test_a_probe_that_never_comes_ends_the_replacement() -> None:
    idle = IdleLink()
    idle.priced(0, reading(1000), compressed=False, reference=True, probe_agrees=None)
    assert idle.priced(
        1, reading(300), compressed=True, reference=True, probe_agrees=None
    ) == reading(1000)
    assert idle.probe_wanted()
    priced = idle.priced(2, reading(300), compressed=True, reference=True, probe_agrees=None)
    assert priced is not None and priced.bandwidth_bytes_per_s == 300 * MB
    assert idle.priced(
        3, reading(300), compressed=True, reference=True, probe_agrees=None
    ) == reading(300)


def test_a_reading_back_within_range_clears_the_pending_ask() -> None:
    """An ask answered by readings that came back (no probe needed) is not held against a
    later move: that one asks again rather than giving up."""
    idle = IdleLink()
    idle.priced(0, reading(1000), compressed=False, reference=True, probe_agrees=None)
    idle.priced(1, reading(300), compressed=True, reference=True, probe_agrees=None)
    assert idle.probe_wanted()
    idle.priced(2, reading(800), compressed=True, reference=True, probe_agrees=None)
    assert idle.priced(
        6, reading(300), compressed=True, reference=True, probe_agrees=None
    ) == reading(1000)
    assert idle.probe_wanted()


def test_the_state_survives_a_checkpoint() -> None:
    idle = IdleLink(IdleLink.Config(confirm_windows=4))
    idle.priced(0, reading(1000), compressed=False, reference=True, probe_agrees=None)
    idle.priced(1, reading(300), compressed=True, reference=True, probe_agrees=None)
    idle.priced(2, reading(300), compressed=True, reference=True, probe_agrees=True)
    restored = IdleLink(IdleLink.Config(confirm_windows=4))
    restored.load_state_dict(idle.state_dict())
    assert restored.state_dict() == idle.state_dict()
    assert restored.priced(
        3, reading(300), compressed=True, reference=True, probe_agrees=None
    ) == reading(1000)
    assert not restored.probe_wanted()  # still confirmed


def test_without_a_reference_probe_every_reading_counts() -> None:
    idle = IdleLink()
    idle.priced(0, reading(1000), compressed=False, reference=False, probe_agrees=None)
    priced = idle.priced(1, reading(300), compressed=True, reference=False, probe_agrees=None)
    assert priced == reading(300)
    assert not idle.probe_wanted() and idle.replaced == 0


@pytest.mark.parametrize("kwargs", [{"link_change": 1.0}, {"confirm_windows": 0}])
def test_bad_settings_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        IdleLink.Config(**kwargs)  # type: ignore[arg-type]
