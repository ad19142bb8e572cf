"""The package layout: `modeling/` is flat and imports only siblings; its files are the few
shared ones or belong to one family by name; shared files import no family file; families import no other
family; the package's folders import each other without loops; and every config check runs once."""

import ast
import fnmatch
import graphlib
import importlib
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import energyzoo
from energyzoo.modeling import checks
from energyzoo.registry import ARCHITECTURES

PACKAGE = Path(energyzoo.__file__).parent
MODELING = PACKAGE / "modeling"
SHARED = {"errors", "outputs", "refinement", "checks", "inputs", "positions", "numerics", "image_processing_grayscale",
          "caches", "transformers_compat"}
FAMILIES = {entry.family for entry in ARCHITECTURES.values()}


def imports(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in a file, function-level ones included (level 0: absolute)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def family_of(stem: str) -> str | None:
    """The family a modeling file belongs to by its name, or None for a shared file."""
    if stem in SHARED:
        return None
    for family in FAMILIES:
        if stem.startswith(f"{family}_") or stem in (f"configuration_{family}", f"modeling_{family}"):
            return family
    raise AssertionError(f"modeling/{stem}.py is neither shared ({sorted(SHARED)}) nor named after a family "
                         f"({sorted(FAMILIES)}: <family>_*, configuration_<family>, modeling_<family>)")


MODELING_FILES = sorted(path for path in MODELING.glob("*.py") if path.stem != "__init__")


@pytest.mark.parametrize("path", MODELING_FILES, ids=lambda path: path.name)
def test_modeling_files_import_siblings_of_their_family_or_shared_files_only(path):
    own = family_of(path.stem)
    for level, module in imports(path):
        assert level in (0, 1) and not module.startswith("energyzoo"), f"{path.name}: import {'.' * level}{module}"
        if level == 1:
            assert (MODELING / f"{module}.py").exists(), f"{path.name}: .{module} is not a sibling file"
            assert family_of(module) in (None, own), f"{path.name} ({own or 'shared'}) imports .{module}"


def test_every_family_has_its_configuration_and_modeling_pair():
    stems = {path.stem for path in MODELING_FILES}
    for family in FAMILIES:
        assert {f"configuration_{family}", f"modeling_{family}"} <= stems


def package_part(module: str) -> str:
    """The top-level folder or module of energyzoo that a dotted module name is in."""
    return module.removeprefix("energyzoo.").split(".")[0]


def test_package_folders_import_each_other_without_loops():
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        dotted = ".".join(("energyzoo", *path.relative_to(PACKAGE).with_suffix("").parts))
        part = package_part(dotted)
        if part == "__init__":
            continue  # the package root re-exports names; every part is below it
        package = dotted if path.stem == "__init__" else dotted.rsplit(".", 1)[0]
        for level, module in imports(path):
            if level:
                base = package.rsplit(".", level - 1)[0] if level > 1 else package
                target = f"{base}.{module}" if module else base
            elif module.startswith("energyzoo"):
                target = module
            else:
                continue
            if package_part(target) not in (part, "energyzoo"):
                graph.setdefault(part, set()).add(package_part(target))
    assert graph["quickstart"] >= {"training", "eval", "export"}
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import loop between energyzoo folders: {error.args[1]}")


@pytest.fixture
def require_calls(monkeypatch) -> list[tuple[str, str, str]]:
    """Every `checks.require` call, as (owner, field, allowed), from every energyzoo module that uses it."""
    importlib.import_module("energyzoo.training.recipe")
    calls = []
    original = checks.require

    def recorded(owner, condition, field, allowed, value):
        calls.append((owner, field, allowed))
        original(owner, condition, field, allowed, value)

    users = [module for name, module in sys.modules.items()
             if name.startswith("energyzoo") and getattr(module, "require", None) is original]
    assert {"energyzoo.modeling.configuration_fem",
            "energyzoo.modeling.configuration_tel", "energyzoo.training.recipe"} <= {m.__name__ for m in users}
    for module in users:
        monkeypatch.setattr(module, "require", recorded)
    return calls


def build_recipe():
    from energyzoo.training.recipe import load_recipe

    return load_recipe("tel-vit-digits")


@pytest.mark.parametrize("build", [*(entry.config_class for entry in ARCHITECTURES.values()), energyzoo.TELSettings,
                                   build_recipe], ids=lambda build: build.__name__)
def test_each_config_check_runs_once_per_construction(build, require_calls):
    build()
    assert require_calls, "no check ran"
    repeated = [call for call, count in Counter(require_calls).items() if count > 1]
    assert not repeated, f"checks run more than once: {repeated}"


def test_checks_name_the_owner_the_field_the_range_and_the_value():
    with pytest.raises(ValueError, match=r"TELViTConfig\.tel_steps must be >= 1, got 0"):
        energyzoo.TELViTConfig(tel_steps=0)
    with pytest.raises(ValueError, match=r"FEMConfig\.prior must be one of .*, got 'cosine'"):
        energyzoo.FEMConfig(prior="cosine")


# A path that leaves the repository: a parent folder, the project's shared folder, its specs or design notes, a home or
# work folder.
OUTSIDE_PATH = re.compile(r"\.\./|(?<![\w.])(?:shared|specs)/|/(?:work|home|root|tmp)/|\bspec §"
                          r"|\b(?:DESIGN|HF_NOTES)\.md")
ROOT = PACKAGE.parent
CITING_FILES = sorted([*(p for p in PACKAGE.rglob("*") if p.suffix in {".py", ".md", ".yaml", ".json"}),
                       ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "tests").rglob("*.py"),
                       ROOT / ".ci" / "run", *(ROOT / "scripts").iterdir()])


@pytest.mark.parametrize("path", CITING_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_file_cites_a_path_outside_the_repository(path):
    """Docstrings ship inside every exported checkpoint, and the README and docs ship with the repository: they cite
    the papers (section, equation, table) and the repository's own files, nothing a user does not have."""
    outside = [f"{path.name}:{number}: {line.strip()}" for number, line in enumerate(path.read_text().splitlines(), 1)
               if OUTSIDE_PATH.search(line)]
    assert not outside, "\n".join(outside)


def layout_entries() -> list[str]:
    """The file patterns of docs/contributing.md's layout tree: a line's names (comma-separated, before two spaces and
    the description) under the folders its indentation (two spaces a level) puts it in."""
    text = (ROOT / "docs" / "contributing.md").read_text()
    tree = text.split("## Layout", 1)[1].split("```\n")[1]
    folders, patterns = [], []
    for line in tree.splitlines():
        match = re.match(r"( *)(\S.*?)(?: {2,}.*)?$", line)
        del folders[len(match[1]) // 2 :]
        names = match[2].split(", ")
        if len(names) == 1 and names[0].endswith("/"):
            folders.append(names[0])
        else:
            patterns += ["".join(folders) + name for name in names]
    return patterns


def test_the_documented_layout_is_the_tracked_tree():
    """Every tracked file is in the layout (a package's `__init__.py` under its folder), and every entry names one."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    patterns = layout_entries()
    unlisted = [path for path in tracked if not any(fnmatch.fnmatchcase(path, pattern) for pattern in patterns)
                and not path.endswith("/__init__.py")]
    assert not unlisted, f"tracked files the layout of docs/contributing.md lacks: {unlisted}"
    assert not [pattern for pattern in patterns if not any(fnmatch.fnmatchcase(path, pattern) for path in tracked)]
