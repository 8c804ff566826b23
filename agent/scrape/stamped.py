"""One target's canonical samples as family blocks with one timestamp, and a cycle as parts.

`Stamped` keeps a scrape as the block memo made it (agent/normalize/blockcache.py): blocks of
(name, labels, value) triples, an unchanged block being the same object as last scrape, and one
timestamp for all. `Parts` is a cycle: every collector's part in order (a `Stamped` or a list per
engine target, named by its instance; lists from the other collectors). Both are read-only
`Sequence[Sample]`s whose flat list is built only on first use; the per-cycle consumers (the
change-point encoder, counter-reset detection, the derive hooks through `pick`) read the blocks
instead and skip those unchanged, each checked by a unit test against its general path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import chain, compress, repeat
from operator import add, itemgetter
from typing import overload

from kvscope.agent.signals import Labels, Sample

Head = tuple[str, Labels, float]
"""A sample without its timestamp."""

_new = tuple.__new__


class _Flattened(Sequence[Sample]):
    """A read-only sequence of Samples whose flat list `samples()` is built on first use and
    answers length, iteration, indexing and equality (with a list or another such sequence)."""

    __slots__ = ()
    _len: int

    def samples(self) -> list[Sample]:
        raise NotImplementedError

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples())

    @overload
    def __getitem__(self, i: int) -> Sample: ...
    @overload
    def __getitem__(self, i: slice) -> list[Sample]: ...
    def __getitem__(self, i: int | slice) -> Sample | list[Sample]:
        return self.samples()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Flattened | list):
            return self.samples() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class Stamped(_Flattened):
    """A scrape's canonical samples: `blocks` of heads (a block object is reused while its
    family did not change), all stamped `timestamp`."""

    __slots__ = ("_flat", "_len", "blocks", "timestamp")

    def __init__(self, blocks: list[list[Head]], timestamp: float) -> None:
        self.blocks = blocks
        self.timestamp = timestamp
        self._len = sum(map(len, blocks))
        self._flat: list[Sample] | None = None

    def samples(self) -> list[Sample]:
        """The samples as a list (built on first call; C-level passes, no bytecode per sample)."""
        if self._flat is None:
            heads = chain.from_iterable(self.blocks)
            self._flat = list(map(_new, repeat(Sample), map(add, heads, repeat((self.timestamp,)))))
        return self._flat

    def __repr__(self) -> str:
        return f"Stamped({len(self.blocks)} blocks, {self._len} samples @ {self.timestamp})"


class Parts(_Flattened):
    """A cycle's samples as the parts they came in (Stamped or lists), in order. `sources[i]`
    names the target part i came from ("" when it is not one target's scrape)."""

    __slots__ = ("_flat", "_len", "parts", "sources")

    def __init__(self, parts: Sequence[Sequence[Sample]] = ()) -> None:
        self.parts: list[Sequence[Sample]] = []
        self.sources: list[str] = []
        self._len = 0
        self._flat: list[Sample] | None = None
        for p in parts:
            self.add(p)

    def add(self, part: Sequence[Sample], source: str = "") -> None:
        """Append a part (a `Parts` is spliced in part by part, sources kept); empty parts are
        skipped."""
        if isinstance(part, Parts):
            for p, src in zip(part.parts, part.sources, strict=True):
                self.add(p, src)
            return
        if len(part):
            self.parts.append(part)
            self.sources.append(source)
            self._len += len(part)
            self._flat = None

    def samples(self) -> list[Sample]:
        """All samples in order as one list (built on first call)."""
        if self._flat is None:
            self._flat = list(chain.from_iterable(p.samples() if isinstance(p, Stamped) else p for p in self.parts))
        return self._flat

    def __add__(self, other: Sequence[Sample]) -> Parts:
        return Parts([self, other])

    def __repr__(self) -> str:
        return f"Parts({len(self.parts)} parts, {self._len} samples)"


def pick(cycle: Sequence[Sample], wanted: Callable[[str], bool]) -> list[Sample]:
    """The samples whose name `wanted` accepts, in order, in C-level passes (no bytecode per
    sample). Of a `Parts`' (or a lone `Stamped`'s) blocks only the picked heads are stamped."""
    out: list[Sample] = []
    for part in cycle.parts if isinstance(cycle, Parts) else [cycle]:
        if isinstance(part, Stamped):
            heads = list(chain.from_iterable(part.blocks))
            picked = compress(heads, map(wanted, map(itemgetter(0), heads)))
            out.extend(map(_new, repeat(Sample), map(add, picked, repeat((part.timestamp,)))))
        else:
            out.extend(compress(part, map(wanted, map(itemgetter(0), part))))
    return out
