"""The authors' Hyper-SET (huyunzhe/hyper-set) in energyzoo: their checkpoints converted (`hyperset_original`,
`energyzoo convert hyperset-original`), every option of their code as a config field checked in float64 against
the equations written out (tests/support/hyperset_reference.py), and the fixed tables in float64."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from support import hyperset_reference as ref
from support.original_checkpoints import LAYOUTS, original_state, saved_original

from energyzoo.cli import main
from energyzoo.convert.hyperset_original import convert_original, load_hyperset_original
from energyzoo.modeling.configuration_hyperset import HyperSETConfig
from energyzoo.modeling.errors import UserError
from energyzoo.modeling.hyperset_layer import sinusoid
from energyzoo.modeling.modeling_hyperset import (
    HyperSETForImageClassification,
    HyperSETForMaskedImageModeling,
    HyperSETForTokenClassification,
    HyperSETModel,
    sincos2d_positions,
)
from energyzoo.modeling.positions import sinusoidal_positions

HEADS = {"image-classification": HyperSETForImageClassification, "token-classification": HyperSETForTokenClassification,
         "masked-image-modeling": HyperSETForMaskedImageModeling}
REMOTE_CHECK = Path(__file__).parent / "support" / "remote_load_check.py"


def inputs_for(model, seed: int = 0) -> dict:
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    if config.input_type == "patches":
        return {"pixel_values": torch.randn(2, 3, config.image_size, config.image_size, generator=generator)}
    return {"input_ids": torch.randint(0, config.vocab_size, (2, config.max_position_embeddings), generator=generator)}


@pytest.mark.parametrize("name", [name for name in LAYOUTS if not name.startswith("_")])
def test_every_layout_of_the_authors_converts_and_loads_strictly(name, tmp_path):
    layout = LAYOUTS[name]
    state = original_state(name)
    model = load_hyperset_original(saved_original(tmp_path, name), **layout["options"])
    assert type(model) is HEADS[layout["task"]]  # the head of the task the state dict holds
    used = {key: value for key, value in state.items() if not key.endswith("attn.mask")}
    if model.config.step_size_mode == "fixed":  # MaskGIT's fixed-step modes keep a network they never run
        used = {key: value for key, value in used.items() if "time_mlp" not in key}
    weights = model.state_dict()
    assert sum(v.numel() for v in weights.values()) == sum(v.numel() for v in used.values())
    torch.testing.assert_close(sum(v.double().sum() for v in weights.values()),
                               sum(v.double().sum() for v in used.values()))
    with torch.no_grad():
        assert torch.isfinite(model(**inputs_for(model)).logits).all()


def test_a_safetensors_checkpoint_and_a_wrapped_one_convert_alike(tmp_path):
    name = "ic-hyper-set"
    options = LAYOUTS[name]["options"]
    plain = load_hyperset_original(saved_original(tmp_path, name, ".safetensors"), **options)
    wrapped_state = {f"module._orig_mod.{key}": value for key, value in original_state(name).items()}
    torch.save({"model_state_dict": wrapped_state}, tmp_path / "ddp.pt")
    wrapped = load_hyperset_original(tmp_path / "ddp.pt", **options)
    inputs = inputs_for(plain)
    with torch.no_grad():
        torch.testing.assert_close(plain(**inputs).logits, wrapped(**inputs).logits, rtol=0, atol=0)


def converted_layout(name: str):
    """(the layout's state dict, the head converted from it)."""
    state = original_state(name)
    return state, load_hyperset_original(state, **LAYOUTS[name]["options"])


def _copy(parameter: torch.nn.Parameter, value: torch.Tensor) -> None:
    with torch.no_grad():
        parameter.copy_(value)


def assert_head_copied_and_logits_equal(converted, model, state, head: dict[str, str]) -> None:
    """Copy the head's weights (attribute path -> the authors' key) into ``model`` by hand, then both models give the
    same logits, exactly."""
    for path, key in head.items():
        module, attribute = path.split(".")
        _copy(getattr(getattr(model, module), attribute), state[key])
    inputs = inputs_for(model)
    with torch.no_grad():
        torch.testing.assert_close(converted(**inputs).logits, model(**inputs).logits, rtol=0, atol=0)


def test_a_converted_lora_classifier_equals_one_built_by_hand():
    state, converted = converted_layout("ic-hyper-set-lora")
    config = HyperSETConfig(hidden_size=16, num_attention_heads=4, intermediate_size=16, num_iterations=3,
                            image_size=16, patch_size=4, num_labels=10, qkv_norm="separate", hidden_act="gelu",
                            time_embed_dim=8, step_net_rmsnorm=True, step_condition="current", lora_rank=2,
                            lora_alpha=8)
    model = HyperSETForImageClassification(config).eval()
    encoder, layer = model.model, model.model.layers[0]
    for index in range(3):
        _copy(encoder.embeddings.patch_embeddings[index].weight, state[f"emb.{index}.weight"])
        _copy(encoder.embeddings.patch_embeddings[index].bias, state[f"emb.{index}.bias"])
    _copy(encoder.embeddings.cls_token, state["cls_token"])
    _copy(layer.qkv_proj.weight, state["enc.0.attn.qkv.weight"])
    _copy(layer.ff_proj.weight, state["enc.0.mlp.weight"])
    _copy(layer.ff_norm.weight, state["enc.0.ln2.weight"])
    for index in range(3):
        _copy(layer.qkv_norms[index].weight, state[f"enc.0.attn.ln1_{index + 1}.weight"])
    time_mlp = encoder.step_sizes.time_mlp
    for mine, theirs in ((time_mlp[0], 1), (time_mlp[1], 2), (time_mlp[3], 4), (time_mlp[4], 5), (time_mlp[5], 6)):
        for attribute in ("weight", "bias"):
            if getattr(mine, attribute, None) is not None:
                _copy(getattr(mine, attribute), state[f"time_mlp.0.{theirs}.{attribute}"])
    _copy(encoder.step_sizes.out_proj.weight, state["time_mlp.1.1.weight"])
    _copy(encoder.step_sizes.out_proj.bias, state["time_mlp.1.1.bias"])
    _copy(encoder.step_sizes.condition_norm.weight, state["ln_inp.weight"])
    lora = encoder.depthwise_lora
    for r in range(3):
        _copy(lora.qkv_up[r], state[f"deltaW_attention_B.{r}"])
        _copy(lora.qkv_down[r], state[f"deltaW_attention_A.{r}"])
        _copy(lora.ff_up[r], state[f"deltaW_ff_B.{r}"])
        _copy(lora.ff_down[r], state[f"deltaW_ff_A.{r}"])
    assert_head_copied_and_logits_equal(converted, model, state, {
        "norm.weight": "fc.0.weight", "norm.bias": "fc.0.bias", "classifier.weight": "fc.1.weight",
        "classifier.bias": "fc.1.bias"})


def test_a_converted_two_layer_sudoku_model_with_adam_equals_one_built_by_hand():
    state, converted = converted_layout("sudoku-adam-2-layers")
    config = HyperSETConfig(hidden_size=16, num_attention_heads=2, intermediate_size=16, num_hidden_layers=2,
                            num_iterations=3, input_type="tokens", vocab_size=10, max_position_embeddings=81,
                            use_cls_token=False, position_embedding_type="learned", num_labels=9, time_embed_dim=8,
                            step_condition="current", step_condition_rmsnorm=False, update_mode="adam")
    model = HyperSETForTokenClassification(config).eval()
    encoder = model.model
    _copy(encoder.embeddings.token_embeddings.weight, state["tok_emb.weight"])
    _copy(encoder.embeddings.position_embeddings, state["pos_emb"])
    for i, layer in enumerate(encoder.layers):
        _copy(layer.qkv_proj.weight, state[f"blocks.{i}.attn.qkv.weight"])
        _copy(layer.qkv_norms[0].weight, state[f"blocks.{i}.attn.ln1.weight"])
        _copy(layer.ff_proj.weight, state[f"blocks.{i}.mlp.weight"])
        _copy(layer.ff_norm.weight, state[f"blocks.{i}.ln2.weight"])
    network = encoder.step_sizes
    for mine, theirs in ((network.time_mlp[0], "time_mlp.0.1"), (network.time_mlp[4], "time_mlp.0.3"),
                         (network.out_proj, "time_mlp.1.1")):
        _copy(mine.weight, state[f"{theirs}.weight"])
        _copy(mine.bias, state[f"{theirs}.bias"])
    assert_head_copied_and_logits_equal(converted, model, state, {"norm.weight": "ln_f.weight",
                                                                  "classifier.weight": "head.weight"})


def test_a_converted_maskgit_model_with_phi_and_rmsprop_equals_one_built_by_hand():
    state, converted = converted_layout("maskgit-phi-rmsprop")
    config = HyperSETConfig(hidden_size=16, num_attention_heads=4, intermediate_size=16, num_iterations=3,
                            input_type="tokens", vocab_size=33, codebook_size=32, mask_token_id=32,
                            max_position_embeddings=16, use_cls_token=False, position_embedding_type="sincos2d",
                            attention_type="linear", linear_attention_scale="tokens", ff_type="gated",
                            update_mode="rmsprop", step_size_mode="fixed", fixed_step_size=0.5,
                            fixed_feedforward_step_size=0.1)
    model = HyperSETForMaskedImageModeling(config).eval()
    layer = model.model.layers[0]
    _copy(model.model.embeddings.token_embeddings.weight, state["tok_emb.weight"])
    _copy(layer.qkv_proj.weight, state["transformer.qkv.weight"])
    _copy(layer.qkv_norms[0].weight, state["transformer.ln1.weight"])
    _copy(layer.ff_proj.weight, state["transformer.mlp.weight"])
    _copy(layer.ff_norm.weight, state["transformer.ln2.weight"])
    assert_head_copied_and_logits_equal(converted, model, state, {
        "norm.weight": "lm_head.0.weight", "classifier.weight": "lm_head.1.weight",
        "classifier.bias": "lm_head.1.bias"})


def test_an_alternative_model_gets_a_step_size_head_per_layer_from_its_layers():
    name = "ic-hyper-set-alt-attn"
    state = original_state(name)
    model = load_hyperset_original(state, **LAYOUTS[name]["options"])
    assert model.config.step_head_per_layer and model.config.attention_type == "linear"
    for i, layer in enumerate(model.model.layers):
        torch.testing.assert_close(layer.step_head.out_proj.weight, state[f"enc.{i}.time_mlp_inner.2.weight"])
        torch.testing.assert_close(layer.step_head.condition_norm.weight, state[f"enc.{i}.ln_inp.weight"])
    torch.testing.assert_close(model.model.step_sizes.time_mlp[4].weight, state["time_mlp.5.weight"])


@pytest.mark.parametrize(("change", "message"), [
    (lambda state, options: state.update({"enc.0.attn.extra.weight": torch.zeros(1)}), "enc.0.attn.extra.weight"),
    (lambda state, options: options.update(type="hyper-set-lora"), "type='hyper-set-lora'"),
    (lambda state, options: options.update(dataset="mnist"), "dataset='mnist'"),
    (lambda state, options: state.pop("emb.1.weight"), "none of the authors' Hyper-SET models"),
])
def test_a_checkpoint_energyzoo_cannot_express_is_refused_by_name(change, message):
    state, options = original_state("ic-hyper-set"), dict(LAYOUTS["ic-hyper-set"]["options"])
    change(state, options)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_hyperset_original(state, **options)


@pytest.mark.parametrize(("name", "options", "message"), [
    ("maskgit", {"phi_func": "tanh"}, "phi_func='tanh'"),
    ("sudoku", {"adaptive_mode": "newton"}, "adaptive_mode='newton'"),
    ("ic-hyper-set-alt-attn", {"type": "hyper-set-alt-attn", "attention": "relu"}, "attention='relu'"),
    ("ic-hyper-set-alt-attn", {"type": "hyper-set-alt-attn", "input_cond": True}, "input_cond=True"),
    ("ic-hyper-set-alt-attn", {"type": None}, "type=hyper-set-alt-attn or type=hyper-set-alt-ff"),
])
def test_options_of_the_authors_code_with_no_equivalent_are_refused(name, options, message):
    with pytest.raises(UserError, match=message):
        convert_original(original_state(name), LAYOUTS[name]["task"], {**LAYOUTS[name]["options"], **options})


def test_the_defaults_taken_are_reported():
    _, _, taken = convert_original(original_state("sudoku"), None, {})
    assert taken == {"adaptive_mode": "gd_with_learnable_step_size", "input_cond": True, "n_recur": 24}
    _, info = load_hyperset_original(original_state("sudoku"), output_loading_info=True)
    assert info == {"defaults_taken": taken}


@pytest.mark.slow
def test_convert_writes_a_folder_that_a_pipeline_runs_in_a_fresh_process_without_energyzoo(tmp_path):
    name = "ic-hyper-set"
    source = saved_original(tmp_path, name)
    folder = tmp_path / "converted"
    assert main(["convert", "hyperset-original", str(source), str(folder), "--set", "n_recur=3", "--set", "size=16",
                 "--set", "dataset=c100"]) == 0
    model = load_hyperset_original(source, n_recur=3, size=16, dataset="c100")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8))
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    assert processor["image_mean"] == [0.5071, 0.4867, 0.4408] and processor["size"] == {"height": 16, "width": 16}
    from transformers import AutoImageProcessor

    pixels = AutoImageProcessor.from_pretrained(folder)(image, return_tensors="pt").pixel_values
    with torch.no_grad():
        expected = model(pixel_values=pixels).logits
    payload = tmp_path / "payload.pt"
    torch.save({"auto_class": "AutoModelForImageClassification", "inputs": {"pixel_values": pixels},
                "expected": expected}, payload)
    result = subprocess.run([sys.executable, str(REMOTE_CHECK), str(folder), str(payload)], capture_output=True,
                            text=True, check=False)
    assert "REMOTE_OK" in result.stdout, result.stderr[-2000:]
    script = ("import sys, numpy as np; from PIL import Image; from transformers import pipeline\n"
              "image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 24, 3), dtype=np.uint8))\n"
              "print(pipeline('image-classification', model=sys.argv[1], trust_remote_code=True)(image, top_k=1))")
    result = subprocess.run([sys.executable, "-c", script, str(folder)], capture_output=True, text=True, check=False)
    assert f"LABEL_{expected.argmax().item()}" in result.stdout, result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "auto_class"), [("sudoku", "AutoModelForTokenClassification"),
                                                  ("maskgit", "AutoModelForMaskedImageModeling")])
