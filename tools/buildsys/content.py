"""The shell's own files: web/ and the napplets, with the gallery's index.

Rules
- A napplet's page is untrusted text: the gallery takes only bounded, plain,
  whitespace-normalised text from it and an icon that is a small ``data:``
  image or a small image file inside its own folder (`napplet_card`).
- Symbolic links in napplets/ are never followed or copied.
"""

from __future__ import annotations

import contextlib
import html.parser
import os
import re
from pathlib import Path

from buildsys import paths
from buildsys.base import DistWriter
from buildsys.bundles import PROMPT_API_DIR


def copy_web(out: DistWriter) -> int:
    """Copy the host page (web/, but web/vendor-entry/ and web/prompt-api/) to dist/'s root.

    A missing web/ is not an error (the build then has no host page).
    Returns the number of files copied.
    """
    if not paths.WEB.is_dir():
        return 0
    count = 0
    for path in sorted(paths.WEB.rglob("*")):
        rel = path.relative_to(paths.WEB)
        if not path.is_file() or rel.parts[0] == "vendor-entry" or "__pycache__" in rel.parts:
            continue
        if rel.parts[0] == PROMPT_API_DIR:
            continue  # shipped bundled, as js/prompt-api-source.js (bundle_prompt_api)
        # web/ may be edited while we build: a file that vanished is simply not copied.
        with contextlib.suppress(FileNotFoundError):
            out.copy(path, rel.as_posix())
            count += 1
    return count


#: Bounds of what a napplet's own page may put into the gallery (dist/napplets/index.json).
#: Napplet HTML is untrusted: only bounded, whitespace-normalised text and an
#: icon that is a small data: image or a small image file inside its own folder.
CARD_TITLE_MAX = 60
CARD_DESCRIPTION_MAX = 160
CARD_ICON_DATA_MAX = 16 * 1024
CARD_ICON_FILE_MAX = 64 * 1024
#: Media types an icon data: URL may name (all render as inert images in <img>).
CARD_ICON_DATA_RE = re.compile(
    r"data:image/(?:png|gif|jpeg|webp|svg\+xml)(?:;base64)?,[^\s\"'<>\\]*", re.I
)
CARD_ICON_SUFFIXES = frozenset({".png", ".gif", ".jpg", ".jpeg", ".webp", ".svg", ".ico"})
#: Characters an icon file path may use (relative to the napplet's folder).
CARD_ICON_PATH_RE = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")
#: Controls, and the invisible format characters that reorder or hide text
#: (bidi marks, overrides and isolates, zero-width and word-joiner
#: characters, the byte order mark, interlinear annotation marks, tags).
_CONTROL_RE = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    r"\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)


