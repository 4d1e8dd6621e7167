"""The tokenised training set, compact: token ids in one memory-mapped int32 file, a few int64
offsets per sequence, and examples rebuilt on demand.

A training file used to be held whole: every record as Python strings and dicts, then every
example as tuples of Python ints (about 36 bytes a token), about 12× the file's size in RAM.
Now the trainer reads the file a record at a time (contract.data.JsonlReader), tokenises it
as before (the recipe's `build`, a generator), and `TokenStore.add` appends each example's
token ids to an unnamed temporary file: 4 bytes a token, in the page cache rather than the
process's own memory, plus 32 bytes of offsets per sequence and 8 per example. `examples()`
returns a read-only sequence whose item i is the very object the old list held at i (the
recipe's `unpack` rebuilds it from its token sequences and numbers), so the batch plan, every
micro-batch and every loss see exactly what they saw before: same examples, same order, same
seeds.

A prompt that several sequences of one example share (a DPO pair, a GRPO group) is stored once.
"""

from __future__ import annotations

import tempfile
from array import array
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from contract.data import Format, record_at
from trainer.tokenize import TokenSeq

FLUSH_TOKENS = 1 << 16  # token ids buffered before they are written out (256 KiB)
_INT = "i"  # array typecode of np.intc (int32 on every platform we run on)


class Packs(Protocol):
    """What a recipe provides so its examples can be stored: an example as its token
    sequences and a tuple of numbers, and back (the same object, by value)."""

    def pack(self, example: Any) -> tuple[Sequence[TokenSeq], tuple[float, ...]]: ...

    def unpack(self, seqs: list[TokenSeq], numbers: tuple[float, ...]) -> Any: ...


class TokenFile:
    """Token ids appended to an unnamed temporary file (deleted when closed, or when the
    process dies), then memory-mapped for reading."""

    def __init__(self, directory: str | Path | None = None):
        self._file = tempfile.TemporaryFile(prefix="humanline-tokens-", dir=directory)
        self._buffer = array(_INT)
        self._written = 0  # token ids in the file
        self._map: np.ndarray | None = None

    def __len__(self) -> int:
        return self._written + len(self._buffer)

    def append(self, ids: Sequence[int]) -> int:
        """Store `ids`; returns where they start."""
        if self._map is not None:
            raise RuntimeError("the token file is closed for writing once it was read")
        start = len(self)
        self._buffer.extend(ids)
        if len(self._buffer) >= FLUSH_TOKENS:
            self._flush()
        return start

    def _flush(self) -> None:
        self._buffer.tofile(self._file)
        self._written += len(self._buffer)
        self._buffer = array(_INT)

    def ids(self, start: int, n: int) -> list[int]:
        if self._map is None:
            self._flush()
            self._file.flush()
            self._map = (
                np.memmap(self._file, dtype=np.intc, mode="r", shape=(self._written,))
                if self._written
                else np.zeros(0, dtype=np.intc)
            )
        return self._map[start : start + n].tolist()

    def close(self) -> None:
        self._map = None
        self._file.close()


class PromptIds(Sequence):
    """Token-id lists (the rendered prompts of an online job), item i as appended i-th."""

    def __init__(self, directory: str | Path | None = None):
        self.file = TokenFile(directory)
        self._starts = array("q", [0])

    def append(self, ids: Sequence[int]) -> None:
        self.file.append(ids)
        self._starts.append(len(self.file))

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"prompt {i} of {len(self)}")
        start = self._starts[i]
        return self.file.ids(start, self._starts[i + 1] - start)

    def close(self) -> None:
        self.file.close()


class TokenStore:
    """Append examples, then read them back by index (`examples()`)."""

    def __init__(self, recipe: Packs, directory: str | Path | None = None):
        self.recipe = recipe
        self.file = TokenFile(directory)
        # per sequence: prompt start, prompt length, completion start, completion length
        self._seqs = array("q")
        self._first_seq = array("q", [0])  # per example: index of its first sequence (+ end)
        self._numbers = array("d")
        self._first_number = array("q", [0])

    def __len__(self) -> int:
        return len(self._first_seq) - 1

    @property
    def tokens(self) -> int:
        return len(self.file)

    def add(self, example: Any) -> None:
        seqs, numbers = self.recipe.pack(example)
        last_prompt: tuple[int, ...] | None = None
        prompt_at = 0
        for seq in seqs:
            if seq.prompt_ids != last_prompt:
                prompt_at = self.file.append(seq.prompt_ids)
                last_prompt = seq.prompt_ids
            completion_at = self.file.append(seq.completion_ids)
            self._seqs.extend(
                (prompt_at, len(seq.prompt_ids), completion_at, len(seq.completion_ids))
            )
        self._first_seq.append(len(self._seqs) // 4)
        self._numbers.extend(numbers)
        self._first_number.append(len(self._numbers))

    def extend(self, examples: Iterable[Any]) -> TokenStore:
        for example in examples:
            self.add(example)
        return self

    def examples(self) -> StoredExamples:
        """The stored examples as a read-only sequence (no more can be added)."""
        return StoredExamples(self)

    def sequence(self, k: int) -> TokenSeq:
        p, pn, c, cn = self._seqs[4 * k : 4 * k + 4]
        return TokenSeq(tuple(self.file.ids(p, pn)), tuple(self.file.ids(c, cn)))

    def example(self, i: int) -> Any:
        seqs = [self.sequence(k) for k in range(self._first_seq[i], self._first_seq[i + 1])]
        numbers = tuple(self._numbers[self._first_number[i] : self._first_number[i + 1]])
        return self.recipe.unpack(seqs, numbers)

    @property
    def nbytes(self) -> int:
        """Bytes of offsets and numbers held in the process's memory (the tokens are in the
        memory-mapped file)."""
        arrays = (self._seqs, self._first_seq, self._numbers, self._first_number)
        return sum(a.itemsize * len(a) for a in arrays)

    def close(self) -> None:
        self.file.close()


def store_examples(
    recipe: Any,
    fmt: Format,
    records: Iterable[dict],
    chat: Any,
    directory: str | Path | None = None,
) -> TokenStore:
    """The recipe's examples of `records` (a JsonlReader: one record at a time), stored as
    they are built. Raises what reading raises (ValueError listing bad lines), leaving no
    token file behind."""
    store = TokenStore(recipe, directory)
    try:
        return store.extend(recipe.build(fmt, records, chat))
    except BaseException:
        store.close()
        raise


class StoredExamples(Sequence):
    """Item i is the example the recipe built i-th (rebuilt from the store on each access)."""

    def __init__(self, store: TokenStore):
        self.store = store

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.store.example(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"example {i} of {n}")
        return self.store.example(i)


class RecordsAt(Sequence):
    """Records of a JSONL file by the byte offsets of their lines (contract.data.JsonlReader
    gave them), parsed again on each access: 8 bytes a record in memory, not the record."""

    def __init__(self, path: str | Path, fmt: Format, offsets: Iterable[int] = ()):
        self.path, self.format = str(path), fmt
        self.offsets = array("q", offsets)
        self._fh: BinaryIO | None = None

    def append(self, offset: int) -> None:
        self.offsets.append(offset)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if self._fh is None:
            self._fh = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        return record_at(self._fh, self.offsets[i], self.format)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
