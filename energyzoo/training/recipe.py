"""Run recipes (`energyzoo/recipes/*.yaml`): what to train, on which data, how (recipes live in `recipes/`, model
definitions in `models/`).

Reading a recipe (`read_recipe`: its keys and types) imports neither torch nor transformers, so that `energyzoo train`
answers a mistyped override at once; validating it (`Recipe.validate`) loads the tables it checks against.

A recipe is YAML with four sections and an output folder::

    model:     {preset: fem-lm-tiny, overrides: {max_position_embeddings: 512}}   # or config: {model_type: ...}
    data:      {source: python-docs, block_size: 128}
    tokenizer: {train_vocab_size: 2048}                                           # or name: <Hub id / folder>
    training:  {steps: 500, batch_size: 16, learning_rate: 3.0e-3, ...}
    output_dir: runs/fem-lm-tiny

The sections are dataclasses read as OmegaConf structured configs: command-line overrides are dotted
``key=value`` pairs (``training.steps=20``, ``training.adam_betas=[0.9,0.98]``), every value is converted to its
field's annotation (``1e-5`` is the float a float field takes) and an unknown key is refused by name.
Token budgets (``total_tokens``, ``batch_tokens``, ``warmup_tokens``) may replace steps, batch size and
warmup steps for language models: they are converted with the block size.
"""

import importlib.util
import logging
import math
import re
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

import pycountry
import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from ..files import model_folder_damage
from ..modeling.errors import UserError, require
from .recipe_files import recipe_file

logger = logging.getLogger(__name__)
MIXED_PRECISION = ("no", "bf16", "fp16")
LR_SCHEDULES = ("cosine", "linear", "constant_with_warmup")  # transformers' `get_scheduler` names
RESOLVER_CALL = re.compile(r"\$\{[^}]*:")  # ${name:arguments}; a plain ${a.b} reference has no colon


@dataclass
class ModelSection:
    """A preset (whose card states its task) or a raw ``config`` with the ``task`` it is trained for. ``init_from``
    (a folder or Hub id) starts from its weights instead of a random initialisation, where the names match (a
    GPT-2 for TEL-GPT2, a Llama for EqT-LLaMA: the papers' warm starts; parts the checkpoint lacks are
    initialised), with its tokenizer unless ``tokenizer.name`` says otherwise; it is the card's ``base_model``."""

    preset: str | None = None
    config: dict | None = None
    task: str | None = None
    overrides: dict = field(default_factory=dict)
    init_from: str | None = None

    def validate(self) -> None:
        from .tasks import TRAINING_TASKS

        owner = "recipe model"
        require(owner, (self.preset is None) != (self.config is None), "preset",
                "given, or else model.config (exactly one of them)", self.preset)
        if self.preset is not None:
            from ..presets import preset_card

            card_task = preset_card(self.preset)["task"]
            require(owner, self.task in (None, card_task), "task", f"{card_task!r} (preset {self.preset}'s card)",
                    self.task)
            self.task = card_task
        require(owner, self.task in TRAINING_TASKS, "task", f"one of {sorted(TRAINING_TASKS)}", self.task)
        require_folder_or_hub_id(owner, "init_from", self.init_from)
        local = self.init_from is not None and Path(self.init_from).expanduser().is_dir()
        if local and (why := model_folder_damage(Path(self.init_from).expanduser())):  # before anything is written
            raise UserError(f"{owner}.init_from: {why}")
        require(owner, isinstance(self.overrides, dict), "overrides", "a mapping of config fields to values",
                self.overrides)
        try:
            self.build_config()
        except (TypeError, ValueError) as error:
            raise UserError(f"recipe model: {error}") from error

    def base_fields(self) -> dict:
        """The config fields before overrides: the preset's, or ``config``."""
        from ..presets import preset_config_fields

        return preset_config_fields(self.preset) if self.preset is not None else dict(self.config)

    def build_config(self, **fields) -> "PretrainedConfig":  # noqa: F821 - transformers', imported when used
        """The model's config: the preset's (or ``config``) with the overrides and then ``fields`` (the tokenizer's
        vocabulary and special ids) applied, each name checked against the config class, every value by it."""
        from ..presets import config_with_overrides

        return config_with_overrides(self.base_fields(), {**self.overrides, **fields})


