"""The fuzzed front door (hypothesis): every registered config class with random field values, every model class with
random inputs. Each case ends in a one-line `ValueError` / `TypeError` that names the field or input it refuses, or in
finite outputs (and a finite loss): never NaN, never an error from inside torch.

Configs: one or two fields of a tiny config of each tester set to values drawn in and out of range: small integers
and zero and negatives, finite floats up to 1e4 in size, NaN and infinities, strings (the zoo's option names among
them), lists, dicts, None and booleans, and names the config does not have (refused with the closest field). A config
that is accepted builds the base model and the tester's head, which run on inputs made for that config, in training
mode with labels and in eval mode. Inputs: batches of 0-3 rows and 0-9 tokens (or images of 0-4 channels and 1-32
pixels a side), ids and labels in and out of range, 2-D masks of any 0/1 pattern (all-zero rows included), other
values and shapes, every dtype of ids, masks and images, on models in float32, bfloat16 and float16.

CI runs a fixed seed and budget (`FUZZ_EXAMPLES` per test, about a minute on 2 cores); ``ENERGYZOO_FUZZ=long`` runs ten
times as many examples on a fresh seed each time.
"""

import dataclasses
import math
import os
from collections import Counter

import pytest
import torch
import zoo
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from energyzoo.bench.task_inputs import task_inputs
from energyzoo.modeling.configuration_fem import FEM_PRIORS
from energyzoo.presets import config_fields, config_with_overrides
from energyzoo.registry import ARCHITECTURES, TASKS

LONG = os.environ.get("ENERGYZOO_FUZZ") == "long"
FUZZ_EXAMPLES = {"configs": 150, "inputs": 150}
FUZZ = settings(max_examples=10 * FUZZ_EXAMPLES["configs"] if LONG else FUZZ_EXAMPLES["configs"], derandomize=not LONG,
                deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
INPUT_FUZZ = settings(FUZZ, max_examples=10 * FUZZ_EXAMPLES["inputs"] if LONG else FUZZ_EXAMPLES["inputs"])
TESTERS = zoo.ONE_PER_HEAD  # every registered head once (FEM's priors are fuzzed through its config fields)
INPUT_NAMES = ("input_ids", "inputs_embeds", "attention_mask", "pixel_values", "labels")
OPTION_NAMES = (*FEM_PRIORS, "head", "channel", "silu", "gelu", "relu", "tanh", "prelu", "basic",
                "bottleneck", "bisoftmax", "sigmoid", "linear", "tokens", "patches", "learned", "sincos2d",
                "sinusoidal", "residual", "hamiltonian", "aligned", "shifted", "window", "full", "implicit",
                "unrolled", "global", "batch", "token", "gaussian", "laplace", "student_t", "mlp", "energy",
                "gradient", "auto", "torch", "standard", "gated", "input", "current", "fixed", "all", "output")
SKIPPED_FIELDS = {"return_dict", "output_hidden_states"}  # they change the outputs' form, not what is computed
TOO_LARGE_TO_RUN = 3_000_000  # parameters: an accepted config this large is counted, not run


def described(tester) -> str:
    return type(tester).__name__.removeprefix("Test").removesuffix("Contract")


FLOATS = st.one_of(st.floats(-1e4, 1e4), st.sampled_from([0.0, -1.0, 1e-12, 0.5, math.nan, math.inf, -math.inf]))
ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-3, 40), st.sampled_from([0, -1, -(2**31)]), FLOATS,
                      st.text(max_size=4), st.sampled_from(OPTION_NAMES), st.lists(st.integers(-2, 6), max_size=4),
                      st.dictionaries(st.sampled_from(["rope_type", "rope_theta", "factor"]),
                                      st.one_of(FLOATS, st.sampled_from(["default", "linear"])), max_size=3))


