"""The ```python blocks of the documentation pages, with their markers (see
tests/docs/test_doc_blocks.py, which runs them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--\s*(block|continues):\s*([\w-]+)\s*-->")


@dataclass(frozen=True)
class Block:
    page: Path
    number: int  # 1-based, among the page's python blocks
    line: int  # 0-based index of the fence's first line of code
    text: str
    name: str | None
    continues: str | None
    prose: str  # the paragraph before the markers and fence

    @property
    def id(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}::block-{self.number}"

    @property
    def doctest(self) -> bool:
        return self.text.lstrip().startswith(">>>")


def blocks(page: Path) -> list[Block]:
    """The page's ```python blocks, with their markers and the paragraph before them."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("```"):
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        if lines[i].strip() == "```python":
            markers: dict[str, str] = {}
            above = i - 1
            while above >= 0 and (m := MARKER.fullmatch(lines[above].strip())):
                markers[m[1]] = m[2]
                above -= 1
            while above >= 0 and not lines[above].strip():
                above -= 1
            paragraph = []
            while above >= 0 and lines[above].strip():
                paragraph.insert(0, lines[above])
                above -= 1
            found.append(
                Block(
                    page=page,
                    number=len(found) + 1,
                    line=i + 1,
                    text="\n".join(lines[i + 1 : end]) + "\n",
                    name=markers.get("block"),
                    continues=markers.get("continues"),
                    prose="\n".join(paragraph),
                )
            )
        i = end + 1
    return found