@dataclass
class DataSection:
    """source: "python-docs" (embedded text), "digits" (embedded 8x8 images), "text" / "jsonl" (local files, folders or
    globs in `paths`, read by `data.local_files`: a text file's paragraphs, a JSONL file's `text_field` of each record
    are its documents), "hf" (a `datasets` text source, e.g. a Hub id or "json" with
    `paths`: streamed, tokenised and packed on the fly, each process reading its share of the documents; validation
    on the documents `data.hub.held_out` picks among the first `examples`), "hf-images" /
    "hf-sudoku" (a `datasets` image-classification / Sudoku source: `image_column`, `label_column`, `image_size`,
    `num_channels` / `puzzle_column`, `solution_column`; local files through `paths`: name "imagefolder" with a
    folder of one sub-folder per class), "sudoku"
    (`examples` generated unique-solution puzzles of box `sudoku_box` with `givens` = [min, max] givens),
    "parity" (`examples` random bit strings of length `block_size` with cumulative-parity labels, eqt.txt eq. 44),
    "induction" (fresh induction-head sequences of a length drawn in `lengths` = [min, max] per step, the max
    growing from min over the first `length_curriculum_steps` steps when that is > 0; validation on `examples`
    sequences of length `block_size`) or
    "digit-codes" / "digit-patches" (the digits as 17-code pixel grids / 4x4 grids of k-means patch codes,
    masked on `mask_schedule`: "cosine", MaskGIT's, or "bernoulli-0.4", hyperset.txt D.4's). Which sources a model
    reads depends on its task (`training.tasks`).
    `language` (ISO 639-1 codes) goes into the model card."""

    source: str = "python-docs"
    paths: list[str] = field(default_factory=list)
    text_field: str = "text"
    name: str | None = None
    subset: str | None = None
    split: str = "train"
    block_size: int = 128
    validation_fraction: float = 0.1
    examples: int = 4000
    givens: list[int] = field(default_factory=lambda: [30, 45])
    lengths: list[int] = field(default_factory=lambda: [16, 64])
    length_curriculum_steps: int = 0
    sudoku_box: int = 3
    mask_schedule: str = "cosine"
    image_column: str = "image"
    label_column: str = "label"
    image_size: int | None = None
    num_channels: int | None = None  # images read as 1 (grayscale) or 3 (RGB) channels; None: from the images
    puzzle_column: str = "puzzle"
    solution_column: str = "solution"
    language: list[str] | None = None  # the text's languages (ISO 639-1) for the model card, e.g. [en]

    def validate(self, task: str) -> None:
        owner = "recipe data"
        from ..data.digits import MASK_SCHEDULES
        from .tasks import training_task

        sources = training_task(task).sources
        require(owner, self.source in sources, "source", f"one of {list(sources)} (the sources of {task!r})",
                self.source)
        require(owner, self.source not in ("text", "jsonl") or bool(self.paths), "paths",
                f"a non-empty list of files for source {self.source!r}", self.paths)
        require(owner, not self.source.startswith("hf") or bool(self.name), "name",
                f"a `datasets` name for source {self.source!r}", self.name)
        require(owner, self.block_size >= 2, "block_size", ">= 2", self.block_size)
        require(owner, self.num_channels in (None, 1, 3), "num_channels", "None (from the images), 1 or 3",
                self.num_channels)
        require(owner, self.image_size is None or self.image_size >= 1, "image_size", "None or an integer >= 1",
                self.image_size)
        require(owner, 0 < self.validation_fraction < 1, "validation_fraction", "in (0, 1)", self.validation_fraction)
        require(owner, self.examples >= 10, "examples", ">= 10", self.examples)
        require(owner, self.mask_schedule in MASK_SCHEDULES, "mask_schedule", f"one of {list(MASK_SCHEDULES)}",
                self.mask_schedule)
        require(owner, self.sudoku_box in (2, 3), "sudoku_box", "2 (4x4 boards) or 3 (9x9)", self.sudoku_box)
        span = self.lengths
        require(owner, len(span) == 2 and 2 <= span[0] <= span[1], "lengths", "[min, max] with 2 <= min <= max", span)
        require(owner, self.length_curriculum_steps >= 0, "length_curriculum_steps", "an integer >= 0",
                self.length_curriculum_steps)
        cells = self.sudoku_box**4
        ordered = len(self.givens) == 2 and 1 <= self.givens[0] <= self.givens[1] < cells
        require(owner, ordered, "givens", f"[min, max] with 1 <= min <= max < {cells}", self.givens)
        unknown = [code for code in self.language or [] if pycountry.languages.get(alpha_2=code) is None]
        require(owner, not unknown, "language", "None or a list of ISO 639-1 codes (en, fr, ...)", self.language)


