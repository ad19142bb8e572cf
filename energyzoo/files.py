"""The files a user hands energyzoo, checked where they are read: a damaged, truncated, empty or missing file is the
user's input, answered in one line that names the file and what is wrong with it, before anything is loaded or
written, and never met halfway through a library's load as a traceback.

`model_folder` finds the model folder `energyzoo eval` and `export` take (a folder, or a run's checkpoint) and
`model_folder_damage` checks it (a warm start's ``init_from`` too); `read_json` reads one JSON file a run or a folder
keeps. Every file of a folder is checked by its kind (`file_damage`): JSON parses, safetensors
headers parse and cover their file (the safetensors library's own check), a tokenizer.json loads in `tokenizers`,
Python parses, YAML parses. Where the folder records what was written (``manifest.json``, each file's size and
SHA-256: run folders' models, checkpoints and exports), every file but the card is compared with it too: garbage
inside a tensor's bytes parses, and a deleted file of the remote code breaks the folder only on a machine without
energyzoo.

And the files energyzoo writes, whole or not at all: a folder or file is written under a temporary name beside its
final one (`partial_path`: ``.<name>.partial``), flushed to disk and renamed into place when whole (`publish`,
`write_folder_whole`, `write_file_whole`); one process writes a folder at a time (`FolderLock`)."""

import ast
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
from pathlib import Path

import yaml

from .modeling.errors import UserError

CHECKPOINTS = "checkpoints"  # a run folder's checkpoints, each a folder step-NNNNNNN
MODEL = "model"  # the saved model folder, in a run folder and in each of its checkpoints
MANIFEST = "manifest.json"  # a folder's record of what was written: {file: {"bytes", "sha256"}}
CONFIG = "config.json"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# the files `AutoTokenizer.from_pretrained` reads a tokenizer from: a fast tokenizer's, or a slow one's vocabulary
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
CARD_SUFFIXES = (".md",)  # a model card and eval tables: written for people, who may edit them
LOCK = ".energyzoo.lock"  # held by the process writing a folder (`FolderLock`)
PARTIAL = ".partial"  # the suffix of a folder or file being written (`partial_path`)
# What stops a write that the user can fix, by errno: the machine's limits and the output path itself.
WRITE_FAULTS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "the disk quota is used up",
                errno.EFBIG: "a file would pass the file-size limit (ulimit -f)",
                errno.EROFS: "the filesystem is read-only", errno.ENOTDIR: "a part of the path is a file, not a folder",
                errno.EEXIST: "a file is in the way of a folder", errno.EISDIR: "a folder is in the way of a file"}
# The same faults as the writers of torch (its zip writer), safetensors and tokenizers (Rust's io::Error) report them.
_WRITE_FAULT_TEXT = re.compile(r"code: (\d+)|os error (\d+)|unexpected pos|No space left|File too large|Read-only file")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _json_error(path: Path, error: ValueError) -> str:
    if not path.stat().st_size:
        return "is empty"
    where = f" (line {error.lineno}, column {error.colno})" if isinstance(error, json.JSONDecodeError) else ""
    return f"is not valid JSON{where}: truncated or overwritten?"


