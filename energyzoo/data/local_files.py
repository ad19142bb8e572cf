"""A user's own files as a recipe names them in ``data.paths``: files, folders and globs found, text read as a user
expects (UTF-8 with or without a BOM, any line ending), JSONL read record by record; every mistake in them one
`UserError` line naming the file (and the line, for JSONL) and the fix.

Relative paths are read from the folder the command runs in; paths written in a recipe file from that file's folder
(`training.recipe.read_recipe` makes them absolute before anything reads them).
"""

import glob
import json
import re
from pathlib import Path

from ..modeling.errors import UserError

GLOB_CHARACTERS = re.compile(r"[*?\[]")
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")  # a blank line (spaces or tabs on it too) ends a paragraph
# what a folder of text or JSONL files is read for: the files with these endings (a folder of images is `datasets`')
SUFFIXES = {"text": (".txt", ".md", ".text", ".rst"), "jsonl": (".jsonl", ".json")}


def _visible(path: Path, root: Path) -> bool:
    return path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)


def resolve_paths(patterns: list[str], source: str) -> list[Path]:
    """The files of ``data.paths`` for ``source`` ("text" or "jsonl"), in the order given (a glob's and a folder's
    files sorted by path; a folder read for the files with `SUFFIXES` endings, hidden ones left out)."""
    files = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if GLOB_CHARACTERS.search(pattern):
            matched = sorted(Path(name) for name in glob.glob(str(path), recursive=True) if Path(name).is_file())
            if not matched:
                raise UserError(f"data.paths: {pattern!r} matches no file")
            files.extend(matched)
        elif path.is_dir():
            found = sorted(item for item in path.rglob("*") if _visible(item, path)
                           and item.suffix.lower() in SUFFIXES[source])
            if not found:
                endings = ", ".join(SUFFIXES[source])
                raise UserError(f"data.paths: the folder {pattern} holds no {source} files (names ending {endings}); "
                                f"name the files, or a glob such as {pattern}/*")
            files.extend(found)
        elif not path.exists():
            raise UserError(f"data.paths: {pattern}: no such file or folder")
        else:
            files.append(path)
    return files


def read_text_file(path: Path) -> str:
    """A text file's contents: UTF-8 (a leading BOM dropped), every line ending read as ``\\n``; an undecodable
    or empty file is a `UserError` naming it."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise UserError(f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); save it as UTF-8, "
                        f"e.g. iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}") from None
    if not text.strip():
        raise UserError(f"{path} is empty: it has no text to train on; leave it out of data.paths")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def text_documents(path: Path) -> list[str]:
    """A text file's documents: its paragraphs (separated by blank lines). A file with no blank line is one
    document, which the split by tokens (`data.text.language_model_blocks`) still divides."""
    return [part.strip() for part in PARAGRAPH_BREAK.split(read_text_file(path)) if part.strip()]


def jsonl_documents(path: Path, text_field: str) -> list[str]:
    """The ``text_field`` of every record of a JSONL file (one JSON object a line; blank lines skipped)."""
    documents = []
    for number, line in enumerate(read_text_file(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise UserError(f"{where}: not JSON ({error.msg} at column {error.colno}); a JSONL file holds one JSON "
                            "object a line") from None
        if not isinstance(record, dict):
            raise UserError(f"{where}: a JSON {type(record).__name__}, where a record ({{\"{text_field}\": ...}}) "
                            "is expected")
        if text_field not in record:
            texts = [name for name, value in record.items() if isinstance(value, str)]
            fix = f"set data.text_field={texts[0]}" if texts else "add it, or name a field with data.text_field"
            raise UserError(f"{where} has no field {text_field!r} (fields: {', '.join(record) or 'none'}): {fix}")
        if not isinstance(record[text_field], str):
            raise UserError(f"{where}: field {text_field!r} is a {type(record[text_field]).__name__}, not text")
        documents.append(record[text_field])
    return documents


def describe_files(files: list[Path]) -> str:
    """Files named for a person (a model card, a message): their names, or the first few and how many more."""
    names = [path.name for path in files]
    return ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:3])} and {len(names) - 3} more files"
