"""Citations as a user reads them: the source's public title and section, with a link where one
exists, never the file name of a source document the user does not have.

Rules and levers cite their sources compactly (`"002 §7.4"`, `"003 option 2"`, `"vllm #45325"`);
`cite` turns one into a `Citation` ("Sizing LLM Inference for Production §7.4"), `cite_text`
rewrites such references inside free text (descriptions, costs, parameter help). The sources
themselves, and what each cited section says in our own words: docs/sources.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    """One source document's public identity (docs/sources.md)."""

    title: str  # how citations name it (full title, author and date: docs/sources.md)
    url: str = ""


SOURCES = {
    "000": Source(
        "Why more GPUs is not enough for LLM inference",
        "https://starptech.com/blog/why-more-gpus-is-not-enough-for-llm-inference/",
    ),
    "001": Source("llm-d on a GH200, multi-tenant test"),
    "002": Source("Sizing LLM Inference for Production"),
    "003": Source("Welcome to the Disaggregation Cliff"),
    "004": Source("GPU Serving & Autoscaling (LeetLLM)"),
}
"""The five source documents by the prefix rules cite them with."""

_REPOS = {
    "vllm": ("vLLM", "https://github.com/vllm-project/vllm"),
    "vllm-metal": ("vllm-metal", "https://github.com/vllm-project/vllm-metal"),
    "TensorRT-LLM": ("TensorRT-LLM", "https://github.com/NVIDIA/TensorRT-LLM"),
    "llm-d-router": ("llm-d router", ""),
    "llm-d": ("llm-d", "https://github.com/llm-d/llm-d"),
    "aws-do-eks": ("aws-samples/aws-do-eks", "https://github.com/aws-samples/aws-do-eks"),
}
"""Upstream projects whose issues and pull requests a rule cites; "" = no public URL given."""

_CODE = {"SMG": "SGLang Model Gateway", "Dynamo": "NVIDIA Dynamo", "llm-d-router": "llm-d router"}


@dataclass(frozen=True)
class Citation:
    """A citation as shown: `text` ("Sizing LLM Inference for Production §7.4"), `url` ("" = none)."""

    text: str
    url: str = ""

    def markdown(self) -> str:
        """`[text](url)`, or the text alone where no public URL exists."""
        return f"[{self.text}]({self.url})" if self.url else self.text


_DOC = re.compile(r"^(00[0-4]) (.+)$")
_ISSUE = re.compile(r"^([\w.-]+) (PR )?#(\d+)$")
_INTERNAL = re.compile(r"^LEVERS\.md [A-Z]\d+$")


def cite(raw: str) -> Citation | None:
    """One compact citation as a user reads it; None for an internal cross-reference (a row of
    the project's own checklist) that names no source."""
    raw = raw.strip()
    if _INTERNAL.match(raw):
        return None
    if m := _DOC.match(raw):
        src = SOURCES[m.group(1)]
        rest = m.group(2)
        return Citation(f"{src.title} {rest}" if rest.startswith("§") else f"{src.title}: {rest}", src.url)
    if (m := _ISSUE.match(raw)) and m.group(1) in _REPOS:
        name, base = _REPOS[m.group(1)]
        kind, path = ("pull request", "pull") if m.group(2) else ("issue", "issues")
        return Citation(f"{name} {kind} #{m.group(3)}", f"{base}/{path}/{m.group(3)}" if base else "")
    head, _, rest = raw.partition(" ")
    if head in _CODE:
        return Citation(f"{_CODE[head]}: {rest}")
    if head.startswith("vllm/"):
        return Citation(f"vLLM source: {raw}")
    return Citation(raw)


def cite_all(raws: Iterable[str]) -> tuple[Citation, ...]:
    """`cite` over a list, internal references dropped, duplicates once."""
    out: dict[str, Citation] = {}
    for raw in raws:
        if (c := cite(str(raw))) is not None:
            out.setdefault(c.text, c)
    return tuple(out.values())


_INLINE_INTERNAL = re.compile(r"LEVERS\.md (?:row )?[A-Z]\d+(?:-[A-Z]?\d+)?(?:, [A-Z]\d+)*(?::\s*|;\s*|,\s*)?")
_INLINE_DOC = re.compile(r"(?<![\w.])(00[0-4])(?= [§\"'A-Za-z(]|[),;])")
_LEADING_ROW = re.compile(r"^[A-Z]\d+\. ")


def cite_text(text: str) -> str:
    """Free text with its source references as a user reads them: "(002 §7.4)" becomes
    "(Sizing LLM Inference for Production §7.4)", a bare "(000)" names its source too; checklist
    rows ("LEVERS.md R7: ", a description's leading "R8. ") are dropped."""
    text = _LEADING_ROW.sub("", _INLINE_INTERNAL.sub("", text))
    return _INLINE_DOC.sub(lambda m: SOURCES[m.group(1)].title, text).replace("( ", "(").replace(" )", ")")
