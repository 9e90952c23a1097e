"""Pages of the docs site generated at build time (mkdocs-gen-files), so they cannot drift from
the code: the landing page's zoo table and one page per zoo entry from its model card, every
command's --help from the argparse parsers, and one API reference page per module (the pretraining
keys' page is committed: `python -m hscl_zoo.config_help docs/config.md`). Files
outside docs/ that a page links to (results, figures, benchmark files) are copied under `repo/`
and the links pointed there."""

from __future__ import annotations

import ast
import io
import os
import re
from pathlib import Path

import mkdocs_gen_files

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
REPO = "repo"


def copy_into_site(path: str) -> str:
    """Copy the repository file `path` into the site under repo/ and return its site path."""
    target = f"{REPO}/{path}"
    with mkdocs_gen_files.open(target, "wb") as out:
        out.write((ROOT / path).read_bytes())
    return target


def point_outside_links(text: str, base: str) -> str:
    """Links to repository files outside docs/ (relative to `base`, the page's folder in the
    repository) point at the site's copies; links between pages (tutorials included) stay."""

    def replace(match: re.Match) -> str:
        target, anchor = match.group(2), match.group(3) or ""
        if re.match(r"[a-z]+:|#", target):
            return match.group(0)
        path = os.path.normpath(os.path.join(base, target))
        if path.startswith("docs/") and (path.endswith(".md") or path.startswith("docs/tutorials/")):
            return f"{match.group(1)}({path[len('docs/'):]}{anchor})"
        if (ROOT / path).is_file():
            return f"{match.group(1)}({copy_into_site(path)}{anchor})"
        if (ROOT / path).is_dir():
            return match.group(1)[1:-1]
        raise SystemExit(f"docs: {base or '.'}: link to a missing file {target}")

    return re.sub(r"(!?\[[^\]]*\])\(([^)#\s]+)(#[^)\s]*)?\)", replace, text)


ZOO_TABLE = "<!-- zoo-table -->"


def zoo_pages() -> None:
    """One page per zoo entry, its model card (model_cards/NAME.md) without the Hub's front
    matter, and the landing page's zoo table linking them."""
    from hscl_zoo.zoo import registry
    from hscl_zoo.zoo.table import markdown_table, zoo_rows

    for entry in registry.entries():
        card = (ROOT / "model_cards" / f"{entry.name}.md").read_text()
        body = card.split("\n---\n", 1)[1] if card.startswith("---\n") else card
        with mkdocs_gen_files.open(f"zoo/{entry.name}.md", "w") as out:
            out.write(point_outside_links(body.lstrip("\n"), "model_cards").replace("](repo/", "](../repo/"))
    table = markdown_table(zoo_rows(), link=lambda name: f"zoo/{name}.md")
    index = (DOCS / "index.md").read_text()
    if ZOO_TABLE not in index:
        raise SystemExit(f"docs: docs/index.md has no {ZOO_TABLE} line for the zoo table")
    with mkdocs_gen_files.open("index.md", "w") as out:
        out.write(point_outside_links(index.replace(ZOO_TABLE, table), "docs"))


def rewrite_pages() -> None:
    for page in sorted(DOCS.glob("*.md")):
        if page.name == "index.md":
            continue
        text = page.read_text()
        rewritten = point_outside_links(text, "docs")
        if rewritten != text:
            with mkdocs_gen_files.open(page.name, "w") as out:
                out.write(rewritten)


def cli_page() -> None:
    os.environ["COLUMNS"] = "88"
    from hscl_zoo.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    text = (DOCS / "cli.md").read_text()
    out = io.StringIO()
    out.write("\n## Every option\n\nGenerated from the argparse parsers in `hscl_zoo/cli.py` at build time.\n")
    for name, sub in commands.choices.items():
        out.write(f"\n### hscl-zoo {name}\n\n")
        if name == "train":
            out.write(f"{sub.description} Its keys are the [pretraining keys](config.md), as `--key value`.\n")
            continue
        if name == "finetune":
            from hscl_zoo.training.finetune import build_parser as finetune_parser

            sub = finetune_parser(f"hscl-zoo {name}")
        out.write("```text\n" + sub.format_help().replace("usage: ", "", 1) + "```\n")
    with mkdocs_gen_files.open("cli.md", "w") as f:
        f.write(point_outside_links(text, "docs") + out.getvalue())


def public_names() -> str:
    """The names `hscl_zoo` exports, each linked to its documentation in the module defining it
    (the package imports them lazily, so its own page would otherwise list none)."""
    import hscl_zoo

    rows = "".join(f"| [`{name}`][{module}.{name}] | `{module}` |\n" for name, module in hscl_zoo._EXPORTS.items())
    return "\n## Public names\n\n`import hscl_zoo` gives these names:\n\n| name | defined in |\n|---|---|\n" + rows


def has_public_definitions(path: Path) -> bool:
    """Whether a module defines a public function or class (a page of only a docstring, type
    aliases or re-exports says nothing the pages of its neighbours do not)."""
    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_")
               for node in tree.body)


def reference_pages() -> None:
    """One page per module of the package that defines public functions or classes (private
    modules left out); the nav lists the folder (mkdocs-literate-nav infers it)."""
    for path in sorted((ROOT / "hscl_zoo").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue
        module = ".".join(parts)
        if module != "hscl_zoo" and not has_public_definitions(path):
            continue
        page = f"reference/{'/'.join(parts)}.md"
        with mkdocs_gen_files.open(page, "w") as out:
            out.write(f"# `{module}`\n\n::: {module}\n")
            if module == "hscl_zoo":
                out.write(public_names())


zoo_pages()
rewrite_pages()
cli_page()
reference_pages()
