"""Exported folders are remote code of their own: any number of them (here two copies of every causal LM's export,
FEM with each prior) and the installed package load, generate and train side by side in one process. Each copy of
the code defines its own FEM cache-layer classes, while transformers builds caches from one process-wide table of
layer types; a copy must never meet another copy's cache layers as foreign (the defect: "FEM layer 0 needs a
FEMSoftmaxCacheLayer ...; got FEMSoftmaxCacheLayer")."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import zoo
from contract import fresh_process_env

from energyzoo.export import export_model

pytestmark = pytest.mark.slow  # processes of their own

SCRIPT = Path(__file__).parent / "support" / "side_by_side_check.py"
LANGUAGE_MODELS = {zoo.name_of(tester): tester for tester in zoo.causal_lm_testers(zoo.HEADS_AND_PRIORS)}


def case(tester, folder: Path) -> dict:
    """Two exports of one tiny model, and what it generates on left-padded prompts and computes after one SGD step
    on a batch with labels (the loss, then the prompts' logits), in this process."""
    model = tester.build()
    folders = {copy_name: export_model(model, folder / copy_name) for copy_name in ("a", "b")}
    prompts = tester._left_padded_prompts(model)
    generation = dict(max_new_tokens=6, do_sample=False, pad_token_id=model.config.pad_token_id)
    batch = tester.make_inputs(model.config, batch_size=2, seed=7)
    trained = copy.deepcopy(model).train()
    loss = trained(**batch).loss
    loss.backward()
    torch.optim.SGD(trained.parameters(), lr=0.1).step()
    with torch.no_grad():
        trained_logits = trained.eval()(**prompts).logits
    return {"folders": {name: str(path) for name, path in folders.items()}, "prompts": prompts,
            "generation": generation, "generated": model.generate(**prompts, **generation), "batch": batch,
            "loss": loss.detach(), "trained_logits": trained_logits}


def test_two_copies_of_every_lm_export_and_the_package_generate_and_train_side_by_side(tmp_path):
    payload = {name: case(tester, tmp_path / name) for name, tester in LANGUAGE_MODELS.items()}
    torch.save(payload, tmp_path / "payload.pt")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "payload.pt")], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env=fresh_process_env(tmp_path))
    assert done.returncode == 0 and f"SIDE_BY_SIDE_OK {3 * len(LANGUAGE_MODELS)}" in done.stdout, done.stderr[-4000:]


def test_every_registered_language_model_and_prior_is_exported_side_by_side():
    assert zoo.missing_coverage(list(LANGUAGE_MODELS.values()), tasks={"causal-lm"}) == []