@dataclass
class TokenizerSection:
    """Either train a byte-level BPE locally (`train_vocab_size`) or load `name` (a Hub id or folder)."""

    name: str | None = None
    train_vocab_size: int = 2048

    def validate(self) -> None:
        require_folder_or_hub_id("recipe tokenizer", "name", self.name)


def can_only_be_local(value: str | None) -> bool:
    """Whether ``value`` is written as a local path (./x, /x, ~/x, a/b/c, a\\b), which no Hub id (user/name) is."""
    return value is not None and (value.startswith((".", "/", "~")) or value.count("/") > 1 or "\\" in value)


def require_folder_or_hub_id(owner: str, field: str, value: str | None) -> None:
    """A folder or Hub id a recipe names: what can only be a local path must exist, so that a typo fails here instead
    of waiting on the Hub."""
    require(owner, not can_only_be_local(value) or Path(value).expanduser().is_dir(), field,
            "an existing folder or a Hub id (user/name)", value)


@dataclass
class TrainingSection:
    steps: int | None = 500
    batch_size: int | None = 16  # global: sequences (or images) per optimiser step, over all processes
    gradient_accumulation: int = 1
    learning_rate: float = 3e-3
    warmup_steps: int | None = 30
    lr_schedule: str = "cosine"
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW's [beta1, beta2]
    mixed_precision: str = "no"
    save_every: int = 100
    save_total_limit: int | None = 3  # the newest checkpoints kept (None: all)
    eval_every: int = 100
    # a validation metric (e.g. validation_accuracy): the model at its best evaluation is kept as best-model/
    # (lower is better for a name ending in "loss"), for evaluations that use the best-validation checkpoint
    keep_best: str | None = None
    log_every: int = 10
    seed: int = 42
    num_threads: int | None = None  # CPU threads of this run (None: torch's default); tiny models run fastest on 1
    activation_checkpointing: bool = False  # recompute each block in the backward pass (transformers' own)
    # accelerate trackers beside metrics.jsonl: "auto" (tensorboard when installed), "none", or a list of names
    report_to: str | list[str] = "auto"
    total_tokens: float | None = None
    batch_tokens: float | None = None
    warmup_tokens: float | None = None

    def resolve_token_budget(self, block_size: int) -> None:
        """Steps, batch size and warmup from token counts (fem.txt §3 states its runs in tokens)."""
        if self.batch_tokens is not None:
            self.batch_size = round(self.batch_tokens / block_size)
        if self.total_tokens is not None:
            self.steps = round(self.total_tokens / (self.batch_size * block_size))
        if self.warmup_tokens is not None:
            self.warmup_steps = round(self.warmup_tokens / (self.batch_size * block_size))

    def trackers(self) -> list[str]:
        """The accelerate trackers `report_to` names ("auto": TensorBoard, offline, when it is installed)."""
        if self.report_to == "auto":
            return ["tensorboard"] if importlib.util.find_spec("tensorboard") else []
        if self.report_to == "none":
            return []
        return [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)

    def validate(self) -> None:
        owner = "recipe training"
        require(owner, isinstance(self.activation_checkpointing, bool), "activation_checkpointing", "true or false",
                self.activation_checkpointing)
        from accelerate.utils import LoggerType

        known = [tracker.value for tracker in LoggerType if tracker.value != "all"]
        named = isinstance(self.report_to, (str, list)) and (
            self.report_to in ("auto", "none") or all(name in known for name in self.trackers()))
        require(owner, named, "report_to", f"'auto', 'none', or one or a list of {known}", self.report_to)
        for name in self.trackers():
            require(owner, importlib.util.find_spec(name) is not None, "report_to",
                    f"installed trackers (pip install {name})", name)
        for name in ("steps", "batch_size", "gradient_accumulation", "save_every", "eval_every", "log_every"):
            value = getattr(self, name)
            require(owner, isinstance(value, int) and value >= 1, name, "an integer >= 1", value)
        require(owner, self.keep_best is None or (isinstance(self.keep_best, str) and self.keep_best.startswith(
            "validation_")), "keep_best", "None or a validation metric (validation_loss, validation_accuracy, ...)",
            self.keep_best)
        limit = self.save_total_limit
        require(owner, limit is None or (isinstance(limit, int) and limit >= 1), "save_total_limit",
                "None (keep every checkpoint) or an integer >= 1", limit)
        require(owner, self.batch_size % self.gradient_accumulation == 0, "gradient_accumulation",
                f"a divisor of batch_size {self.batch_size}", self.gradient_accumulation)
        for name in ("learning_rate", "weight_decay", "max_grad_norm"):
            value = getattr(self, name)
            require(owner, isinstance(value, (int, float)) and math.isfinite(value), name, "a finite number", value)
        require(owner, self.learning_rate > 0, "learning_rate", "> 0", self.learning_rate)
        betas = self.adam_betas
        require(owner, len(betas) == 2 and all(0 <= beta < 1 for beta in betas), "adam_betas",
                "[beta1, beta2], each in [0, 1)", betas)
        require(owner, isinstance(self.warmup_steps, int) and self.warmup_steps >= 0, "warmup_steps",
                "an integer >= 0", self.warmup_steps)
        if self.save_every > self.steps:
            logger.warning(f"recipe training.save_every {self.save_every} > steps {self.steps}: no checkpoint before "
                           "the final model, so an interrupted run starts over (--stop-after saves where it stops)")
        if self.warmup_steps >= self.steps:  # as transformers' Trainer does: the warmup ends with the run
            logger.warning(f"recipe training.warmup_steps {self.warmup_steps} >= steps {self.steps}: warming up over "
                           f"the whole run ({self.steps - 1} steps)")
            self.warmup_steps = self.steps - 1
        require(owner, self.num_threads is None or (isinstance(self.num_threads, int) and self.num_threads >= 1),
                "num_threads", "None or an integer >= 1", self.num_threads)
        require(owner, self.lr_schedule in LR_SCHEDULES, "lr_schedule", f"one of {list(LR_SCHEDULES)}",
                self.lr_schedule)
        require(
            owner,
            self.mixed_precision in MIXED_PRECISION,
            "mixed_precision",
            f"one of {list(MIXED_PRECISION)}",
            self.mixed_precision,
        )
        require(owner, self.weight_decay >= 0, "weight_decay", ">= 0", self.weight_decay)
        require(owner, self.max_grad_norm > 0, "max_grad_norm", "> 0", self.max_grad_norm)