def near(value) -> st.SearchStrategy:
    """Values of the kind the field holds, around its current one."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-2, max(40, 2 * value))
    if isinstance(value, float):
        return st.floats(-4 * abs(value) - 1, 4 * abs(value) + 1)
    if isinstance(value, str):
        return st.sampled_from(OPTION_NAMES)
    if isinstance(value, (list, tuple)):
        return st.lists(st.integers(-1, 6), max_size=len(value) + 1)
    return ANY_VALUE


def config_changes(tester) -> st.SearchStrategy:
    """One or two fields of the tester's config and values for them."""
    base = tester.make_config()
    names = sorted(field.name for field in dataclasses.fields(base) if field.name not in SKIPPED_FIELDS)

    @st.composite
    def changes(draw):
        fields = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
        # three in four values of the field's own kind, around its value; the rest of any kind
        return {name: draw(st.integers(0, 3).flatmap(lambda kind, name=name: near(getattr(base, name)) if kind
                                                      else ANY_VALUE)) for name in fields}

    return changes()


def assert_refusal_names(error: Exception, names) -> None:
    """A one-line ValueError / TypeError naming one of ``names``."""
    message = str(error)
    assert isinstance(error, (ValueError, TypeError)), f"{type(error).__name__}: {message}"
    assert "\n" not in message.strip(), message
    assert any(name in message for name in names), f"names none of {sorted(names)}: {message}"


def assert_finite(outputs) -> None:
    for name in ("loss", "logits", "last_hidden_state"):
        value = getattr(outputs, name, None)
        if value is not None:
            assert torch.isfinite(value.float()).all(), f"non-finite {name}"


def parameter_count(model_class, config) -> int:
    with torch.device("meta"):
        return sum(parameter.numel() for parameter in model_class(config).parameters())


def run_accepted(tester, config, changed) -> str:
    """An accepted config: the base model and the head build and give finite outputs and loss, or refuse in one
    line naming a changed field. Returns what happened."""
    classes = [ARCHITECTURES[tester.model_type].base_model, tester.head_class]
    for model_class in classes:
        try:
            if parameter_count(model_class, config) > TOO_LARGE_TO_RUN:
                return "accepted, too large to run here"
            torch.manual_seed(0)
            model = model_class(config)
        except (ValueError, TypeError) as error:
            assert_refusal_names(error, changed)
            return "refused by the model class"
        tester.perturb(model)
        inputs = task_inputs(tester.task, config, torch.Generator().manual_seed(1))
        if model_class is not tester.head_class:
            inputs = tester.without_labels(inputs)
        try:
            with torch.no_grad():
                assert_finite(model.train()(**inputs))
                assert_finite(model.eval()(**inputs))
        except (ValueError, TypeError) as error:
            assert_refusal_names(error, {*changed, *INPUT_NAMES})
            return "refused at run time"
    return "accepted and ran finitely"


def report(name: str, outcomes: Counter) -> None:
    """The cases a test tried, by outcome (shown with ``pytest -s``)."""
    print(f"\n{name}: {sum(outcomes.values())} cases: {dict(sorted(outcomes.items()))}")


@pytest.mark.parametrize("tester", TESTERS, ids=described)
def test_random_config_values_are_refused_by_name_or_run_finitely(tester):
    outcomes = Counter()

    @FUZZ
    @given(changed=config_changes(tester))
    def check(changed):
        try:
            config = tester.make_config(**changed)
        except (ValueError, TypeError) as error:
            assert_refusal_names(error, changed)
            outcomes["refused by the config"] += 1
            return
        outcomes[run_accepted(tester, config, changed)] += 1

    check()
    report(f"configs of {described(tester)}", outcomes)


