"""Shape buckets: the few padded sizes the compiled step is specialised for.

Every distinct (batch, new tokens, context) shape costs one XLA compile (1-3 s on a small
CPU; cached on disk across restarts), and decode time follows the *padded* context length,
so decode batches and decode contexts are rounded up to powers of two. Prefill time follows
its padded new tokens (a 140-token prompt padded to 512 took 2x as long as padded to 256), so
chunk lengths step by 2x too; its context matters little, so prefill contexts step by 4x.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


def _pow2_upto(lo: int, hi: int, factor: int = 2) -> tuple[int, ...]:
    out, v = [], lo
    while v < hi:
        out.append(v)
        v *= factor
    out.append(hi)
    return tuple(sorted(set(out)))


def _with_midpoints(values: tuple[int, ...], lo: int, step: int) -> tuple[int, ...]:
    """``values`` plus the 1.5x midpoint of each pair of neighbours >= ``lo`` (kept to
    multiples of ``step``): decode cost follows the padded context, and a context of 130
    padded to 256 costs 1.7x one padded to 192 at batch 32."""
    mids = {
        a + a // 2
        for a, b in itertools.pairwise(values)
        if a >= lo and b == 2 * a and (a // 2) % step == 0
    }
    return tuple(sorted({*values, *mids}))


def round_up(value: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= value; ValueError when value exceeds the largest."""
    for b in buckets:
        if b >= value:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class Buckets:
    """Allowed padded sizes for decode batches, prefill rows/chunk lengths and contexts."""

    decode_batch: tuple[int, ...]
    prefill_rows: tuple[int, ...]
    prefill_len: tuple[int, ...]
    context: tuple[int, ...]  # decode contexts
    prefill_context: tuple[int, ...] = ()  # empty = same as ``context``

    @property
    def prefill_ctx(self) -> tuple[int, ...]:
        return self.prefill_context or self.context

    @classmethod
    def build(
        cls,
        max_batch: int,
        max_model_len: int,
        chunk: int,
        min_decode_batch: int = 1,
        block_size: int = 16,
    ) -> Buckets:
        """Decode batch ``min_decode_batch..max_batch`` in powers of two; decode contexts
        ``64..max_model_len`` in powers of two plus the 1.5x steps from 128 on (192, 384, ...);
        prefill chunks ``32..chunk`` in powers of two with up to 8 rows, and prefill contexts
        ``256..max_model_len`` in powers of four (0 = no context)."""
        lo_ctx = max(64, block_size)
        return cls(
            decode_batch=_pow2_upto(min(min_decode_batch, max_batch), max_batch),
            prefill_rows=_pow2_upto(1, min(8, max_batch)),
            prefill_len=_pow2_upto(min(32, chunk), chunk),
            context=(
                0,
                *_with_midpoints(
                    _pow2_upto(min(lo_ctx, max_model_len), max_model_len), 128, block_size
                ),
            ),
            prefill_context=(0, *_pow2_upto(min(4 * lo_ctx, max_model_len), max_model_len, 4)),
        )

    def override(
        self,
        decode_batch: tuple[int, ...] = (),
        prefill_rows: tuple[int, ...] = (),
        prefill_len: tuple[int, ...] = (),
        context: tuple[int, ...] = (),
    ) -> Buckets:
        """Replace the given sets (empty = keep). The largest decode batch, chunk length and
        context must stay reachable; fewer prefill rows per step are fine."""

        def pick(
            new: tuple[int, ...], old: tuple[int, ...], reach: bool = True, zero: bool = False
        ) -> tuple[int, ...]:
            if not new:
                return old
            vals = sorted({*new, *((0,) if zero else ())})
            if vals[0] < 0 or (reach and vals[-1] < old[-1]):
                raise ValueError(f"buckets {new} must be >= 0 and reach {old[-1]}")
            return tuple(vals)

        return Buckets(
            pick(decode_batch, self.decode_batch),
            pick(prefill_rows, self.prefill_rows, reach=False),
            pick(prefill_len, self.prefill_len),
            pick(context, self.context, zero=True),
            pick(context, self.prefill_ctx, zero=True),
        )
