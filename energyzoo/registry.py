"""The one table where an architecture is declared: its config, base model and task heads, its
card template and facts, and the presets `energyzoo bench` measures. The Auto registration, export, fine-tuning,
training, the bench and the contract testers read it; adding an architecture adds an entry here and touches no
other table.

`TASKS` names what each task head is to transformers and the Hub (its Auto class, pipeline tag); what training
does per task (data, batch -> model kwargs, metrics) is `training.tasks`, keyed by the same names.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForMaskedImageModeling,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
)

from .modeling.configuration_eer import EERConfig
from .modeling.configuration_eqt import EqTLlamaConfig
from .modeling.configuration_fem import FEMConfig
from .modeling.configuration_hyperset import HyperSETConfig
from .modeling.configuration_tel import TELGPT2Config, TELResNetConfig, TELViTConfig
from .modeling.errors import UserError
from .modeling.image_processing_grayscale import GrayscaleImageProcessor
from .modeling.modeling_eer import EERForCausalLM, EERModel
from .modeling.modeling_eqt import EqTLlamaForCausalLM, EqTLlamaModel
from .modeling.modeling_fem import FEMForCausalLM, FEMForSequenceClassification, FEMModel
from .modeling.modeling_hyperset import (
    HyperSETForImageClassification,
    HyperSETForMaskedImageModeling,
    HyperSETForTokenClassification,
    HyperSETModel,
)
from .modeling.modeling_tel import (
    TELGPT2LMHeadModel,
    TELGPT2Model,
    TELResNetForImageClassification,
    TELResNetModel,
    TELViTForImageClassification,
    TELViTModel,
)


@dataclass(frozen=True)
class Task:
    """A task head as transformers and the Hub know it, and what its inputs and labels are: every table of the zoo
    that depends on the task (the seeded batches of the doctor and the fuzz tests, training's model inputs,
    transformers' common tests) reads it here.

    auto_class: its Auto class; transformers_mapping: the name of transformers' table that lists the model classes of
    the task (``modeling_auto.MODEL_FOR_..._MAPPING_NAMES``), where transformers' tests look a class's task up.
    pipeline_tag: the transformers pipeline that runs it, given the preprocessor it reads (``preprocessor``:
    "tokenizer" or "image_processor"); None where transformers has no pipeline for the head.
    main_input: what the head reads ("input_ids", or "pixel_values" for images).
    labels: what a label is: "next-token" (the inputs themselves, shifted by the loss), "sequence" (one per sequence
    or image), "token" (one per position) or "masked" (one per masked position, -100 elsewhere).
    label_classes: the config field that counts the values a label takes."""

    auto_class: type
    description: str
    transformers_mapping: str
    labels: str
    label_classes: str
    pipeline_tag: str | None = None
    preprocessor: str | None = None
    main_input: str = "input_ids"


TASKS = {
    "causal-lm": Task(AutoModelForCausalLM, "language modelling", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "next-token",
                      "vocab_size", "text-generation", "tokenizer"),
    "sequence-classification": Task(AutoModelForSequenceClassification, "sequence classification",
                                    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES", "sequence", "num_labels",
                                    "text-classification", "tokenizer"),
    "token-classification": Task(AutoModelForTokenClassification, "token classification",
                                 "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES", "token", "num_labels",
                                 "token-classification", "tokenizer"),
    "image-classification": Task(AutoModelForImageClassification, "image classification",
                                 "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "sequence", "num_labels",
                                 "image-classification", "image_processor", main_input="pixel_values"),
    # visual-token codes in, codes out: no transformers pipeline takes them
    "masked-image-modeling": Task(AutoModelForMaskedImageModeling, "masked image modelling",
                                  "MODEL_FOR_MASKED_IMAGE_MODELING_MAPPING_NAMES", "masked", "codebook_size"),
}


@dataclass(frozen=True)
class Bench:
    """What `energyzoo bench` measures for an architecture, and the performance targets it is held to.

    presets: measured together, in one paired run, against the one baseline their cards name (or ``baseline``).
    workloads: names in `bench.table.WORKLOADS` ("forward", "train_step", "peak_memory"; for language models
    also "decode", "decode_static", "decode_padded" and "first_generate", which no entry names: `--workloads` asks).
    targets(config, call): the bound on each workload's ratio (arm / baseline) for a model of that config run with
    the forward keywords ``call`` (and ``seq_len`` in a length sweep): an upper bound, a lower one for a rate
    (tokens/s). A length sweep's growth row (a preset's longest length against its shortest) passes ``seq_len`` and
    ``reference_seq_len``.
    sweep: a forward keyword measured at each of its values, an arm per value, in the forward workload (EqT-LLaMA's
    refinement steps K), or ``"seq_len"``: the forward workload at each length, the baseline too (FEM's length
    scaling); the other workloads run each preset at its own settings.
    contrasts: (preset, reference preset) pairs among ``presets``, each reported as rows of its own from the same
    paired repeats (EER's regularised loss against cross-entropy on one model).
    batch_size, seq_len: the default shape (images take the config's image size).
    baseline: the baseline preset, where a preset's card names none (a variant measured beside the model its
    baseline was matched to: Hyper-SET's fixed step sizes).
    """

    presets: tuple[str, ...]
    workloads: tuple[str, ...]
    targets: Callable[[PretrainedConfig, dict], dict[str, float]] = field(default=lambda config, call: {})
    sweep: tuple[str, tuple[int, ...]] | None = None
    contrasts: tuple[tuple[str, str], ...] = ()
    batch_size: int = 4
    seq_len: int = 1024
    baseline: str | None = None


FEM_TARGETS = {"forward": 1.05, "train_step": 1.10, "peak_memory": 1.10, "decode": 0.90, "decode_static": 0.95,
               "decode_padded": 0.90}
LINEAR_GROWTH_SLACK = 1.125  # an O(T) prior's forward may grow 4.5x from 1024 to 4096 tokens: linear, 12.5% slack


def _fem_targets(config, call) -> dict[str, float]:
    """FEM_TARGETS against the baseline; a length sweep's growth from the shortest to the longest length bounded by
    1.125x the length ratio for the O(T) priors, unbounded for an O(T^2) one (softmax's)."""
    if "reference_seq_len" not in call:
        return FEM_TARGETS
    growth = call["seq_len"] / call["reference_seq_len"]
    return {} if config.prior_spec.quadratic else {"forward": LINEAR_GROWTH_SLACK * growth}


@dataclass(frozen=True)
class Architecture:
    """One architecture of the zoo.

    heads: task -> head model class (the first is the architecture's main head); each task is a `TASKS` key.
    family: the paper's family, the prefix of its files (``modeling/configuration_<family>.py``,
        ``modeling/<family>_*.py``, the card template ``export/templates/<family>.md``, ``docs/models/<family>.md``, its
        experiments' ``reproduce/<family>_*.py``); card_facts(config) gives its card's own variables.
    tiny_preset: a preset of the main head under two million parameters, what the tests train whole and sharded.
    bench: what `energyzoo bench` measures against the baseline the presets' cards name (None: not benched yet).
    """

    config_class: type
    base_model: type
    heads: dict[str, type]
    family: str
    tiny_preset: str
    card_facts: Callable[[PretrainedConfig], dict] = field(default=lambda config: {})
    bench: Bench | None = None

    @property
    def card_template(self) -> str:
        return f"{self.family}.md"

    @property
    def model_classes(self) -> dict[type, type]:
        """Auto class -> model class, the base model's included."""
        return {AutoModel: self.base_model, **{TASKS[task].auto_class: head for task, head in self.heads.items()}}

    def head(self, architectures: list[str] | None = None) -> tuple[str, type]:
        """(task, head class) of a saved model whose `config.architectures` names it; the main head otherwise."""
        for task, head in self.heads.items():
            if architectures and head.__name__ in architectures:
                return task, head
        return next(iter(self.heads.items()))


def _tel_card_facts(backbone: str):
    def facts(config) -> dict:
        return dict(backbone=backbone, tel_blocks=config.tel_blocks(), tel_placement=config.tel_placement,
                    tel_steps=config.tel_steps, tel_activation=config.tel_activation)

    return facts


def _tel_head_targets(config, call) -> dict[str, float]:
    return {"forward": 1.05, "train_step": 1.05} if config.tel_placement == "head" else {}


def _eqt_targets(config, call) -> dict[str, float]:
    """K = 8 inference within 2x its Llama; a training step at the paper's settings (K_train = 2, every energy of
    eq. 11 on) within 1.3x (eqt.txt: about +15% per epoch)."""
    if "refinement_steps" in call:
        return {"forward": 2.0} if call["refinement_steps"] == 8 else {}
    lambdas = (config.lambda_rev, config.lambda_mask, config.lambda_conf, config.lambda_mem)
    return {"train_step": 1.3} if config.erm_num_steps_train == 2 and all(lambdas) else {}


ARCHITECTURES = {
    "fem": Architecture(
        FEMConfig,
        FEMModel,
        {"causal-lm": FEMForCausalLM, "sequence-classification": FEMForSequenceClassification},
        "fem",
        "fem-lm-tiny",
        card_facts=lambda config: dict(prior=config.prior),
        # fem.txt Table 7's GPT-2 size is `energyzoo bench fem-lm-table7` (against llama-table7)
        bench=Bench(("fem-lm-table5",), ("forward", "train_step", "peak_memory", "decode", "decode_static",
                                         "decode_padded"),
                    targets=_fem_targets, sweep=("seq_len", (1024, 4096))),
    ),
    "tel-gpt2": Architecture(TELGPT2Config, TELGPT2Model, {"causal-lm": TELGPT2LMHeadModel}, "tel", "tel-gpt2-tiny",
                             card_facts=_tel_card_facts("GPT-2"),
                             bench=Bench(("tel-gpt2-head", "tel-gpt2-full"),
                                         ("forward", "train_step", "peak_memory", "decode"),
                                         targets=_tel_head_targets, batch_size=2, seq_len=512)),
    "tel-vit": Architecture(TELViTConfig, TELViTModel, {"image-classification": TELViTForImageClassification},
                            "tel", "tel-vit-tiny", card_facts=_tel_card_facts("ViT"),
                            bench=Bench(("tel-vit-base-patch32-head", "tel-vit-base-patch32-full"),
                                        ("forward", "train_step", "peak_memory"), batch_size=8)),
    "tel-resnet": Architecture(TELResNetConfig, TELResNetModel,
                               {"image-classification": TELResNetForImageClassification}, "tel", "tel-resnet-tiny",
                               card_facts=_tel_card_facts("ResNet"),
                               bench=Bench(("tel-resnet18-head", "tel-resnet18-full"),
                                           ("forward", "train_step", "peak_memory"), batch_size=8)),
    "hyperset": Architecture(
        HyperSETConfig,
        HyperSETModel,
        {"image-classification": HyperSETForImageClassification,
         "masked-image-modeling": HyperSETForMaskedImageModeling,
         "token-classification": HyperSETForTokenClassification},
        "hyperset",
        "hyperset-digits-tiny",
        card_facts=lambda config: dict(layers=config.num_hidden_layers, iterations=config.num_iterations),
        # hyperset.txt Table 16's shape (Small, ImageNet-1K, 224 px), with the step-size network and with fixed steps,
        # against the looped Transformer of its parameter count (the paper's 1.6x the time is at 0.65x the parameters)
        bench=Bench(("hyperset-small-in1k", "hyperset-small-in1k-fixed-steps"),
                    ("forward", "train_step", "peak_memory"),
                    targets=lambda config, call: {"forward": 1.5, "peak_memory": 1.5},
                    contrasts=(("hyperset-small-in1k", "hyperset-small-in1k-fixed-steps"),), batch_size=8,
                    baseline="hyperset-small-in1k-transformer"),
    ),
    "eqt-llama": Architecture(
        EqTLlamaConfig,
        EqTLlamaModel,
        {"causal-lm": EqTLlamaForCausalLM},
        "eqt",
        "eqt-llama-tiny",
        card_facts=lambda config: dict(sites=config.erm_sites, steps=config.erm_num_steps,
                                       train_steps=config.erm_num_steps_train),
        bench=Bench(("eqt-llama-340m",), ("forward", "train_step", "peak_memory", "decode"),
                    sweep=("refinement_steps", (0, 1, 2, 4, 8, 16)), targets=_eqt_targets, batch_size=1, seq_len=512),
    ),
    "eer-looped": Architecture(
        EERConfig,
        EERModel,
        {"causal-lm": EERForCausalLM},
        "eer",
        "eer-induction",
        card_facts=lambda config: dict(loops=config.num_loops, dynamics=config.loop_dynamics,
                                       lambdas=f"lambda_P = {config.lambda_potential}, lambda_K = "
                                               f"{config.lambda_kinetic}, lambda_S = {config.lambda_entropy}"),
        # eer.txt Table 1's model (regularised loss, and cross-entropy alone) against its looped GPT-2-style baseline,
        # at the induction recipe's batch and longest length
        bench=Bench(("eer-induction", "eer-induction-ce"), ("forward", "train_step", "peak_memory", "decode"),
                    contrasts=(("eer-induction", "eer-induction-ce"),), batch_size=32, seq_len=64),
    ),
}


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise UserError(f"{model_type!r} is not a zoo architecture; the zoo has {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


def register_all() -> None:
    """Register every architecture with AutoConfig, its Auto model classes, and for remote code (the grayscale
    image processor of the single-channel classifiers too)."""
    GrayscaleImageProcessor.register_for_auto_class("AutoImageProcessor")
    for entry in ARCHITECTURES.values():
        config_class = entry.config_class
        AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
        config_class.register_for_auto_class()
        for auto_class, model_class in entry.model_classes.items():
            auto_class.register(config_class, model_class, exist_ok=True)
            model_class.register_for_auto_class(auto_class.__name__)


def auto_map_for(model_type: str) -> dict[str, str]:
    """`config.auto_map` naming every Auto class the architecture supports (save_pretrained alone records
    only the saved class)."""
    entry = architecture(model_type)
    classes = {AutoConfig: entry.config_class, **entry.model_classes}
    return {auto.__name__: f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}" for auto, cls in classes.items()}