@dataclass
class Recipe:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    tokenizer: TokenizerSection = field(default_factory=TokenizerSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    output_dir: str = "runs/train"

    @property
    def task(self) -> str:
        """The model's task: its preset card's, or ``model.task`` for a raw config (never guessed from data)."""
        return self.model.task

    def validate(self) -> "Recipe":
        self.model.validate()
        self.tokenizer.validate()
        self.data.validate(self.task)
        self._check_block_fits()
        self.training.resolve_token_budget(self.data.block_size)
        self.training.validate()
        return self

    def _check_block_fits(self) -> None:
        """A language model's blocks fit its positions (``max_position_embeddings``, GPT-2's ``n_positions``), checked
        before any data is read: the part that is short is named."""
        if self.task != "causal-lm":
            return
        config = self.model.build_config()
        name = "max_position_embeddings" if hasattr(config, "max_position_embeddings") else "n_positions"
        limit = getattr(config, name, None)
        if limit is not None and self.data.block_size > limit:
            raise UserError(f"recipe data.block_size={self.data.block_size} is longer than the model's {name}="
                            f"{limit}: lower data.block_size, or raise model.overrides.{name}")

    def to_dict(self) -> dict:
        return asdict(self)


def flat_settings(recipe: dict) -> dict[str, object]:
    """A recipe's dict as ``{"section.key": value}`` (``output_dir`` as itself)."""
    flat = {}
    for section, values in recipe.items():
        for key, value in values.items() if isinstance(values, dict) else [(None, values)]:
            flat[section if key is None else f"{section}.{key}"] = value
    return flat


def _yaml_file(path: Path):
    """The YAML file ``path`` as an OmegaConf config; a file that cannot be read or parsed is a one-line `UserError`
    naming it (and the line of a YAML error)."""
    try:
        loaded = OmegaConf.load(path)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        lines = path.read_text(errors="replace").splitlines() if mark else []
        if mark and mark.line < len(lines) and "\t" in lines[mark.line][: mark.column + 1]:
            raise UserError(f"{path}: a tab at line {mark.line + 1}, column {mark.column + 1}: YAML indents with "
                            "spaces only; replace the tab with spaces") from None
        raise UserError(f"{path}: not valid YAML ({problem}{where}; a truncated file?)") from None
    except OSError as error:
        raise UserError(f"{path}: cannot be read ({error.strerror or error})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not text (bytes that are no UTF-8: overwritten?)") from None
    if not isinstance(loaded, DictConfig) or not isinstance(yaml.safe_load(path.read_text()), dict):
        raise UserError(f"{path}: holds no YAML mapping of sections, which a recipe is (model:, data:, training:, ...)")
    return loaded


def _leaves(node, key: str = ""):
    """(dotted key, value) of every leaf of a nested dict / list."""
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _leaves(value, f"{key}.{name}" if key else str(name))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, f"{key}[{index}]")
    else:
        yield key, node