def read_json(path: str | Path, kind: type = dict):
    """The JSON value in ``path`` (of type ``kind``), or a `UserError` naming the file and what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path} is missing")
    try:
        value = json.loads(path.read_bytes())
    except ValueError as error:  # JSONDecodeError, and UnicodeDecodeError for bytes that are no text
        raise UserError(f"{path} {_json_error(path, error)}") from None
    if not isinstance(value, kind):
        raise UserError(f"{path} holds a JSON {type(value).__name__}, not the {kind.__name__} it should hold")
    return value


def _safetensors_damage(path: Path) -> str | None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "numpy") as weights:  # the header only: no torch needed
            weights.keys()
    except (SafetensorError, OSError) as error:
        return f"is not a safetensors file ({str(error).strip() or type(error).__name__}): truncated or overwritten?"
    return None


def _tokenizer_damage(path: Path) -> str | None:
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_file(str(path))
    except Exception as error:  # noqa: BLE001 - tokenizers raises a bare Exception for every malformed file
        return f"is not a tokenizer `tokenizers` loads ({str(error).splitlines()[0][:120]})"
    return None


def file_damage(path: Path) -> str | None:
    """What is wrong with the file ``path`` by its kind (JSON, safetensors, tokenizer.json, Python, YAML), or None
    when it reads; a kind energyzoo does not parse (a README, a PNG, an optimizer's state) reads as long as it exists
    and is not empty."""
    if not path.is_file():
        return "is missing"
    if not path.stat().st_size:
        return "is empty"
    if path.name == "tokenizer.json":
        return _tokenizer_damage(path)
    if path.suffix == ".json":
        try:
            read_json(path, kind=object)
        except UserError as error:
            return str(error).removeprefix(str(path)).strip()
    elif path.suffix == ".safetensors":
        return _safetensors_damage(path)
    elif path.suffix == ".py":
        try:
            ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError) as error:
            return f"is not valid Python ({type(error).__name__}): truncated or overwritten?"
    elif path.suffix in (".yaml", ".yml"):
        try:
            yaml.safe_load(path.read_bytes())
        except yaml.YAMLError:
            return "is not valid YAML: truncated or overwritten?"
    return None


def write_manifest(folder: Path) -> None:
    """Record every file under ``folder`` (its size and SHA-256) in ``folder/manifest.json``."""
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.name != MANIFEST)
    manifest = {str(path.relative_to(folder)): {"bytes": path.stat().st_size, "sha256": sha256(path)}
                for path in files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def edited_files(folder: Path) -> list[str] | None:
    """The files of ``folder`` that differ from its ``manifest.json`` (changed, deleted, or added since), or None when
    it records no readable manifest (what was written cannot be told)."""
    try:
        manifest = read_json(folder / MANIFEST)
    except UserError:
        return None
    present = {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file() and path.name != MANIFEST}
    changed = [name for name, recorded in manifest.items()
               if name not in present or (folder / name).stat().st_size != recorded.get("bytes")
               or sha256(folder / name) != recorded.get("sha256")]
    return sorted({*changed, *(present - set(manifest))})


def manifest_damage(folder: Path, skip: tuple[str, ...] = (), under: str = "") -> str | None:
    """The first file of ``folder`` (of those under ``under``, but those whose names end in ``skip``) that differs
    from what its ``manifest.json`` records (missing, another size, another SHA-256), said as "<file> <what>", or None
    (also when the folder keeps no manifest)."""
    if not (folder / MANIFEST).is_file():
        return None
    try:
        manifest = read_json(folder / MANIFEST)
    except UserError as error:
        return str(error).removeprefix(str(folder)).strip("/ ")
    for name, recorded in manifest.items():
        if name.endswith(skip) or not name.startswith(under):
            continue
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != recorded.get("bytes"):
            return f"{name} holds {path.stat().st_size} bytes, {recorded.get('bytes')} were written (truncated?)"
        if sha256(path) != recorded.get("sha256"):
            return f"{name} differs from what was written (its SHA-256)"
    return None


def model_folder_damage(folder: Path) -> str | None:
    """Why the model folder ``folder`` cannot be loaded, as "<file> <what is wrong>" (a ``config.json`` that is no
    JSON object with a ``model_type``, no weights, a file of the folder that does not read (`file_damage`), a file
    other than its manifest records, a tokenizer that is partly there), or None."""
    config = folder / CONFIG
    if not config.is_file():
        return f"{config} is missing: not a model folder"
    if why := file_damage(config) or folder_damage(folder):
        return why if why.startswith(str(folder)) else f"{config} {why}"
    if not isinstance(read_json(config).get("model_type"), str):
        return f"{config} names no model_type: not a transformers config"
    weights = [name for name in WEIGHT_FILES if (folder / name).is_file()]
    if not weights:
        return f"{folder} holds no weights (one of {', '.join(WEIGHT_FILES)})"
    for index in (name for name in weights if name.endswith(".index.json")):
        shards = set(read_json(folder / index).get("weight_map", {}).values())
        if missing := sorted(shard for shard in shards if not (folder / shard).is_file()):
            return f"{folder / index} names shards that are missing: {', '.join(missing)}"
    # the manifest is the folder's own, or for a checkpoint's model/ folder the checkpoint's (recording "model/<file>")
    in_checkpoint = folder.name == "model" and not (folder / MANIFEST).is_file()
    recorded = folder.parent if in_checkpoint else folder
    if why := manifest_damage(recorded, skip=CARD_SUFFIXES, under="" if recorded == folder else f"{folder.name}/"):
        return f"{recorded}/{why}"
    return tokenizer_damage(folder, needed=False)


def folder_damage(folder: Path) -> str | None:
    """The first file under ``folder`` that does not read by its kind (`file_damage`), as "<path> <what>", or None."""
    for path in sorted(path for path in folder.rglob("*") if path.is_file() and not path.name.startswith(".")):
        if why := file_damage(path):
            return f"{path} {why}"
    return None


def tokenizer_damage(folder: Path, needed: bool = True) -> str | None:
    """What is wrong with the tokenizer a folder holds (a vocabulary without its ``tokenizer_config.json`` or the
    other way round; with ``needed``, none at all), or None."""
    has_vocabulary = any((folder / name).is_file() for name in TOKENIZER_FILES)
    has_settings = (folder / "tokenizer_config.json").is_file()
    if has_vocabulary and not has_settings:
        return f"{folder}/tokenizer_config.json is missing (the folder's tokenizer needs it beside its vocabulary)"
    if has_settings and not has_vocabulary:
        return (f"{folder} holds tokenizer_config.json but no vocabulary beside it (one of "
                f"{', '.join(TOKENIZER_FILES)}): the tokenizer is partly missing")
    if needed and not has_vocabulary:
        return (f"{folder} holds no tokenizer (tokenizer.json and tokenizer_config.json, as "
                "`tokenizer.save_pretrained(folder)` writes them)")
    return None


def check_tokenizer_folder(folder: Path, role: str) -> Path:
    """``folder``, or a `UserError` naming its first damaged file or what its tokenizer lacks, and its ``role``."""
    if why := folder_damage(folder) or tokenizer_damage(folder):
        raise UserError(f"{why} ({role})")
    return folder


def check_model_folder(folder: str | Path) -> Path:
    """``folder``, or a `UserError` saying why it cannot be loaded (`model_folder_damage`)."""
    folder = Path(folder)
    if why := model_folder_damage(folder):
        raise UserError(why)
    return folder




def write_fault(error: BaseException) -> str | None:
    """What stopped a write, when it is the machine's limits or the output path (`WRITE_FAULTS`: a full disk, the
    file-size limit, a read-only filesystem, a file where a folder should be) rather than energyzoo, said as
    "<path>: <what>"; None for any other error."""
    if isinstance(error, OSError) and error.errno in WRITE_FAULTS:
        return f"{error.filename or 'a file'}: {WRITE_FAULTS[error.errno]}"
    match = _WRITE_FAULT_TEXT.search(str(error))
    if match is None:
        return None
    code = int(match[1] or match[2] or 0) or (errno.ENOSPC if "pos" in match[0] or "space" in match[0] else
                                              errno.EFBIG if "large" in match[0] else errno.EROFS)
    return f"a file: {WRITE_FAULTS[code]}" if code in WRITE_FAULTS else None


def partial_path(path: Path) -> Path:
    """Where ``path`` is written before it is complete."""
    return path.with_name(f".{path.name}{PARTIAL}")


def _fsync_tree(path: Path) -> None:
    """Flush every file under ``path`` (and the folders themselves) to disk, so that a rename never publishes a folder
    whose files a crash of the machine could still lose."""
    for folder, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                os.fsync(handle.fileno())
        descriptor = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def publish(written: Path, path: Path) -> None:
    """Move the complete folder ``written`` to ``path``, replacing what is there (a folder cannot be renamed onto a
    non-empty one: the old one moves aside first and is removed once the new one is in place)."""
    _fsync_tree(written)
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        path.rename(old)
    written.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def write_folder_whole(path: Path, write) -> None:
    """``write(folder)`` into a fresh partial folder beside ``path`` (one an interrupted write left is removed), then
    `publish` it as ``path``: for folders one process writes. A write that fails (a full disk, Ctrl-C) leaves
    ``path`` as it was and no partial folder."""
    written = partial_path(path)
    shutil.rmtree(written, ignore_errors=True)
    try:
        write(written)
        publish(written, path)
    except BaseException:
        shutil.rmtree(written, ignore_errors=True)
        raise


def write_text_whole(path: Path, text: str) -> None:
    write_file_whole(path, lambda written: written.write_text(text))


def write_file_whole(path: Path, write) -> None:
    """``write(file)`` into a partial file beside ``path``, flushed to disk, then renamed onto ``path``: a write that
    fails or is killed leaves ``path`` as it was and no partial file."""
    written = partial_path(path)
    try:
        write(written)
        with open(written, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(written, path)
    except BaseException:
        written.unlink(missing_ok=True)
        raise


class FolderLock:
    """One writer per folder: held (``with``) by the process that writes ``folder``, through an advisory lock on
    ``folder/.energyzoo.lock`` (`fcntl.flock`), which the kernel releases on any exit, a kill included, so a lock
    left by a dead process is no lock. The file says who holds it, and a second writer is refused in one line naming
    that process. The folder is created if missing (and removed again if the holder leaves it empty)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self._descriptor: int | None = None
        self._created = False

    def __enter__(self) -> "FolderLock":
        if self.folder.exists() and not self.folder.is_dir():
            raise UserError(f"{self.folder} is a file, not a folder: choose another output folder")
        self._created = not self.folder.exists()
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / LOCK
        while self._descriptor is None:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(descriptor, 1000).decode(errors="replace").strip() or "another process"
                os.close(descriptor)
                raise UserError(f"{self.folder} is being written by {holder}: wait for it to end (or stop it), then "
                                "run again") from None
            try:  # the holder before us may have removed the file between our open and our lock: lock the new one
                same = os.stat(path).st_ino == os.fstat(descriptor).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._descriptor = descriptor
            else:
                os.close(descriptor)
        os.ftruncate(self._descriptor, 0)
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:3]])
        os.write(self._descriptor, f"process {os.getpid()} on {socket.gethostname()} ({command}, since "
                                   f"{time.strftime('%H:%M:%S')})".encode())
        return self

    def __exit__(self, *exception) -> None:
        os.unlink(self.folder / LOCK)  # before the unlock: a waiting writer then locks a new file, never this one
        os.close(self._descriptor)
        self._descriptor = None
        if self._created and not any(self.folder.iterdir()):
            self.folder.rmdir()