def test_converted_token_models_load_in_a_fresh_process(name, auto_class, tmp_path):
    source = saved_original(tmp_path, name)
    folder = tmp_path / "converted"
    options = [item for key, value in LAYOUTS[name]["options"].items() for item in ("--set", f"{key}={value}")]
    assert main(["convert", "hyperset-original", str(source), str(folder), *options]) == 0
    model = load_hyperset_original(source, **LAYOUTS[name]["options"])
    inputs = inputs_for(model)
    with torch.no_grad():
        expected = model(**inputs).logits
    payload = tmp_path / "payload.pt"
    torch.save({"auto_class": auto_class, "inputs": inputs, "expected": expected}, payload)
    result = subprocess.run([sys.executable, str(REMOTE_CHECK), str(folder), str(payload)], capture_output=True,
                            text=True, check=False)
    assert "REMOTE_OK" in result.stdout, result.stderr[-2000:]


# ---- every option, float64, against the equations written out ----

def reference_encoder(model: HyperSETModel, x0: torch.Tensor) -> torch.Tensor:
    """The encoder's last hidden state from x(0), written from the equations (tests/support/hyperset_reference.py)
    with the model's weights."""
    config = model.config
    iterations = config.num_iterations
    t = torch.arange(1, iterations + 1)
    learned = config.step_size_mode == "learned"
    if learned:
        network = model.step_sizes
        linears, gains = [], [None, None, None]
        if network.time_mlp is not None:
            mlp = network.time_mlp
            linears = [(mlp[0].weight, mlp[0].bias), (mlp[4].weight, mlp[4].bias)]
            if config.step_net_rmsnorm:
                gains = [mlp[1].weight, mlp[3].weight, mlp[5].weight]
        c = ref.time_path(t, config.time_embed_dim or config.hidden_size, linears, gains)
    x = x0
    for layer in model.layers:
        states = [{}, {}]
        for r in range(iterations):
            if learned:
                head = layer.step_head if config.step_head_per_layer else model.step_sizes
                condition = x0 if config.step_condition == "input" else x
                head_weights = (head.condition_norm.weight if head.condition_norm is not None else None,
                                head.head_norm.weight if config.step_head_rmsnorm else None,
                                head.out_proj.weight, head.out_proj.bias)
                alpha, gamma = ref.step_network(linears, gains, head_weights, condition, c[r])
            else:
                alpha, gamma = config.fixed_step_size, config.feedforward_step_size
            options = dict(mu=config.update_momentum, eta=config.update_second_moment_decay, eps=config.update_eps)
            gains = [n.weight for n in layer.qkv_norms]
            g = ref.attention_direction(x, layer.qkv_proj.weight, gains, config.num_attention_heads,
                                        config.attention_type, config.linear_attention_scale)
            u, states[0] = ref.update(config.update_mode, g, states[0], r + 1, **options)
            x = x - alpha * u
            g = ref.feedforward_direction(x, layer.ff_proj.weight, layer.ff_norm.weight, config.ff_type)
            u, states[1] = ref.update(config.update_mode, g, states[1], r + 1, **options)
            x = x + gamma * u
    return x