def refuse_resolvers(config, owner: str) -> None:
    """Refuse an interpolation that calls a resolver (``${oc.env:HF_TOKEN}``, ``${oc.decode:...}``, any
    ``${name:...}``): it would write the machine's environment into recipe.yaml and the model card, which a push
    publishes. Plain references to other keys (``${data.block_size}``) stay."""
    for key, value in _leaves(OmegaConf.to_container(config, resolve=False)):
        if isinstance(value, str) and RESOLVER_CALL.search(value):
            raise UserError(f"{owner} {key}: {value!r} calls a resolver, which would copy the machine's environment "
                            "into files a push publishes; write the value itself (plain ${section.key} references "
                            "are fine)")


def _one_as_a_list(schema: type, values: dict) -> dict:
    """``values`` with a single value given for a list field (``data.paths=stories.txt``) made a list of it."""
    kinds = {item.name: item.type for item in fields(schema)}
    for name, value in values.items():
        kind = kinds.get(name)
        if is_dataclass(kind) and isinstance(value, dict):
            _one_as_a_list(kind, value)
        elif getattr(kind, "__origin__", None) is list and isinstance(value, (str, int, float)):
            values[name] = [value]
    return values


def typed_settings(schema: type, overrides: list[str] = (), path: str | Path | None = None, owner: str = "recipe",
                   base: dict | None = None):
    """An instance of the dataclass ``schema`` from a YAML file (``path``), or values (``base``: a report's own
    settings), and dotted ``key=value`` overrides over them, read as an OmegaConf structured config: every key is
    checked against its dataclass (an unknown one is refused by name, with the closest known key), every value converted
    to its field's annotation (``1e-5`` for a float field), and resolver interpolations refused (`refuse_resolvers`).
    Errors are one-line `UserError`s naming ``owner`` and the key (or the file)."""
    for override in overrides:
        if "=" not in override:
            raise UserError(f"override {override!r} must look like key=value (in a recipe: section.key=value)")
    sources = [_yaml_file(Path(path))] if path is not None else []
    if base is not None:
        sources.append(OmegaConf.create(base))
    try:
        sources.append(OmegaConf.from_dotlist(list(overrides)))
    except yaml.YAMLError as error:
        raise UserError(f"{owner} overrides {' '.join(overrides)}: a value is not valid YAML "
                        f"({getattr(error, 'problem', None) or error}); quote it") from None
    try:
        sources = [OmegaConf.create(_one_as_a_list(schema, OmegaConf.to_container(source))) for source in sources]
        merged = OmegaConf.merge(OmegaConf.structured(schema), *sources)
        refuse_resolvers(merged, owner)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        where = f" {error.full_key}" if error.full_key else ""
        raise UserError(f"{owner}{where}: {str(error.msg or error).splitlines()[0]}") from None


def read_recipe(path: str | Path, overrides: list[str] = ()) -> Recipe:
    """A recipe file as a typed `Recipe`, overrides applied (`typed_settings`), not yet validated. A run folder's
    ``recipe.yaml`` is read this way too. Relative ``data.paths`` become absolute: read from the recipe file's folder
    where the file names them, from the current folder where an override does (docs/training.md, "Train on your own
    data")."""
    recipe = typed_settings(Recipe, overrides, path)
    given = any(override.split("=", 1)[0].strip() == "data.paths" for override in overrides)
    anchor = Path.cwd() if given else Path(path).resolve().parent
    recipe.data.paths = [str(anchor / Path(name).expanduser()) for name in recipe.data.paths]
    return recipe


def load_recipe(path_or_name: str | Path, overrides: list[str] = ()) -> Recipe:
    """Read a recipe file (or a shipped one by name), apply overrides and validate it."""
    return read_recipe(recipe_file(path_or_name), overrides).validate()
