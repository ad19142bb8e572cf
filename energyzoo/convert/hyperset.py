"""`energyzoo convert hyperset-original`: the Hyper-SET authors' checkpoints (huyunzhe/hyper-set), any of their three
tasks (`hyperset_original` reads them), as Hub-ready energyzoo folders."""

import tempfile
from pathlib import Path

import yaml

from ..export import export_folder
from .hyperset_original import load_hyperset_original, original_task, read_original_state_dict
from .hyperset_original_options import ORIGINAL_DATASETS


def original_options(config_file: str | Path | None, assignments: dict) -> dict:
    """The authors' task options: their Hydra config's ``model`` and ``data`` keys (a run's ``.hydra/config.yaml``
    or a file of ``configs/task``), then ``assignments`` over them."""
    options = {}
    if config_file is not None:
        settings = yaml.safe_load(Path(config_file).read_text()) or {}
        for section in ("data", "model"):
            options.update(settings.get(section) or {})
    return {**options, **assignments}


def convert_hyperset_original(source: str | Path, output_dir: str | Path, options: dict, overwrite: bool = False
                              ) -> tuple[Path, str, dict]:
    """Write the Hub-ready folder of an authors' Hyper-SET checkpoint (with, for image classification, the image
    processor of the authors' test transform: resize, their dataset's mean and std). Returns (the folder, the task,
    the options taken from the authors' defaults). ``overwrite`` replaces an earlier conversion whose files were
    edited (`export_folder`)."""
    output_dir = Path(output_dir)
    state = read_original_state_dict(source)
    model, info = load_hyperset_original(state, output_loading_info=True, **options)
    task, defaults = original_task(state), info["defaults_taken"]
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        if task == "image-classification":  # beside the model, so that the export records it in its manifest
            from transformers import ViTImageProcessorPil

            _, mean, std = ORIGINAL_DATASETS[options.get("dataset", defaults.get("dataset"))]
            size = model.config.image_size
            ViTImageProcessorPil(do_resize=True, size={"height": size, "width": size}, do_rescale=True,
                                 rescale_factor=1 / 255, do_normalize=True, image_mean=mean, image_std=std,
                                 do_convert_rgb=True).save_pretrained(folder)
        export_folder(folder, output_dir, overwrite=overwrite, name=output_dir.name)
    return output_dir, task, defaults
