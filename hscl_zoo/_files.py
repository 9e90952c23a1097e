"""Two jobs on files that every layer shares: a file's sha256 (release pins, Hub checks, pushes)
and a generated block in a Markdown page (the quoted results, tables and plans of the docs)."""

from __future__ import annotations

import hashlib
import os

__all__ = ["sha256_file", "replace_block"]


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in blocks (never whole into memory)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def replace_block(page: str, name: str, body: str) -> str:
    """`page` with the text between `<!-- results:NAME -->` and `<!-- /results:NAME -->` replaced by
    `body`; a ValueError if the markers are missing."""
    begin, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    if begin not in page or end not in page:
        raise ValueError(f"the README has no {begin} ... {end} block to quote {name}'s results in; add the two markers.")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{body}{end}{tail}"
