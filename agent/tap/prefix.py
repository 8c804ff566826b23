"""Prefix reuse potential from chained block hashes of the rendered prompt (docs/requests.md,
"Reuse potential"): the leading blocks seen within `window_s` are the reusable share; a re-seen
block served by several replicas lives in split cache domains (seeds 000, 003). No text is
kept; at most `max_blocks` hashes (LRU), each a tuple of numbers (last seen, hits, replicas as a
bit mask) that the garbage collector does not track: a full index costs a collection nothing.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple


class PrefixMatch(NamedTuple):
    """The reuse estimate of one prompt."""

    blocks: int  # blocks in the prompt
    matched: int  # leading blocks already seen within the window
    reusable_ratio: float  # matched share of the prompt (by characters / token ids)
    replicas: int  # distinct replicas that served the deepest matched block (0 if none)
    hashes: tuple[int, ...] = ()  # the prompt's chained block hashes (64-bit ints, no text)
    full_blocks: int = 0  # how many of them are full blocks (the rest: a partial tail)


def render_prompt(body: dict[str, Any]) -> str | list[int] | None:
    """The prompt an OpenAI-style request body stands for: text, token ids, or None if absent.
    Chat: role and text per message (tools first), so equal message prefixes render equal prefixes."""
    if "messages" in body and isinstance(body["messages"], list):
        parts = []
        if body.get("tools"):
            parts.append("tools\x1f" + repr(body["tools"]) + "\x1e")
        for m in body["messages"]:
            if isinstance(m, dict):
                parts.append(f"{m.get('role', '')}\x1f{_content_text(m.get('content'))}\x1e")
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]  # batched prompts: the first stands for the request
    return None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") or repr(p.get("image_url", "")) for p in content if isinstance(p, dict))
    return ""


def _prompt_bytes(prompt: str | Sequence[int]) -> bytes:
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    return b"".join(int(t).to_bytes(4, "little", signed=True) for t in prompt)


def _chain(data: bytes, step: int) -> list[int]:
    out, prev = [], 0
    for i in range(0, len(data), step):
        prev = hash((prev, data[i : i + step]))
        out.append(prev)
    return out


class PrefixIndex:
    """Recently seen prefix blocks, fleet-wide (prefix caches ignore tenants unless salted)."""

    def __init__(
        self,
        window_s: float = 900.0,
        max_blocks: int = 200_000,
        max_replicas: int = 8,
        block_chars: int = 64,
        block_tokens: int = 16,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s, self.max_blocks, self.max_replicas = window_s, max_blocks, max_replicas
        self.block_chars, self.block_tokens = block_chars, block_tokens
        self._clock = clock
        self._blocks: OrderedDict[int, tuple[float, int, int]] = OrderedDict()  # (last seen, hits, mask)
        self._bits: dict[str, int] = {}  # replica -> its bit (replicas: the tap's upstreams, a few)
        self.reseen = 0  # remembered blocks seen at least twice
        self.split = 0  # ... of which served by more than one replica

    def __len__(self) -> int:
        return len(self._blocks)

    def observe(self, prompt: str | Sequence[int], replica: str) -> PrefixMatch:
        """Match the prompt against the index, then remember its blocks as served by `replica`."""
        data = _prompt_bytes(prompt)
        step = self.block_chars if isinstance(prompt, str) else self.block_tokens * 4
        hashes = _chain(data, step)
        now = self._clock()
        bit = self._bits.setdefault(replica, 1 << len(self._bits))
        window, max_replicas, blocks = self.window_s, self.max_replicas, self._blocks
        matched = deepest = 0  # deepest: the replicas of the deepest matched block
        matching = True
        for h in hashes:  # one pass: match the leading blocks and remember every block
            b = blocks.get(h)
            if b is None or now - b[0] > window:
                matching = False
                self._add(h, b, now, bit)
                continue
            _, hits, mask = b
            hits += 1
            if hits == 2:
                self.reseen += 1
                if mask.bit_count() > 1:
                    self.split += 1
            if not mask & bit and mask.bit_count() < max_replicas:
                mask |= bit
                if mask.bit_count() == 2 and hits >= 2:
                    self.split += 1
            blocks.move_to_end(h)
            blocks[h] = (now, hits, mask)
            if matching:
                matched, deepest = matched + 1, mask
        share = min(1.0, matched * step / len(data)) if data else 0.0  # by characters / token ids
        return PrefixMatch(len(hashes), matched, share, deepest.bit_count(), tuple(hashes), len(data) // step)

    def _add(self, h: int, stale: tuple[float, int, int] | None, now: float, bit: int) -> None:
        """A block not seen within the window: (re)start it, evicting the least recently seen."""
        if stale is not None:
            self._forget(h)
        self._blocks[h] = (now, 1, bit)
        while len(self._blocks) > self.max_blocks:
            self._forget(next(iter(self._blocks)))

    def _forget(self, h: int) -> None:
        _, hits, mask = self._blocks.pop(h)
        if hits >= 2:
            self.reseen -= 1
            if mask.bit_count() > 1:
                self.split -= 1

    @property
    def split_ratio(self) -> float | None:
        """Share of re-seen blocks served by more than one replica; None before any reuse."""
        return self.split / self.reseen if self.reseen else None
