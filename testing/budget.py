"""The budgets' windows are the wall clock's hours and days (``gateway_plugin.books.ledger``): a
test that reads what its requests add to one must not straddle the hour's roll, which empties it."""

from __future__ import annotations

import time

from gateway_plugin.books.ledger import HOUR


def clear_of_the_hours_end(margin_s: float = 60.0) -> None:
    """Returns once at least ``margin_s`` of the wall clock's hour are left, waiting for the next
    hour when fewer are (a day ends with an hour, so its budget is clear too)."""
    left = HOUR - time.time() % HOUR
    if left < margin_s:
        time.sleep(left + 0.5)
