#!/usr/bin/env bash
# The upstream canary: a scratch venv with the newest release of every library energyzoo builds on (torch and DeepSpeed
# included, whatever the pins in pyproject.toml say), the model contract + generation + export + sharded-training tests
# run there, and the versions with what broke. Run it before raising a pin or when a release lands:
#
#     bash scripts/check_upstream.sh            # a fresh venv under a temporary folder, removed afterwards
#     CANARY_VENV=~/.cache/zoo-canary bash scripts/check_upstream.sh   # keep (and reuse) the venv
#
# The newest torch on the package index may be a CUDA build of several GB (it runs on CPU too). The model code refuses
# transformers releases outside its tested range (energyzoo/modeling/transformers_compat.py); the canary lets it run
# with ENERGYZOO_ALLOW_UNTESTED_TRANSFORMERS=1, so a new release's breakage shows as failing tests, not one refusal.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${CANARY_VENV:-}" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  CANARY_VENV="$scratch/venv"
fi
[ -x "$CANARY_VENV/bin/python" ] || python3 -m venv "$CANARY_VENV"
python="$CANARY_VENV/bin/python"
# the newest releases, past any cap a machine's pip configuration sets (this project's machines cap torch)
pip_install() {
  PIP_CONFIG_FILE=/dev/null "$python" -m pip install --quiet --disable-pip-version-check --upgrade "$@" \
    > "$CANARY_VENV/install.log" 2>&1 || { tail -n 30 "$CANARY_VENV/install.log"; exit 1; }
}
pip_install pip
pip_install torch
pip_install transformers accelerate peft datasets tokenizers safetensors huggingface_hub lm-eval
# energyzoo itself without its pins, then the rest of its dependencies and test tools as they resolve today: the
# names in pyproject.toml, the [eval], [vision], [plots] and [test] extras included
pip_install --no-deps -e .
names=$("$python" -c '
import tomllib
from packaging.requirements import Requirement
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = [line for extra in ("eval", "vision", "plots", "test") for line in project["optional-dependencies"][extra]]
print(" ".join(sorted({Requirement(line).name for line in project["dependencies"] + extras})))')
# shellcheck disable=SC2086  # one word per package name
pip_install $names
# DeepSpeed built against that torch, its CPU op compiled now (docs/training.md, "Scaling out")
DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 pip_install --no-build-isolation deepspeed
echo "== the newest releases"
"$python" - <<'EOF'
from importlib.metadata import version
for name in ("torch", "transformers", "accelerate", "peft", "datasets", "tokenizers", "safetensors",
             "huggingface_hub", "lm_eval", "deepspeed"):
    print(f"{name:16} {version(name)}")
EOF
echo "== the contract, generation, export and sharded-training tests on them"
tests=(tests/test_*_contract.py tests/test_static_caches.py tests/test_exports.py tests/test_remote_code_isolation.py
       tests/test_*_transformers.py tests/test_transformers_common.py tests/test_engines.py
       tests/test_sharded_training.py)
export ENERGYZOO_ALLOW_UNTESTED_TRANSFORMERS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 OMP_NUM_THREADS=1
"$python" -m pytest -q -p no:cacheprovider -rf --tb=line --disable-warnings "${tests[@]}" 2>&1 | tail -n 60
status=${PIPESTATUS[0]}
echo "== canary: pytest exit status $status (0: nothing broke)"
exit "$status"
