"""One rank's collective log: the compute / collective split, exact with hand-fed clock readings."""
from __future__ import annotations

from tracetorch.distributed.collectives import CollectiveLog


def test_the_first_collective_aligns_and_overlapping_ones_count_once():
    log = CollectiveLog()
    log.start(0)                                   # not aligned yet: nothing counts
    log.issued(10, "", "broadcast", 8)
    log.completed("", "broadcast", 10, 30)         # the ranks' clocks agree from here
    log.issued(50, "backward", "all_reduce", 16, asynchronous=True)   # 20 ns of compute
    log.issued(60, "backward", "all_reduce", 16, asynchronous=True)
    log.completed("backward", "all_reduce", 50, 70)
    log.completed("backward", "all_reduce", 60, 90)   # in flight 50..90: 40 ns, once
    log.stop(100)                                  # 10 ns more compute
    log.start(200)                                 # entered again: 50 ns more
    log.stop(250)
    facts = log.facts()
    assert (facts["aligned_by"], facts["aligned_at_ns"]) == ("first collective", 30)
    assert (facts["compute_ns"], facts["collective_ns"], facts["elapsed_ns"]) == (80, 40, 120)
    broadcast, all_reduce = facts["collectives"]
    assert (broadcast["op"], broadcast["calls"], broadcast["async_calls"]) == ("broadcast", 1, 0)
    assert broadcast["time"]["total_ns"] == 20
    assert (all_reduce["path"], all_reduce["calls"], all_reduce["bytes"]) == ("backward", 2, 32)
    assert (all_reduce["async_calls"], all_reduce["time"]["total_ns"]) == (2, 50)


def test_a_barrier_aligns_and_compute_waits_for_the_collective_in_flight():
    log = CollectiveLog()
    log.issued(0, "", "all_reduce", 4)             # issued before the clocks were aligned
    log.align(5, "barrier")                        # aligned while it is in flight
    log.completed("", "all_reduce", 0, 20)         # compute runs from its completion
    log.stop(50)
    facts = log.facts()
    assert (facts["aligned_by"], facts["aligned_at_ns"]) == ("barrier", 5)
    assert (facts["compute_ns"], facts["elapsed_ns"]) == (30, 45)