@pytest.mark.parametrize("tester", TESTERS, ids=described)
def test_names_the_config_does_not_have_are_refused_with_the_closest_field(tester):
    """Through `config_with_overrides` (what `config_from_preset`, `model_from_preset` and recipes use): a field's name
    misspelt by one character is refused, naming the field."""
    fields = tester.make_config().to_dict()
    taken = config_fields(type(tester.make_config()))
    names = sorted(field.name for field in dataclasses.fields(tester.make_config()) if len(field.name) > 4)

    @FUZZ
    @given(name=st.sampled_from(names), typo=st.sampled_from(["s", "x", "_"]))
    def check(name, typo):
        assume(f"{name}{typo}" not in taken)
        with pytest.raises(ValueError, match=rf"has no field '{name}{typo}'; did you mean '[a-z_0-9]+'\?"):
            config_with_overrides(fields, {f"{name}{typo}": 1})

    check()


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@st.composite
def token_inputs(draw, config, task: str, takes_mask: bool) -> dict:
    vocab = config.vocab_size
    batch, length = draw(st.sampled_from([1, 2, 3] * 3 + [0])), draw(st.sampled_from(list(range(1, 10)) * 2 + [0]))
    low, high = draw(st.sampled_from([(0, vocab)] * 4 + [(-2, vocab), (0, vocab + 2)]))
    ids = torch.randint(low, high, (batch, length), generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    ids = ids.to(draw(st.sampled_from([torch.long] * 4 + [torch.int, torch.float32, torch.bool])))
    inputs = {"input_ids": ids}
    if takes_mask and draw(st.booleans()):
        rows = draw(st.sampled_from([batch, batch, batch + 1]))
        columns = draw(st.sampled_from([length, length, max(length - 1, 0), length + 2]))
        values = draw(st.lists(st.sampled_from([0, 1, 1, 1] * 5 + [2]), min_size=rows * columns,
                               max_size=rows * columns))
        mask = torch.tensor(values, dtype=torch.long).view(rows, columns)
        if rows and draw(st.booleans()):
            mask[0] = 0  # a row of padding only
        inputs["attention_mask"] = mask.to(draw(st.sampled_from([torch.long, torch.bool, torch.float32])))
    if draw(st.booleans()) and batch and length:
        classes = getattr(config, TASKS[task].label_classes)
        shape = (batch,) if TASKS[task].labels == "sequence" else (batch, length)
        labels = torch.randint(draw(st.sampled_from([0, -100, -1])), classes + draw(st.sampled_from([0, 0, 1])), shape)
        inputs["labels"] = labels.clamp_min(-100).masked_fill(labels < -1, -100)
    return inputs


@st.composite
def image_inputs(draw, config) -> dict:
    batch = draw(st.sampled_from([1, 2, 3] * 3 + [0]))
    channels = draw(st.sampled_from([config.num_channels] * 6 + [1, 2, 4]))
    size = config.image_size if hasattr(config, "image_size") else 16
    size = size if isinstance(size, int) else size[0]
    height, width = (draw(st.sampled_from([size] * 6 + [1, 4, 32])) for _ in range(2))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 99)))
    pixels = torch.randn(batch, channels, height, width, generator=generator)
    inputs = {"pixel_values": pixels.to(draw(st.sampled_from([torch.float32] * 4 + [torch.long])))}
    if draw(st.booleans()) and batch:
        inputs["labels"] = torch.randint(0, config.num_labels + draw(st.sampled_from([0, 0, 2])), (batch,))
    return inputs


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("tester", TESTERS, ids=described)
def test_random_inputs_are_refused_by_name_or_give_finite_outputs(tester, dtype):
    torch.manual_seed(0)
    models = [
        tester.build(model_class).to(DTYPES[dtype])
        for model_class in (ARCHITECTURES[tester.model_type].base_model, tester.head_class)
    ]
    config = models[0].config
    if tester.head_class.main_input_name == "pixel_values":
        strategy = image_inputs(config)
    else:
        strategy = token_inputs(config, tester.task, takes_mask=tester in zoo.padded_testers([tester]))

    outcomes = Counter()

    @settings(INPUT_FUZZ, max_examples=INPUT_FUZZ.max_examples // len(DTYPES))
    @given(inputs=strategy, head=st.booleans(), training=st.booleans())
    def check(inputs, head, training):
        model = models[int(head)].train(training)
        if not head:
            inputs = tester.without_labels(inputs)
        inputs = {
            name: value.to(DTYPES[dtype]) if name == "pixel_values" and value.is_floating_point() else value
            for name, value in inputs.items()
        }
        try:
            with torch.no_grad():
                outputs = model(**inputs)
        except (ValueError, TypeError) as error:
            assert_refusal_names(error, INPUT_NAMES)
            outcomes[f"refused ({next(name for name in INPUT_NAMES if name in str(error))})"] += 1
            return
        assert_finite(outputs)
        outcomes["finite outputs"] += 1

    check()
    report(f"inputs of {described(tester)} in {dtype}", outcomes)


def test_every_registered_head_is_fuzzed():
    assert zoo.missing_coverage(TESTERS, priors=False) == []
