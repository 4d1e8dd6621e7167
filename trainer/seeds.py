"""The one seed helper: every random stream of a run derives from `spec.seed` here.

A stream is named (``"plan"``, ``"prompts"``, ``"sample"``, ``"humanline"``, ``"quality"``, …) and
indexed by integers (epoch, round, step, rank), so two streams never share a seed by accident
(``seed·P + step`` formulas collide across purposes) and a resumed run recomputes exactly the
seeds it would have used. 31 bits, so every consumer (torch, numpy, vLLM) accepts it.
"""

from __future__ import annotations

import hashlib


def derive_seed(seed: int, stream: str, *index: int) -> int:
    key = ":".join([str(seed), stream, *map(str, index)]).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & 0x7FFF_FFFF
