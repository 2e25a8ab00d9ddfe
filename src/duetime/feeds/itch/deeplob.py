"""DeepLobWindow: the last N book snapshots as a DeepLOB input tensor, kept in a ring buffer so
that each event costs one row write (O(4·levels)), not a rebuild of the window (O(N·4·levels)).

Zhang, Zohren & Roberts, "DeepLOB: Deep Convolutional Neural Networks for Limit Order Books",
IEEE Trans. Signal Processing 67(11), 2019. Their input is the last 100 events x 10 levels x
(price, size) x both sides, one row per event in the column order
[ask_p1, ask_s1, bid_p1, bid_s1, ask_p2, ask_s2, bid_p2, bid_s2, ..., bid_s10].

Rows are stored with raw prices (Price(4) units, exact in float64) and sizes already as
log1p(shares); prices are normalised only when `tensor()` is asked for, because their reference
is the *current* mid: every row of the window is expressed relative to the same price, so the
model sees how the book moved over the window (normalising each row by its own mid would erase
exactly that).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from duetime.feeds.itch.book import Level

DEFAULT_TICK = 100
"""One cent in ITCH Price(4) units: the tick of every US stock priced at $1 or more."""


def lob_row(
    bids: Sequence[Level], asks: Sequence[Level], levels: int, tick: int, anchor: int
) -> list[float]:
    """One stored DeepLOB row: [ask_p1, log1p(ask_s1), bid_p1, log1p(bid_s1), ...], prices raw
    Price(4), `levels` levels per side.

    `bids`/`asks` are best first and hold at most `levels` levels. A missing level continues
    the ladder one `tick` further out from the level before it, with size 0. That is true of
    the book, not a guess: depth lists only non-empty levels, so once a side's list ends there
    are no shares at any price beyond it. A side with no levels at all starts one tick beyond
    the opposite best price (an ask ladder from bid+tick up, a bid ladder from ask-tick down);
    with both sides empty, the ladders start one tick either side of `anchor` (the last
    reference price). The prices stay strictly monotone, so a convolution over levels sees a
    well-formed ladder whatever the book holds.

    Sizes are logged here, once per event, rather than over the whole window in `tensor()`.
    """
    log1p = math.log1p
    row: list[float] = []
    extend = row.extend
    if len(asks) >= levels and len(bids) >= levels:  # the common case: both sides full
        for a, b in zip(asks, bids, strict=False):
            extend((a[0], log1p(a[1]), b[0], log1p(b[1])))
        return row
    ask_p = [level[0] for level in asks[:levels]]
    ask_s = [log1p(level[1]) for level in asks[:levels]]
    bid_p = [level[0] for level in bids[:levels]]
    bid_s = [log1p(level[1]) for level in bids[:levels]]
    if not ask_p:
        ask_p.append(bid_p[0] + tick if bid_p else anchor + tick)
        ask_s.append(0.0)
    if not bid_p:
        bid_p.append(ask_p[0] - tick if asks else anchor - tick)
        bid_s.append(0.0)
    while len(ask_p) < levels:
        ask_p.append(ask_p[-1] + tick)
        ask_s.append(0.0)
    while len(bid_p) < levels:
        bid_p.append(bid_p[-1] - tick)
        bid_s.append(0.0)
    for i in range(levels):
        extend((ask_p[i], ask_s[i], bid_p[i], bid_s[i]))
    return row


def reference_price(bids: Sequence[Level], asks: Sequence[Level], previous: float) -> float:
    """The price the window is normalised against: the mid when both sides are quoted, the one
    quoted best price when only one is, and `previous` (the last reference) when the book is
    empty."""
    if bids and asks:
        return (bids[0][0] + asks[0][0]) / 2
    if bids:
        return float(bids[0][0])
    if asks:
        return float(asks[0][0])
    return previous


class DeepLobWindow:
    """The last `length` book snapshots of one stock, one `push` per book event.

    Storage is a (2·length, 4·levels) float64 array written with "copy on wrap": rows are
    appended at `_end`, and when the array is full the newest length-1 rows are copied to the
    front in one block. The window is therefore always the contiguous slice
    `[_end - length, _end)` in time order, and the block copy amortises to about one row per
    event. The first push fills the whole window with that first snapshot, as if the book had
    sat still for `length` events, so the tensor is well-formed from the start (`ready` says
    when the window holds only real events).
    """

    def __init__(self, length: int = 100, levels: int = 10, tick: int = DEFAULT_TICK) -> None:
        if length < 1 or levels < 1 or tick < 1:
            raise ValueError(
                f"DeepLobWindow needs length, levels and tick ≥ 1; "
                f"got length={length}, levels={levels}, tick={tick}"
            )
        self.length = length
        self.levels = levels
        self.tick = tick
        self.count = 0
        """Events pushed so far."""
        self.reference = 0.0
        """Price (raw Price(4) units) the tensor is normalised against; see `reference_price`."""
        self._ring = np.zeros((2 * length, 4 * levels), dtype=np.float64)
        self._end = 0
        self._scratch = np.empty((length, 2 * levels), dtype=np.float64)

    @property
    def ready(self) -> bool:
        """True once `length` real events have been pushed (no padding left in the window)."""
        return self.count >= self.length

    def push(self, bids: Sequence[Level], asks: Sequence[Level]) -> None:
        """Record the book after one event: `bids`/`asks` as `depth(side, levels)` gives them."""
        self.reference = reference_price(bids, asks, self.reference)
        row = lob_row(bids, asks, self.levels, self.tick, int(self.reference))
        ring = self._ring
        if self.count == 0:
            ring[: self.length] = row
            self._end = self.length
        else:
            if self._end == len(ring):
                keep = self.length - 1
                ring[:keep] = ring[self._end - keep : self._end]
                self._end = keep
            ring[self._end] = row
            self._end += 1
        self.count += 1

    def tensor(self, out: np.ndarray | None = None) -> np.ndarray:
        """The window as float32 (length, 4·levels), oldest row first, normalised:

        - prices: (p - reference) / tick, i.e. signed ticks from the current mid (so the best
          ask and bid of a one-tick market read +0.5 and -0.5 in the newest row). Ticks rather
          than returns keep the values O(1..10) whatever the stock's price, which is what
          DeepLOB's convolutions over adjacent levels expect;
        - sizes: log1p(shares), bounded (below 22.2 for any 32-bit size) and without running state,
          so a model trained on one day reads another day's sizes on the same scale.

        A new array each call unless `out` (float32, that shape) is given to be filled. Before
        the first push the tensor is all zeros.
        """
        shape = (self.length, 4 * self.levels)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.shape != shape or out.dtype != np.float32:
            raise ValueError(f"out must be float32 {shape}; got {out.dtype} {out.shape}")
        if self.count == 0:
            out.fill(0.0)
            return out
        window = self._ring[self._end - self.length : self._end]
        # The difference is taken in float64 (raw prices exceed float32's exact integers) and
        # only the small result is rounded to float32; contiguous scratch is the fast order.
        scratch = self._scratch
        np.subtract(window[:, 0::2], self.reference, out=scratch)
        scratch *= 1.0 / self.tick
        out[:, 0::2] = scratch
        out[:, 1::2] = window[:, 1::2]
        return out