class _HeadParser(html.parser.HTMLParser):
    """Collects a page's first <title> text, first description meta and first icon link.

    Only the attributes named here are read; everything else in the page is
    ignored. Character references are decoded by html.parser itself.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._inside = False
        self._done = False
        self.parts: list[str] = []
        self.description: str | None = None
        self.icon: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name.lower(): value or "" for name, value in attrs}
        if tag == "title" and not self._done:
            self._inside = True
        elif tag == "meta" and self.description is None:
            if values.get("name", "").strip().lower() == "description":
                self.description = values.get("content", "")
        elif (
            tag == "link" and self.icon is None and "icon" in values.get("rel", "").lower().split()
        ):
            self.icon = values.get("href", "")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self._inside:
            self._inside = False
            self._done = True

    def handle_data(self, data: str) -> None:
        if self._inside:
            self.parts.append(data)


def _parse_head(path: Path) -> _HeadParser:
    parser = _HeadParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser


def card_text(text: str, limit: int) -> str:
    """``text`` as one line of plain text: control and direction-override characters
    dropped, whitespace collapsed, at most ``limit`` characters (cut with "…")."""
    clean = " ".join(_CONTROL_RE.sub(" ", text).split())
    if len(clean) > limit:
        clean = clean[: limit - 1].rstrip() + "…"
    return clean


def html_title(path: Path) -> str:
    """The whitespace-normalised <title> of an HTML file ('' when it has none)."""
    return " ".join("".join(_parse_head(path).parts).split())


def card_icon(href: str, folder: Path, prefix: str) -> str:
    """The gallery icon of a napplet from its ``<link rel="icon" href>``, or ''.

    Accepted: a ``data:image/(png|gif|jpeg|webp|svg+xml)`` URL of at most
    :data:`CARD_ICON_DATA_MAX` characters (kept as it is), or a relative path
    to an image file inside the napplet's own ``folder`` (so inside dist/) of
    at most :data:`CARD_ICON_FILE_MAX` bytes, returned as ``prefix`` + path
    (relative to dist/). Anything else (other schemes, absolute or escaping
    paths, queries, other file types, large files) gives ''.
    """
    href = href.strip()
    if href.lower().startswith("data:"):
        ok = len(href) <= CARD_ICON_DATA_MAX and CARD_ICON_DATA_RE.fullmatch(href)
        return href if ok else ""
    if not CARD_ICON_PATH_RE.fullmatch(href) or ".." in href.split("/"):
        return ""
    target = folder / href
    if target.suffix.lower() not in CARD_ICON_SUFFIXES or not target.is_file():
        return ""
    try:
        inside = target.resolve().is_relative_to(folder.resolve())
        small = target.stat().st_size <= CARD_ICON_FILE_MAX
    except OSError:
        return ""
    return prefix + href if inside and small else ""


def napplet_card(folder: Path) -> dict[str, str]:
    """The gallery entry of the napplet in ``folder`` (its ``index.html`` is read as
    untrusted text): ``{"name", "title", "description", "icon", "path"}``.

    ``title`` is the page's <title> (the folder name when empty), ``description``
    its ``<meta name="description">`` content, both plain bounded text
    (:func:`card_text`); ``icon`` is :func:`card_icon` of its first icon link;
    ``path`` is relative to dist/.
    """
    head = _parse_head(folder / "index.html")
    prefix = f"napplets/{folder.name}/"
    return {
        "name": folder.name,
        "title": card_text("".join(head.parts), CARD_TITLE_MAX) or folder.name,
        "description": card_text(head.description or "", CARD_DESCRIPTION_MAX),
        "icon": card_icon(head.icon or "", folder, prefix),
        "path": prefix + "index.html",
    }


def _napplet_files(folder: Path) -> list[Path]:
    """The regular files under ``folder``, sorted, reached without following any link.

    A napplet's folder is untrusted: a symbolic link in it (to a key file, a
    home folder) would otherwise publish what it points to in dist/.
    """
    files: list[Path] = []
    for root, dirs, names in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
        for name in names:
            path = Path(root) / name
            if not path.is_symlink() and path.is_file():
                files.append(path)
    return sorted(files)


def copy_napplets(out: DistWriter) -> list[dict[str, str]]:
    """Copy napplets/<name>/ to dist/napplets/ and write dist/napplets/index.json.

    Only folders with an ``index.html`` are napplets; symbolic links (a
    napplet folder, its page, or anything inside) are never followed or
    copied (:func:`_napplet_files`). The index lists them
    sorted by name as :func:`napplet_card` entries (``path`` and a file
    ``icon`` relative to dist/). A missing napplets/ gives an empty index.
    """
    index: list[dict[str, str]] = []
    if paths.NAPPLETS.is_dir():
        for folder in sorted(
            p for p in paths.NAPPLETS.iterdir() if p.is_dir() and not p.is_symlink()
        ):
            page = folder / "index.html"
            if not page.is_file() or page.is_symlink():
                continue
            for path in _napplet_files(folder):
                rel = path.relative_to(paths.NAPPLETS)
                if "__pycache__" not in rel.parts:
                    with contextlib.suppress(FileNotFoundError):  # edited while we build
                        out.copy(path, f"napplets/{rel.as_posix()}")
            index.append(napplet_card(folder))
    out.write_json("napplets/index.json", index)
    return index
