"""Self-contained HTML pages of gradcomp's Markdown (SUMMARY.md, each experiment's tables with its figure).

The Snakemake report shows HTML, images and PDFs but offers Markdown and CSV only for download, and keeps
captions in an info pane: a page per experiment puts figure, caption and tables in view. gradcomp writes a
small subset of Markdown (headings, paragraphs, `-` lists, pipe tables, code/bold/italic spans), converted
here without a Markdown package.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

PAGE_STYLE = (
    "body{font-family:sans-serif;font-size:14px;margin:1em}img{max-width:100%}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:2px 6px}"
    "th{background:#f2f2f2}"
)


def _inline(text: str) -> str:
    """Escaped HTML of one line: `code`, **bold** and *italic* spans, as gradcomp's Markdown uses them."""
    parts = html.escape(text, quote=False).split("`")
    for index in range(0, len(parts), 2):  # outside code spans
        part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", parts[index])
        parts[index] = re.sub(r"\*(?=\S)(.+?)(?<=\S)\*", r"<em>\1</em>", part)
    for index in range(1, len(parts), 2):
        parts[index] = f"<code>{parts[index]}</code>"
    return "".join(parts)


def _cells(line: str) -> list[str]:
    """The cells of a pipe-table row; `\\|` is a literal bar inside a cell."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def _kind(line: str) -> str:
    if re.match(r"#{1,6} ", line):
        return "heading"
    if line.startswith("|"):
        return "table"
    return "list" if line.startswith("- ") else "paragraph"


def markdown_html(text: str) -> str:
    """HTML of the Markdown gradcomp writes: headings, paragraphs, `-` lists, pipe tables, inline spans."""
    lines = text.splitlines()
    out = []
    index = 0
    while index < len(lines):
        if not lines[index].strip():
            index += 1
            continue
        kind = _kind(lines[index])
        if kind == "heading":
            marks, title = lines[index].split(" ", 1)
            out.append(f"<h{len(marks)}>{_inline(title)}</h{len(marks)}>")
            index += 1
            continue
        block = []
        while index < len(lines) and lines[index].strip() and _kind(lines[index]) == kind:
            block.append(lines[index])
            index += 1
        if kind == "table":
            rows = [_cells(line) for line in block]
            if len(rows) > 1 and all(re.fullmatch(r":?-+:?", cell) for cell in rows[1]):
                del rows[1]
            head = "".join(f"<th>{_inline(cell)}</th>" for cell in rows[0])
            body = "".join(
                "<tr>" + "".join(f"<td>{_inline(cell)}</td>" for cell in row) + "</tr>" for row in rows[1:]
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{_inline(line[2:])}</li>" for line in block) + "</ul>")
        else:
            out.append(f"<p>{_inline(' '.join(block))}</p>")
    return "\n".join(out)


def write_page(out: str | Path, markdown: str | Path, figure: str | Path | None = None) -> Path:
    """A self-contained HTML page of a Markdown file, with a PNG figure (embedded) after its title."""
    body = markdown_html(Path(markdown).read_text())
    if figure is not None:
        data = base64.b64encode(Path(figure).read_bytes()).decode("ascii")
        image = f'<figure><img alt="{Path(figure).name}" src="data:image/png;base64,{data}"></figure>'
        body = body.replace("</h1>", "</h1>\n" + image, 1) if "</h1>" in body else image + body
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><style>{PAGE_STYLE}</style></head>'
        f"<body>\n{body}\n</body></html>\n"
    )
    return out