OPTIONS = {
    "x(0) raw (paper)": {},
    "x(0) normalised (IC input_cond)": {"step_condition_rmsnorm": True},
    "x_t normalised (IC)": {"step_condition": "current"},
    "x_t raw (Sudoku input_cond=False)": {"step_condition": "current", "step_condition_rmsnorm": False},
    "a head per layer": {"num_hidden_layers": 2, "step_head_per_layer": True, "step_head_rmsnorm": True,
                         "step_net_rmsnorm": True, "step_condition": "current"},
    "raw sinusoid, head RMSNorm (MaskGIT)": {"time_embed_dim": 0, "step_head_rmsnorm": True},
    "momentum": {"update_mode": "momentum", "num_hidden_layers": 2},
    "rmsprop": {"update_mode": "rmsprop"},
    "rmsprop with momentum": {"update_mode": "rmsprop_momentum", "update_momentum": 0.5},
    "adam": {"update_mode": "adam", "num_hidden_layers": 2},
    "adam, fixed alpha and gamma": {"update_mode": "adam", "step_size_mode": "fixed", "fixed_step_size": 0.5,
                                    "fixed_feedforward_step_size": 0.1, "update_second_moment_decay": 0.9},
    "phi attention over T^-1/2, gated feed-forward": {"attention_type": "linear", "linear_attention_scale": "tokens",
                                                      "ff_type": "gated"},
    "phi attention over p^-1/2": {"attention_type": "linear"},
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_every_option_follows_the_equations_in_float64_outputs_and_gradients(option):
    torch.manual_seed(0)
    config = HyperSETConfig(hidden_size=16, num_attention_heads=2, intermediate_size=24, num_iterations=4,
                            input_type="tokens", vocab_size=7, max_position_embeddings=9, use_cls_token=False,
                            position_embedding_type="learned", **{"time_embed_dim": 8, **OPTIONS[option]})
    model = HyperSETModel(config).double()
    with torch.no_grad():  # every weight drawn, so the zero-initialised step-size network acts
        for parameter in model.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.3 + (1.0 if parameter.dim() == 1 else 0.0))
    embeds = torch.randn(3, 9, 16, dtype=torch.float64)
    weights = torch.randn(3, 9, 16, dtype=torch.float64)
    output = model(inputs_embeds=embeds).last_hidden_state
    (output * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    expected = reference_encoder(model, embeds + model.embeddings.position_embeddings)
    (expected * weights).sum().backward()
    torch.testing.assert_close(output, expected, rtol=1e-12, atol=1e-12)
    assert grads.keys() == {name for name, p in model.named_parameters() if p.grad is not None}
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            torch.testing.assert_close(grads[name], parameter.grad, rtol=1e-10, atol=1e-10, msg=name)
    assert output.sub(embeds).abs().max() > 1e-2  # the steps act


def test_the_update_rule_restarts_for_each_layer_and_continues_past_the_trained_iterations():
    """Test-time scaling runs the rule on (t = R + 1, ...): the output of R + 2 iterations equals the reference's."""
    torch.manual_seed(1)
    config = HyperSETConfig(hidden_size=16, num_attention_heads=2, intermediate_size=16, num_iterations=2,
                            input_type="tokens", vocab_size=7, max_position_embeddings=5, use_cls_token=False,
                            position_embedding_type="learned", step_size_mode="fixed", update_mode="adam",
                            num_hidden_layers=2)
    model = HyperSETModel(config).double()
    embeds = torch.randn(2, 5, 16, dtype=torch.float64)
    longer = HyperSETModel(HyperSETConfig(**{**config.to_dict(), "num_iterations": 4})).double()
    longer.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(inputs_embeds=embeds, refinement_steps=4).last_hidden_state,
                                   reference_encoder(longer, embeds + model.embeddings.position_embeddings))


