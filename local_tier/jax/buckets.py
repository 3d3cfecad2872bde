"""Shape buckets: the few padded sizes the compiled step is specialised for.

Every distinct (batch, new tokens) shape costs one XLA compile (1-4 s on a small CPU; cached
on disk across restarts). Decode batches and prefill chunk lengths are rounded up to powers
of two (prefill time follows its padded new tokens: a 140-token prompt padded to 512 took 2x
as long as padded to 256). The context is not a bucket: every step carries the whole block
table (``context`` tokens, ``max_model_len`` rounded up to whole blocks) and attention reads
only the chunks the rows' contexts fill (``attention.py``), so one executable per
(batch, new tokens) serves every context length.
"""

from __future__ import annotations

from dataclasses import dataclass


def _pow2_upto(lo: int, hi: int) -> tuple[int, ...]:
    out, v = [], lo
    while v < hi:
        out.append(v)
        v *= 2
    out.append(hi)
    return tuple(sorted(set(out)))


def round_up(value: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= value; ValueError when value exceeds the largest."""
    for b in buckets:
        if b >= value:
            return b
    raise ValueError(f"{value} exceeds the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class Buckets:
    """Allowed padded sizes for decode batches and prefill rows/chunk lengths, and the block
    table's width in tokens (``context``), the same for every step."""

    decode_batch: tuple[int, ...]
    prefill_rows: tuple[int, ...]
    prefill_len: tuple[int, ...]
    context: int

    @classmethod
    def build(
        cls,
        max_batch: int,
        max_model_len: int,
        chunk: int,
        min_decode_batch: int = 1,
        block_size: int = 16,
    ) -> Buckets:
        """Decode batch ``min_decode_batch..max_batch`` in powers of two; prefill chunks
        ``32..chunk`` in powers of two with up to 8 rows; a block table of ``max_model_len``
        tokens rounded up to whole blocks."""
        return cls(
            decode_batch=_pow2_upto(min(min_decode_batch, max_batch), max_batch),
            prefill_rows=_pow2_upto(1, min(8, max_batch)),
            prefill_len=_pow2_upto(min(32, chunk), chunk),
            context=-(-max_model_len // block_size) * block_size,
        )

    def override(
        self,
        decode_batch: tuple[int, ...] = (),
        prefill_rows: tuple[int, ...] = (),
        prefill_len: tuple[int, ...] = (),
    ) -> Buckets:
        """Replace the given sets (empty = keep). The largest decode batch and chunk length
        must stay reachable; fewer prefill rows per step are fine."""

        def pick(new: tuple[int, ...], old: tuple[int, ...], reach: bool = True) -> tuple[int, ...]:
            if not new:
                return old
            vals = sorted(set(new))
            if vals[0] < 1 or (reach and vals[-1] < old[-1]):
                raise ValueError(f"buckets {new} must be >= 1 and reach {old[-1]}")
            return tuple(vals)

        return Buckets(
            pick(decode_batch, self.decode_batch),
            pick(prefill_rows, self.prefill_rows, reach=False),
            pick(prefill_len, self.prefill_len),
            self.context,
        )