def is_export(folder: Path) -> bool:
    """Whether ``folder`` holds an energyzoo export: a config.json and a model card tagged energyzoo (a card without
    a metadata block is a user's own, read no further: huggingface_hub would warn that it has none)."""
    from huggingface_hub import ModelCard

    card = folder / "README.md"
    if not ((folder / CONFIG).is_file() and card.is_file()) or not card.read_bytes().startswith(b"---"):
        return False
    return "energyzoo" in (ModelCard.load(card).data.tags or [])


def model_folder(path: str | Path, checkpoint: str | None = None) -> Path:
    """The model folder to evaluate or export, checked on disk before anything can reach the network or be written:
    ``path`` itself (a folder with a config.json), or with ``checkpoint`` ("step-N", or a checkpoint folder) the
    model saved in that checkpoint of the run folder ``path`` (or of the run whose ``model/`` folder ``path`` is);
    every file of it must read (`check_model_folder`)."""
    path = Path(path)
    if not path.is_dir():
        raise UserError(f"{path} is not a folder")
    if checkpoint is not None:
        run = path.parent if path.name == MODEL and not (path / CHECKPOINTS).is_dir() else path
        chosen = Path(checkpoint)
        if not chosen.is_dir():
            step = checkpoint.removeprefix("step-")
            if not step.isdigit():
                raise UserError(f"--checkpoint must be step-N or a checkpoint folder, got {checkpoint!r}")
            chosen = run / CHECKPOINTS / f"step-{int(step):07d}"
        path = chosen / MODEL
        if not path.is_dir():
            saved = ", ".join(folder.name for folder in sorted((run / CHECKPOINTS).glob("step-*"))) or "none"
            raise UserError(f"no model in checkpoint {chosen} (checkpoints of {run}: {saved})")
    if not (path / "config.json").is_file():
        raise UserError(f"{path} has no config.json: not a model folder (a run folder takes --checkpoint, "
                                f"or use its {MODEL}/ folder)")
    return check_model_folder(path)
