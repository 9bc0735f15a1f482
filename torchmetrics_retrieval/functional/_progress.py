"""Progress bars on the long passes (tqdm, on stderr), off unless asked for.

The passes deep in the engine do not take a ``progress`` argument: :func:`shown` switches the bars on for
one call of the public API (a context variable, so concurrent calls in other threads are not affected),
:func:`section` opens one bar for one pass, and the pass's loop reports its work with :func:`advance`.
A bar appears only once its pass has run for :data:`DELAY_SECONDS`, so short passes stay silent.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["DELAY_SECONDS", "advance", "section", "shown"]

#: A pass shorter than this shows no bar.
DELAY_SECONDS = 1.0

_shown: ContextVar[bool] = ContextVar("torchmetrics_retrieval_progress", default=False)
_bar: ContextVar[Any] = ContextVar("torchmetrics_retrieval_progress_bar", default=None)


@contextmanager
def shown(enabled: bool) -> Iterator[None]:
    """Show the bars of the passes run inside the block (``enabled``) or none of them."""
    token = _shown.set(enabled)
    try:
        yield
    finally:
        _shown.reset(token)


@contextmanager
def section(description: str, total: float | None, unit: str = "pair") -> Iterator[None]:
    """One bar for one pass of ``total`` units of work (when bars are shown); the pass calls :func:`advance`."""
    if not _shown.get():
        yield
        return
    from tqdm import tqdm

    bar = tqdm(
        total=total, desc=description, unit=unit, unit_scale=True, delay=DELAY_SECONDS, file=sys.stderr, leave=True
    )
    token = _bar.set(bar)
    try:
        yield
    finally:
        _bar.reset(token)
        bar.close()


def advance(amount: float) -> None:
    """Report ``amount`` units of work done on the open bar (nothing without one)."""
    bar = _bar.get()
    if bar is not None:
        bar.update(amount)
