"""Griffe extension used by the docs build: read our reST-flavoured Google docstrings.

The package's docstrings use Google sections (``Args:``, ``Shape:``, ``Example:``) together with
reST markup (``:math:`...``` roles, ``.. math::`` blocks, ``:class:`...``` cross-references,
``Example::`` literal blocks and simple ``====`` tables). This extension rewrites each docstring
*for rendering only* (the package is untouched) before griffe parses it:

* ``.. math::`` blocks become ``$$ ... $$`` display maths (``pymdownx.arithmatex``);
* ``:math:`x``` becomes inline maths ``\\(x\\)``;
* ``:class:``/``:func:``/``:meth:``/... roles become *optional* cross-references (a link when the
  target is documented, plain code otherwise: never a strict-mode warning);
* ``Example:`` becomes ``Examples:`` so doctest lines render as code;
* ``Paragraph::`` followed by an indented block becomes a fenced Python code block;
* simple reST tables become Markdown tables.

Loaded from ``mkdocs.yml`` (``extensions: [docs/griffe_rst.py]``, a path relative to
``mkdocs.yml``); ``exclude_docs`` keeps it out of the site.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_MATH_DIRECTIVE = re.compile(r"^\.\. math::\s*(.*)$")
_TABLE_BORDER = re.compile(r"^=+(?:\s+=+)+\s*$")
_EXAMPLE = re.compile(r"^(\s*)Example:\s*$")
_LITERAL = re.compile(r"^(.*\S)::\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _ensure_blank(out: list[str]) -> None:
    if out and out[-1].strip():
        out.append("")


def _math_blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _MATH_DIRECTIVE.match(line.lstrip(" "))
        if not m:
            out.append(line)
            i += 1
            continue
        ind = _indent(line)
        body = [m.group(1)] if m.group(1).strip() else []
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > ind):
            body.append(lines[j])
            j += 1
        pad = " " * ind
        paragraphs: list[list[str]] = [[]]
        for b in body:
            if b.strip():
                paragraphs[-1].append(b.strip())
            elif paragraphs[-1]:
                paragraphs.append([])
        _ensure_blank(out)
        for para in (p for p in paragraphs if p):
            out.append(f"{pad}$$")
            out.extend(f"{pad}{p}" for p in para)
            out.append(f"{pad}$$")
            out.append("")
        i = j
    return out


def _literal_blocks(lines: list[str]) -> list[str]:
    """``Text::`` + blank line + indented block → ``Text:`` + fenced Python code."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _LITERAL.match(line)
        if not (m and i + 2 < len(lines) and not lines[i + 1].strip()):
            out.append(line)
            i += 1
            continue
        ind = _indent(line)
        j = i + 1
        block: list[str] = []
        while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > ind):
            block.append(lines[j])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        if not block:
            out.append(line)
            i += 1
            continue
        cut = min(_indent(b) for b in block if b.strip())
        pad = " " * ind
        out.append(f"{m.group(1)}:")
        out.append("")
        out.append(f"{pad}```python")
        out.extend(f"{pad}{b[cut:]}" if b.strip() else "" for b in block)
        out.append(f"{pad}```")
        out.append("")
        i = j
    return out


def _tables(lines: list[str]) -> list[str]:
    """Simple reST tables (``====  ====`` borders, optional header) → Markdown tables."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not _TABLE_BORDER.match(line.strip()):
            out.append(line)
            i += 1
            continue
        ncols = len(line.split())
        pad = " " * _indent(line)
        starts = [m.start() for m in re.finditer(r"=+", line)]  # column offsets
        rows: list[list[str]] = []
        header_rows = 0
        closed = False
        j = i + 1
        while j < len(lines):
            s = lines[j].strip()
            j += 1
            if _TABLE_BORDER.match(s):
                if j < len(lines) and lines[j].strip():  # a border inside: the header ends
                    header_rows = len(rows)
                    continue
                closed = True  # the bottom border
                break
            if not s:
                continue
            first = _indent(lines[j - 1])
            if rows and first > starts[0]:  # blank first column: continues the last row
                col = max(c for c, off in enumerate(starts) if off <= first)
                rows[-1][col] = f"{rows[-1][col]} {s}".strip()
            else:
                cells = re.split(r"\s{2,}", s, maxsplit=ncols - 1)
                rows.append(cells + [""] * (ncols - len(cells)))
        if not closed or not rows:  # not a table after all
            out.append(line)
            i += 1
            continue
        if header_rows == 0:
            rows.insert(0, [""] * ncols)
            header_rows = 1
        _ensure_blank(out)
        out.append(_md_row(rows[0], pad))
        out.append(pad + "|" + "---|" * ncols)
        out.extend(_md_row(r, pad) for r in rows[header_rows:])
        out.append("")
        i = j
    return out


def _md_row(cells: list[str], pad: str) -> str:
    return pad + "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _resolve(obj: Any, target: str) -> str:
    """Best-effort full path of a cross-reference target, seen from ``obj``."""
    first, _, rest = target.partition(".")
    scopes = [obj]
    parent = getattr(obj, "parent", None)
    if parent is not None:
        scopes.append(parent)
    for scope in scopes:
        members = getattr(scope, "members", {}) or {}
        if getattr(scope, "is_class", False) and first in members:
            return f"{scope.path}.{target}"
    try:
        full = obj.resolve(first)
    except Exception:  # unresolvable: an external name (torch.*, pyro.*) or a typo
        return target
    return f"{full}.{rest}" if rest else full


def convert(text: str, obj: Any = None) -> str:
    """Rewrite one docstring's reST markup into Markdown understood by mkdocstrings."""
    lines = text.splitlines()
    lines = _math_blocks(lines)
    lines = _literal_blocks(lines)
    lines = _tables(lines)
    lines = [_EXAMPLE.sub(r"\1Examples:", line) for line in lines]
    text = "\n".join(lines)

    def math(m: re.Match) -> str:
        return "\\(" + " ".join(m.group(1).split()) + "\\)"

    def role(m: re.Match) -> str:
        target = m.group(3).strip().removesuffix("()")
        title = target.rsplit(".", 1)[-1] if m.group(2) else target
        if m.group(1) in ("func", "meth"):
            title += "()"
        ident = _resolve(obj, target) if obj is not None else target
        return (
            f'<autoref identifier="{ident}" slug="{target}" optional><code>{title}</code></autoref>'
        )

    text = _MATH_ROLE.sub(math, text)
    return _ROLE.sub(role, text)


class ReSTCompat(griffe.Extension):
    """Convert every docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        obj.docstring.value = convert(obj.docstring.value, obj)
