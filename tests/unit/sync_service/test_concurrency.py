from __future__ import annotations

import threading
import time

from sync_service.concurrency import AdaptiveConcurrency


def test_grows_additively_while_answers_are_fast() -> None:
    seen: list[int] = []
    c = AdaptiveConcurrency("s", 8, initial=1, on_change=seen.append)
    for _ in range(10):
        c.observe(0.01, records=100)
    assert 3 <= c.limit <= 5  # about +1 per limit's worth of answers, not +1 per answer
    for _ in range(60):
        c.observe(0.01, records=100)
    assert c.limit == 8  # capped at max_limit
    assert seen[0] == 1 and seen == sorted(seen) and seen[-1] == 8


def test_halves_on_backpressure_once_per_cooldown_and_never_below_one() -> None:
    c = AdaptiveConcurrency("s", 16, initial=16, cooldown_s=0.05)
    c.backpressure()
    c.backpressure()  # within the cooldown: requests in flight answer late, one decrease only
    assert c.limit == 8
    time.sleep(0.06)
    c.backpressure()
    assert c.limit == 4
    for _ in range(10):
        time.sleep(0.051)
        c.backpressure()
    assert c.limit == 1


def test_slow_answer_halves_but_fast_jitter_does_not() -> None:
    c = AdaptiveConcurrency("s", 8, initial=8, slow_floor_s=0.5, cooldown_s=0.0)
    for _ in range(5):
        c.observe(0.01, records=100)
    c.observe(0.2, records=100)  # 20x slower, but under the floor: jitter of a fast target
    assert c.limit == 8
    c.observe(2.0, records=100)  # 200x slower and over the floor: a queue builds up in the target
    assert c.limit == 4


def test_slot_blocks_at_the_limit() -> None:
    c = AdaptiveConcurrency("s", 2, initial=2)
    active, peak = 0, 0
    lock = threading.Lock()

    def work() -> None:
        nonlocal active, peak
        with c.slot():
            with lock:
                active += 1
                peak = max(peak, active)
            time.sleep(0.02)
            with lock:
                active -= 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak == 2 and c.in_use == 0
