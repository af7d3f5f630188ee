"""Tier 1: pure unit, no processes.

``autocomp.fsdp_order.ModuleOrderCheck`` on its own: which backwards run the check, that the
hash tells orders apart (a swap, a module moved to the end, a backward split in two) and
forgets a backward that did not finish, and that bad settings raise. The check across ranks
is tier 2, in ``tests/test_fsdp.py``.
"""

from __future__ import annotations

import pytest

from autocomp.fsdp_order import ModuleOrderCheck

NAMES = ["first", "gated", "gated.branch", "last"]


def hashed(*backwards: list[int]) -> int:
    check = ModuleOrderCheck(NAMES, [], every=10)
    for order in backwards:
        for index in order:
            check.record(index)
        check.end_backward()
    return check._hash


def test_due_every_n_backwards_from_the_first_n() -> None:
    check = ModuleOrderCheck(NAMES, [], every=3)
    assert [step for step in range(10) if check.due(step)] == [3, 6, 9]
    assert not any(ModuleOrderCheck(NAMES, [], every=0).due(step) for step in range(10))


def test_the_hash_tells_orders_apart() -> None:
    same = hashed([3, 2, 1, 0], [3, 2, 1, 0])
    assert same == hashed([3, 2, 1, 0], [3, 2, 1, 0])
    assert same != hashed([3, 1, 2, 0], [3, 2, 1, 0])  # a swap
    assert same != hashed([3, 1, 0, 2], [3, 2, 1, 0])  # a module moved to the end
    assert same != hashed([3, 2], [1, 0], [3, 2, 1, 0])  # the same modules in two backwards
    assert 0 <= same < 2**61


def test_an_unfinished_backward_is_forgotten_and_a_check_starts_afresh() -> None:
    check = ModuleOrderCheck(NAMES, [], every=2)
    check.record(3)
    check.abandon()
    check.end_backward()
    assert check._hash == 0
    for index in (3, 2, 1, 0):
        check.record(index)
    check.end_backward()
    assert check._hash == hashed([3, 2, 1, 0])
    check.check(2)  # no groups: nothing to compare with; the hash restarts
    assert check._hash == 0


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError, match="order_check_every"):
        ModuleOrderCheck(NAMES, [], every=-1)
