"""``hscl-zoo train --help``: every pretraining key with its type, default and meaning.

The table is read from the source of :class:`hscl_zoo.training.config.PretrainConfig` (each field's
annotation, default and trailing comment, grouped under the class's section comments), not from the
imported class, so the help needs neither torch nor the training loop and prints in a fraction of a
second. ``hscl_zoo.training.pretrain.parse_args`` uses the same parser, so the recipe and the
command line describe the keys identically.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ConfigKey", "config_keys", "config_page", "key_table", "build_train_parser", "TRAIN_DESCRIPTION"]

CONFIG_SOURCE = Path(__file__).parent / "training" / "config.py"
CONFIG_CLASS = "PretrainConfig"
TRAIN_DESCRIPTION = "Pretrain a contrastive encoder (UCL, H-UCL, SCL, H-SCL) and export it for the Hub."


@dataclass(frozen=True)
class ConfigKey:
    """One field of the pretraining config as its source declares it."""

    name: str
    type: str
    default: str
    meaning: str
    section: str


def _comments(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0]: tok.string.lstrip("#").strip() for tok in tokens if tok.type == tokenize.COMMENT}


def config_keys(source: str | None = None) -> list[ConfigKey]:
    """The fields of ``PretrainConfig`` in declaration order, read from ``source`` (default: the
    installed ``hscl_zoo/training/config.py``)."""
    text = CONFIG_SOURCE.read_text(encoding="utf-8") if source is None else source
    comments = _comments(text)
    tree = ast.parse(text)
    body = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == CONFIG_CLASS).body
    keys: list[ConfigKey] = []
    line_before = body[0].lineno
    section = ""
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        headers = [comments[n] for n in range(line_before + 1, node.lineno) if n in comments]
        section = headers[-1] if headers else section
        default = ast.unparse(node.value) if node.value is not None else "(required)"
        keys.append(ConfigKey(node.target.id, ast.unparse(node.annotation), default,
                              comments.get(node.lineno, ""), section))
        line_before = node.end_lineno or node.lineno
    return keys


_CLI_TYPES = {"str": "text", "int": "integer", "float": "number", "bool": "true/false",
              "list": "list like [0.5,0.5,0.5]", "None": "null"}


def _cli_type(annotation: str) -> str:
    """A field's annotation as a command-line user writes values: ``int | None`` is ``integer or null``."""
    return " or ".join(_CLI_TYPES.get(part.strip(), part.strip()) for part in annotation.split("|"))


def _cli_value(default: str) -> str:
    """A default as it is typed after --key: ``'digits'`` is ``digits``, ``None`` is ``null``."""
    try:
        value = ast.literal_eval(default)
    except (ValueError, SyntaxError):
        return default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def key_table(keys: list[ConfigKey] | None = None) -> str:
    """The keys as help text: one block per section, each key with type, default and meaning."""
    lines = ["config keys, each set as --key value after --config (whose file they override); null unsets a key",
             "that may be unset (the comments' None):"]
    section = None
    for key in keys if keys is not None else config_keys():
        if key.section != section:
            section = key.section
            lines.append(f"\n {section}:")
        lines.append(f"  --{key.name} {key.name.upper()}  ({_cli_type(key.type)}; default: {_cli_value(key.default)})")
        if key.meaning:
            lines.append(f"      {key.meaning}")
    return "\n".join(lines)


def build_train_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``hscl-zoo train`` / ``recipes/pretrain.py``: the run options, with every
    config key listed in the help's epilog (``--key value`` settings are parsed by the config)."""
    parser = argparse.ArgumentParser(prog=prog, description=TRAIN_DESCRIPTION, epilog=key_table(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="a shipped config by zoo name (hscl-beta-cifar100; 'hscl-zoo list' "
                        "names them) or a YAML file of config keys")
    parser.add_argument("--resume", action="store_true", help="continue the run in output_dir from its latest checkpoint")
    parser.add_argument("--overwrite", action="store_true", help="delete what output_dir holds and start again")
    return parser


def config_page() -> str:
    """docs/config.md, the Pretraining keys page: every key of `PretrainConfig` by section, with its
    type, default and meaning, read from the source as `hscl-zoo train --help` reads them. The page is
    committed so that links to it work in the repository too; `python -m hscl_zoo.config_help
    docs/config.md` writes it again after a key changes (a test compares the two)."""
    lines = ["# Pretraining keys", "",
             "Every key of `hscl_zoo.training.PretrainConfig`, generated from the dataclass in "
             "`hscl_zoo/training/config.py`. A run takes the defaults, then the YAML file (`--config`), then "
             "`--key value` overrides; an unknown key is an error listing the valid ones. The resolved config is "
             "written to the run's `config.json`."]
    section = None
    for key in config_keys():
        if not key.meaning:
            raise ValueError(f"PretrainConfig.{key.name} has no comment saying what it is (hscl_zoo/training/config.py); "
                             "add one at the end of its line.")
        if key.section != section:
            section = key.section
            title, _, note = section.partition(" (")
            lines += ["", f"## {title[0].upper() + title[1:]}", ""]
            if note:
                lines += [f"{note[0].upper() + note[1:-1]}.", ""]
            lines += ["| key | type | default | what it sets |", "|---|---|---|---|"]
        meaning = key.meaning.replace("|", "\\|")
        lines.append(f"| `{key.name}` | `{key.type}` | `{key.default}` | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m hscl_zoo.config_help docs/config.md")
    Path(sys.argv[1]).write_text(config_page())
    print(f"wrote {sys.argv[1]}")