@pytest.mark.parametrize(("field", "value"), [("update_momentum", 1.0), ("update_second_moment_decay", -0.1),
                                              ("update_eps", 0.0), ("update_mode", "newton"),
                                              ("linear_attention_scale", "width")])
def test_out_of_range_update_fields_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        HyperSETConfig(**{field: value})


def test_a_per_layer_head_needs_the_step_size_network():
    with pytest.raises(ValueError, match="step_head_per_layer"):
        HyperSETConfig(step_head_per_layer=True, step_size_mode="fixed")


# ---- the fixed tables in float64 ----

def test_the_fixed_tables_are_float64_accurate():
    """Against numpy's float64 formulas (the authors' pos_embed.py definitions): 1-D sinusoidal positions, the 2-D
    sin-cos grid (odd sides too: their Sudoku's 9 x 9) and the iteration sinusoid."""
    width, count = 24, 17
    position = np.arange(count)[:, None]
    angles = position * np.exp(np.arange(0, width, 2) * (-np.log(10000.0) / width))
    table = np.zeros((count, width))
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    np.testing.assert_allclose(sinusoidal_positions(torch.arange(count), width).numpy(), table, rtol=0, atol=1e-15)
    for side in (4, 9):
        omega = 1.0 / 10000 ** (np.arange(width // 4) / (width / 4.0))
        columns, rows = np.meshgrid(np.arange(side), np.arange(side))

        def encode(coordinate, omega=omega):
            out = coordinate.reshape(-1)[:, None] * omega[None]
            return np.concatenate([np.sin(out), np.cos(out)], axis=1)

        grid = np.concatenate([encode(columns), encode(rows)], axis=1)
        np.testing.assert_allclose(sincos2d_positions(side * side, width, "cpu").numpy(), grid, rtol=0, atol=1e-15)
    half = width // 2
    frequencies = np.exp(np.arange(half) * -(math.log(10000) / (half - 1)))
    t = np.arange(1, 7)[:, None] * frequencies[None]
    np.testing.assert_allclose(sinusoid(torch.arange(1, 7), width).numpy(),
                               np.concatenate([np.sin(t), np.cos(t)], axis=1), rtol=0, atol=1e-14)
