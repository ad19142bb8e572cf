"""The package as users get it: the wheel `pip` builds from this checkout carries every module and every data file
of the source tree (presets, recipes, card templates, bench results), checked against the tree itself; and the
supported transformers range is stated once, the same in pyproject.toml and the model code. (.ci/run also installs
the wheel into a fresh venv and runs `scripts/wheel_smoke.py` and the quickstart there.)"""

import subprocess
import sys
import zipfile
from pathlib import Path

import energyzoo
from energyzoo.modeling.transformers_compat import TESTED_TRANSFORMERS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = Path(energyzoo.__file__).parent


def test_the_wheel_carries_every_file_of_the_package_tree(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=600)
    (wheel,) = tmp_path.glob("energyzoo-*.whl")
    shipped = {name for name in zipfile.ZipFile(wheel).namelist() if name.startswith("energyzoo/")}
    tree = {f"energyzoo/{path.relative_to(PACKAGE).as_posix()}" for path in PACKAGE.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}
    assert any(name.startswith("energyzoo/presets/") for name in tree)  # the tree is the package's, data included
    assert tree - shipped == set()
    entry_points = next(name for name in zipfile.ZipFile(wheel).namelist() if name.endswith("entry_points.txt"))
    assert "energyzoo = energyzoo.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_supported_transformers_range_is_the_one_the_model_code_checks():
    assert f'"transformers{TESTED_TRANSFORMERS}",' in (ROOT / "pyproject.toml").read_text()
