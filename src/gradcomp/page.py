"""Self-contained HTML pages of gradcomp's Markdown (SUMMARY.md, each experiment's tables with its figure).

The Snakemake report shows HTML, images and PDFs but offers Markdown and CSV only for download, and keeps
captions in an info pane: a page per experiment puts figure, caption and tables in view. gradcomp writes a
small subset of Markdown (headings, paragraphs, `-` lists, pipe tables, code/bold/italic spans, links and
images), converted here without a Markdown package. The report page of a configuration (its SUMMARY.md with
every figure embedded where the Markdown shows it) opens with the claims at a glance.
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Callable
from pathlib import Path

PAGE_STYLE = (
    "body{font-family:sans-serif;font-size:14px;margin:1em}img{max-width:100%;display:block;margin:0.5em 0}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}th,td{border:1px solid #ccc;padding:2px 6px}"
    "th{background:#f2f2f2}"
)


def anchor(heading: str) -> str:
    """The link target a Markdown renderer gives a section heading (lower case, punctuation dropped, spaces
    as hyphens), e.g. "A5: Accuracy with FP gradient formats" -> "a5-accuracy-with-fp-gradient-formats"."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


ANCHOR = re.compile(r'\s*<a id="([\w-]+)"></a>\s*$')  # a heading's own link target, as SUMMARY.md writes it
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def _inline(
    text: str, target: Callable[[str], str] = str, image: Callable[[str, str], str] | None = None
) -> str:
    """Escaped HTML of one line: `code`, **bold** and *italic* spans, [links](href) (their href through
    `target`) and ![images](src) (drawn by `image(src, alt)`, or linked where it is None), as gradcomp's
    Markdown uses them."""
    parts = html.escape(text, quote=False).split("`")
    for index in range(0, len(parts), 2):  # outside code spans
        part = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", parts[index])
        parts[index] = re.sub(r"\*(?=\S)(.+?)(?<=\S)\*", r"<em>\1</em>", part)
    for index in range(1, len(parts), 2):
        parts[index] = f"<code>{parts[index]}</code>"

    def link(match: re.Match) -> str:
        bang, label, href = match.groups()
        if bang and image is not None:
            return image(html.unescape(href), label)
        return f'<a href="{html.escape(target(html.unescape(href)))}">{label}</a>'

    return LINK.sub(link, "".join(parts))


def _cells(line: str) -> list[str]:
    """The cells of a pipe-table row; `\\|` is a literal bar inside a cell."""
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip()[1:-1])]


def _kind(line: str) -> str:
    if re.match(r"#{1,6} ", line):
        return "heading"
    if line.startswith("|"):
        return "table"
    return "list" if line.startswith("- ") else "paragraph"


def markdown_html(
    text: str, target: Callable[[str], str] = str, image: Callable[[str, str], str] | None = None
) -> str:
    """HTML of the Markdown gradcomp writes: headings (each with its `anchor`, or the `<a id>` it ends
    with), paragraphs, `-` lists, pipe tables, inline spans, links and images (see `_inline`)."""
    lines = text.splitlines()
    out = []
    index = 0

    def inline(line: str) -> str:
        return _inline(line, target, image)

    while index < len(lines):
        if not lines[index].strip():
            index += 1
            continue
        kind = _kind(lines[index])
        if kind == "heading":
            marks, title = lines[index].split(" ", 1)
            own = ANCHOR.search(title)
            title = ANCHOR.sub("", title)
            ident = own[1] if own else anchor(title)
            out.append(f'<h{len(marks)} id="{ident}">{inline(title)}</h{len(marks)}>')
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
            head = "".join(f"<th>{inline(cell)}</th>" for cell in rows[0])
            body = "".join(
                "<tr>" + "".join(f"<td>{inline(cell)}</td>" for cell in row) + "</tr>" for row in rows[1:]
            )
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{inline(line[2:])}</li>" for line in block) + "</ul>")
        else:
            out.append(f"<p>{inline(' '.join(block))}</p>")
    return "\n".join(out)


def _data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")


def write_page(out: str | Path, markdown: str | Path, figure: str | Path | None = None) -> Path:
    """A self-contained HTML page of a Markdown file, with a PNG figure (embedded) after its title. The
    Markdown's images of PNG files beside it are embedded where they stand (each with the id `fig-<name>`,
    which links to that PNG then lead to), and its other relative links are rewritten to work from `out`."""
    markdown, out = Path(markdown), Path(out)
    folder, text = markdown.parent, markdown.read_text()
    embedded = {m[3] for m in LINK.finditer(text) if m[1] and (folder / m[3]).is_file()}

    def target(href: str) -> str:
        if href in embedded:
            return f"#fig-{Path(href).stem}"
        if re.match(r"^[a-z]+:|^#|^/", href):
            return href
        return os.path.relpath(folder / href, out.parent)

    def image(src: str, alt: str) -> str:
        if src not in embedded:
            return f'<img alt="{html.escape(alt)}" src="{html.escape(target(src))}">'
        return f'<img id="fig-{Path(src).stem}" alt="{html.escape(alt)}" src="{_data_uri(folder / src)}">'

    body = markdown_html(text, target, image)
    if figure is not None:
        image_html = f'<figure><img alt="{Path(figure).name}" src="{_data_uri(Path(figure))}"></figure>'
        body = body.replace("</h1>", "</h1>\n" + image_html, 1) if "</h1>" in body else image_html + body
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><style>{PAGE_STYLE}</style></head>'
        f"<body>\n{body}\n</body></html>\n"
    )
    return out
