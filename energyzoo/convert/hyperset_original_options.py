"""The Hyper-SET authors' task options (their Hydra config's ``model`` and ``data`` keys) that a converted checkpoint
reads, and their shipped defaults: a table without torch, so that `energyzoo convert --set` checks the names it is
given before anything loads (`check_option_names`)."""

from ..modeling.errors import UserError, did_you_mean

# The authors' shipped task YAMLs (configs/task/*.yaml, configs/config.yaml), for what a state dict cannot say.
ORIGINAL_DEFAULTS = {
    "image-classification": {"n_recur": 12, "input_cond": False, "lora_alpha": 8,
                             "attention": "bisoftmax", "ff": "relu", "step_size": 1.0, "dataset": "c10"},
    "token-classification": {"n_recur": 24, "input_cond": True, "adaptive_mode": "gd_with_learnable_step_size"},
    "masked-image-modeling": {"n_recur": 12, "img_size": 256, "adaptive_mode": "gd_with_learnable_step_size",
                              "phi_func": None},
}
# Image size and normalisation of the authors' image-classification datasets (ic/dataset.py).
ORIGINAL_DATASETS = {
    "c10": (32, [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
    "c100": (32, [0.5071, 0.4867, 0.4408], [0.2675, 0.2565, 0.2761]),
    "svhn": (32, [0.4377, 0.4438, 0.4728], [0.1980, 0.2010, 0.1970]),
    "in100": (224, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    "in1k": (224, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
}
# Options a state dict's task reads beside the defaulted ones: the image classifier's model type and image size, the
# Sudoku model's board cells (without learned positions).
READ_WITHOUT_DEFAULT = ("type", "size", "block_size")
OPTION_NAMES = sorted({name for defaults in ORIGINAL_DEFAULTS.values() for name in defaults}
                      | set(READ_WITHOUT_DEFAULT))
# energyzoo's names (HyperSETConfig fields) of what the authors' options set: a user who knows ours is pointed to theirs
ENERGYZOO_NAMES = {"num_iterations": "n_recur", "image_size": "size (image classification) or img_size (MaskGIT)",
                   "update_mode": "adaptive_mode", "fixed_step_size": "step_size", "attention_type": "attention",
                   "ff_type": "ff", "max_position_embeddings": "block_size (Sudoku) or img_size (MaskGIT)"}


def check_option_names(names) -> None:
    """Refuse, in one line, a name that is none of the authors' options (`OPTION_NAMES`), with the closest one, or the
    authors' name of one of energyzoo's fields."""
    for name in names:
        if name in OPTION_NAMES:
            continue
        if name in ENERGYZOO_NAMES:
            raise UserError(f"hyperset-original: --set {name} is energyzoo's name; the authors' option is "
                            f"{ENERGYZOO_NAMES[name]}")
        raise UserError(f"hyperset-original: --set {name} is none of the authors' options"
                        f"{did_you_mean(name, OPTION_NAMES)} (they are {', '.join(OPTION_NAMES)})")
