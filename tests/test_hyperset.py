"""Hyper-SET's layer against its energies (hyperset.txt eq. 3-11): the bi-softmax output is the gradient of the
attention energy, each half-step descends its energy for a small step and ascends it for the opposite sign, and
the zero-initialised step-size network makes the model the identity for any number of iterations."""

import math

import pytest
import torch
from hyperset_reference import energy_of_projections, unit_gain_energies

from energyzoo import (
    HyperSETConfig,
    HyperSETForTokenClassification,
    HyperSETModel,
    model_from_preset,
    preset_card,
    preset_names,
)
from energyzoo.modeling.hyperset_layer import (
    ColumnSoftmaxRead,
    HyperSETLayer,
    HyperSETStepSizes,
    LearnedStepSizes,
    bisoftmax,
    linear_attention,
    sigmoid_attention,
)

HEADS, WIDTH = 4, 32


def test_bisoftmax_is_the_gradient_of_the_attention_energy_in_float64():
    z = torch.randn(2, HEADS, 7, WIDTH // HEADS, dtype=torch.float64, requires_grad=True)
    (gradient,) = torch.autograd.grad(energy_of_projections(z), z)
    torch.testing.assert_close(bisoftmax(z, z, z), gradient, rtol=1e-12, atol=1e-12)
    one_sided = (z @ z.transpose(-1, -2) / math.sqrt(z.shape[-1])).softmax(-1) @ z
    assert not torch.allclose(one_sided, gradient, atol=1e-3)  # the column half matters


def _materialised_bisoftmax(query, key, value):
    """eq. 9 as written: both softmaxes of the one N x N score matrix, summed, times v."""
    scores = query @ key.transpose(-1, -2) / math.sqrt(query.shape[-1])
    return (scores.softmax(dim=-1) + scores.softmax(dim=-2)) @ value


@pytest.mark.parametrize("shared", [True, False], ids=["symmetric", "three-norms"])
def test_bisoftmax_and_its_gradients_equal_the_materialised_form_in_float64(shared):
    """The fused row half (SDPA) plus the recomputing column half against eq. 9 materialised, under autograd: the
    outputs and the gradients of q, k and v, for q = k = v (a shared norm: A symmetric) and for three different ones
    (`qkv_norm="separate"`: A is not symmetric, so the column softmax is no transpose of the row one)."""
    generator = torch.Generator().manual_seed(3)
    tensors = [torch.randn(2, HEADS, 11, WIDTH // HEADS, dtype=torch.float64, generator=generator) * 2
               for _ in range(1 if shared else 3)]
    leaves = [tensor.requires_grad_() for tensor in tensors]
    query, key, value = leaves * 3 if shared else leaves
    out, reference = bisoftmax(query, key, value), _materialised_bisoftmax(query, key, value)
    torch.testing.assert_close(out, reference, rtol=1e-12, atol=1e-12)
    upstream = torch.randn(out.shape, dtype=torch.float64, generator=generator)
    for ours, theirs in zip(torch.autograd.grad(out, leaves, upstream),
                            torch.autograd.grad(reference, leaves, upstream), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(ColumnSoftmaxRead.apply, (*(query, key, value), 0.7))


def test_bisoftmax_keeps_no_n_by_n_tensor_for_backward():
    """What autograd saves for backward, read off its saved-tensor hooks: the materialised form keeps three N x N
    tensors per head (two softmaxes and their sum); bisoftmax keeps q, k, v, SDPA's output and its log-sum-exp."""
    tokens, head_dim = 40, WIDTH // HEADS
    query, key, value = (torch.randn(2, HEADS, tokens, head_dim, requires_grad=True) for _ in range(3))

    def saved_shapes(attention):
        shapes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
            attention(query, key, value).sum().backward()
        return [shape for shape in shapes if shape[-2:] == (tokens, tokens)]

    assert len(saved_shapes(_materialised_bisoftmax)) >= 3
    assert saved_shapes(bisoftmax) == []


def seeded_loss_and_gradients(model):
    """A function giving the model's float64 loss and every parameter's gradient on one seeded batch of 3 images."""
    pixels = torch.randn(3, model.config.num_channels, model.config.image_size, model.config.image_size,
                         dtype=torch.float64)
    labels = torch.tensor([0, 1, 2])

    def loss_and_gradients():
        model.zero_grad()
        loss = model(pixel_values=pixels, labels=labels).loss
        loss.backward()
        return loss.detach(), {name: parameter.grad.clone() for name, parameter in model.named_parameters()
                               if parameter.grad is not None}

    return loss_and_gradients


@pytest.mark.parametrize("options", [{}, {"step_head_per_layer": True, "step_condition": "current"}],
                         ids=["shared-network", "per-layer-heads"])
def test_step_sizes_recomputed_in_backward_give_the_gradients_of_the_plain_products(monkeypatch, options):
    """Training recomputes alpha and gamma in backward, inside each half-step (`LearnedStepSizes`): the loss and
    every parameter's gradient equal those of the plain products x - alpha u and x + gamma u with the step-size
    head run whole and kept, in float64, with the heads' output layers perturbed off zero so that they act."""
    torch.manual_seed(0)
    model = model_from_preset("hyperset-digits-tiny", **options).double().train()
    heads = [module for module in model.modules()
             if isinstance(module, HyperSETStepSizes) and hasattr(module, "out_proj")]
    assert len(heads) == (model.config.num_hidden_layers if options else 1)
    with torch.no_grad():
        for head in heads:
            head.out_proj.weight.normal_(std=0.1)
            head.out_proj.bias.normal_(std=0.1)
    loss_and_gradients = seeded_loss_and_gradients(model)

    recomputed = loss_and_gradients()

    def plain_step(steps, x, update, half):
        alpha, gamma = steps.head(steps.time_embedding, steps.condition)
        return x - alpha * update if half == 0 else x + gamma * update

    monkeypatch.setattr(LearnedStepSizes, "step", plain_step)
    plain = loss_and_gradients()
    torch.testing.assert_close(recomputed[0], plain[0], rtol=1e-13, atol=0)
    assert recomputed[1].keys() == plain[1].keys()
    assert any("out_proj" in name for name in plain[1])
    for name, gradient in plain[1].items():
        torch.testing.assert_close(recomputed[1][name], gradient, rtol=1e-12, atol=1e-14, msg=name)


@pytest.mark.parametrize("use_reentrant", [True, False])
@pytest.mark.parametrize("update_mode", ["gd", "adam"])
def test_gradient_checkpointing_gives_the_gradients_of_the_plain_model(use_reentrant, update_mode):
    """Layer checkpointing (transformers' `activation_checkpointing_enable`, reentrant or not) changes no gradient: an
    iteration's nested inputs (the step sizes' time embedding and condition, shared by every iteration; depth-wise
    LoRA; the update rule's moments, carried from iteration to iteration) keep their gradients, in float64, with
    the step-size head perturbed off zero so that it acts."""
    torch.manual_seed(0)
    model = model_from_preset("hyperset-digits-tiny", update_mode=update_mode, lora_rank=2).double().train()
    with torch.no_grad():
        model.model.step_sizes.out_proj.weight.normal_(std=0.1)
        model.model.step_sizes.out_proj.bias.normal_(std=0.1)
    loss_and_gradients = seeded_loss_and_gradients(model)

    plain = loss_and_gradients()
    model.activation_checkpointing_enable({"use_reentrant": use_reentrant})
    checkpointed = loss_and_gradients()
    torch.testing.assert_close(checkpointed[0], plain[0], rtol=1e-13, atol=0)
    assert checkpointed[1].keys() == plain[1].keys()
    assert any("time_mlp" in name for name in plain[1]) and any("depthwise_lora" in name for name in plain[1])
    for name, gradient in plain[1].items():
        torch.testing.assert_close(checkpointed[1][name], gradient, rtol=1e-12, atol=1e-14, msg=name)


@pytest.mark.parametrize("intermediate", [WIDTH, 4 * WIDTH])
def test_each_half_step_lowers_its_energy_and_the_opposite_sign_raises_it(intermediate):
    torch.manual_seed(0)
    config = HyperSETConfig(hidden_size=WIDTH, num_attention_heads=HEADS, intermediate_size=intermediate)
    layer = HyperSETLayer(config).double()
    for linear in (layer.qkv_proj, layer.ff_proj):
        torch.nn.init.normal_(linear.weight, std=1 / math.sqrt(WIDTH))
    x = torch.randn(64, 9, WIDTH, dtype=torch.float64)
    w, d = layer.weights()
    step = torch.tensor(1e-3, dtype=torch.float64)
    e_attn, _ = unit_gain_energies(x, layer, HEADS)
    assert (unit_gain_energies(x - step * layer.attention_direction(x, w), layer, HEADS)[0] < e_attn).all()
    assert (unit_gain_energies(x + step * layer.attention_direction(x, w), layer, HEADS)[0] > e_attn).all()
    _, e_ff = unit_gain_energies(x, layer, HEADS)
    assert (unit_gain_energies(x + step * layer.feedforward_direction(x, d), layer, HEADS)[1] < e_ff).all()
    assert (unit_gain_energies(x - step * layer.feedforward_direction(x, d), layer, HEADS)[1] > e_ff).all()


def test_feedforward_step_is_the_closed_form_update():
    """x + gamma D ReLU(RMSNorm(D^T x)) with the learned gain (eq. 11), per token and channel gamma."""
    torch.manual_seed(1)
    layer = HyperSETLayer(HyperSETConfig(hidden_size=WIDTH, num_attention_heads=HEADS, intermediate_size=48)).double()
    with torch.no_grad():
        layer.ff_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 5, WIDTH, dtype=torch.float64)
    gamma = torch.rand(2, 5, WIDTH, dtype=torch.float64)
    d = layer.ff_proj.weight  # (M, d): rows d_m
    h = x @ d.T
    h = h / torch.sqrt(h.square().mean(-1, keepdim=True) + torch.finfo(torch.float64).eps) * layer.ff_norm.weight
    torch.testing.assert_close(x + gamma * layer.feedforward_direction(x, d), x + gamma * (torch.relu(h) @ d))


@pytest.mark.parametrize("iterations", [1, 3, 12])
def test_the_model_starts_as_the_identity_for_every_iteration_count(iterations):
    config = HyperSETConfig(hidden_size=WIDTH, num_attention_heads=HEADS, intermediate_size=64, num_iterations=4,
                            time_embed_dim=16, input_type="tokens", vocab_size=10, use_cls_token=False,
                            position_embedding_type="learned", num_labels=9)
    model = HyperSETModel(config).eval()
    ids = torch.randint(0, 10, (2, 81))
    with torch.no_grad():
        out = model(input_ids=ids, refinement_steps=iterations, output_energies=True)
        embedded = model.embeddings(input_ids=ids)
    assert torch.equal(out.last_hidden_state, embedded)
    assert out.energies.stack("step_size").abs().max() == 0
    assert out.energies.stack("energy").shape == (1, iterations, 2)


def test_output_zero_init_keeps_the_iteration_path_alive():
    """step_zero_init="output": only the last Linear starts at zero, so t reaches alpha once it trains; "all"
    leaves the t-path's Linears at zero (their gradient is then exactly zero)."""
    for mode, alive in (("all", False), ("output", True)):
        config = HyperSETConfig(hidden_size=WIDTH, num_attention_heads=HEADS, intermediate_size=64,
                                num_iterations=3, time_embed_dim=16, input_type="tokens", vocab_size=10,
                                use_cls_token=False, position_embedding_type="learned", num_labels=9,
                                step_zero_init=mode)
        model = HyperSETForTokenClassification(config)
        ids = torch.randint(0, 10, (2, 81))
        model(input_ids=ids, labels=torch.randint(0, 9, (2, 81))).loss.backward()
        first = model.model.step_sizes.time_mlp[0]
        assert (first.weight.abs().sum() > 0) == alive
        assert (model.model.step_sizes.out_proj.weight.grad.abs().sum() > 0)


HYPERSET_PRESETS = [name for name in preset_names() if preset_card(name).get("paper") == "hyperset"
                    and "paper_parameters" in preset_card(name)]
# Exact parameter counts of the authors' public code (huyunzhe/hyper-set) at these shapes, independent of this
# implementation.
SPEC_COUNTS = {"hyperset-sudoku": 5_195_584, "hyperset-mim": 3_937_856, "hyperset-mim-8d": 8_072_000,
               "hyperset-small-scaleup-in1k": 2_395_968, "hyperset-d640-in1k": 3_403_968,
               "hyperset-small-in1k": 1_551_808, "hyperset-small-in1k-fixed-steps": 909_760,
               "hyperset-in100": 1_934_268, "hyperset-in100-lora-r4": 2_032_572, "hyperset-in100-lora-r8": 2_130_876,
               "hyperset-in100-lora-r16": 2_327_484, "hyperset-in100-lora-r32": 2_720_700,
               "hyperset-l12-d512-in1k": 8_170_880, "hyperset-l12-d768-in1k": 17_562_496,
               "hyperset-small-scaleup-cifar100": 1_657_220}


LOOPED_TRANSFORMER_BASELINES = {name: preset_card(name)["baseline"] for name in preset_names()
                                if preset_card(name).get("paper") == "hyperset"
                                and preset_card(name).get("baseline", "").startswith("hyperset-")}


@pytest.mark.parametrize("name", sorted(LOOPED_TRANSFORMER_BASELINES))
def test_the_looped_transformer_baselines_match_hyperset_in_parameters_and_iterations(name):
    """§5's baseline: the same iteration count and input, a Transformer layer, within 1% of the parameters."""
    with torch.device("meta"):
        models = [model_from_preset(preset) for preset in (name, LOOPED_TRANSFORMER_BASELINES[name])]
    hyperset, transformer = (sum(p.numel() for p in model.parameters()) for model in models)
    assert abs(transformer / hyperset - 1) < 0.01, (hyperset, transformer)
    configs = [model.config for model in models]
    assert configs[1].layer_type == "transformer" and configs[0].layer_type != "transformer"
    assert configs[0].num_iterations == configs[1].num_iterations and type(models[0]) is type(models[1])


@pytest.mark.parametrize("name", HYPERSET_PRESETS)
def test_paper_presets_have_the_papers_parameter_count(name):
    with torch.device("meta"):
        model = model_from_preset(name)
    count = sum(p.numel() for p in model.parameters())
    assert abs(count / preset_card(name)["paper_parameters"] - 1) <= 0.005, count
    if name in SPEC_COUNTS:
        assert count == SPEC_COUNTS[name]


def test_alternative_attentions_follow_their_energies_in_float64():
    """App. G.1: sigmoid attention is half the gradient of sqrt(p) sum sigma(z.z / sqrt(p)) (the symmetric score
    counts each pair twice); linear attention is the gradient of ||phi(z)^T phi(z)||_F^2 / (4 sqrt(p))."""
    z = torch.randn(2, HEADS, 7, WIDTH // HEADS, dtype=torch.float64, requires_grad=True)
    root = math.sqrt(z.shape[-1])
    (sigmoid_gradient,) = torch.autograd.grad(root * torch.sigmoid(z @ z.transpose(-1, -2) / root).sum(), z)
    torch.testing.assert_close(sigmoid_attention(z, z, z), sigmoid_gradient / 2)
    features = torch.sigmoid(z)
    (linear_gradient,) = torch.autograd.grad((features.transpose(-1, -2) @ features).square().sum() / (4 * root), z)
    torch.testing.assert_close(linear_attention(z, z, z), linear_gradient)


@pytest.mark.parametrize("attention_type,ff_type", [("sigmoid", "standard"), ("linear", "softmax"),
                                                    ("bisoftmax", "gated")])
def test_alternative_energies_build_models_that_train(attention_type, ff_type):
    config = HyperSETConfig(hidden_size=WIDTH, num_attention_heads=HEADS, intermediate_size=64, num_iterations=2,
                            time_embed_dim=16, input_type="tokens", vocab_size=10, use_cls_token=False,
                            position_embedding_type="learned", num_labels=9, max_position_embeddings=16,
                            attention_type=attention_type, ff_type=ff_type, step_zero_init="output")
    torch.manual_seed(0)
    model = HyperSETForTokenClassification(config)
    ids, labels = torch.randint(0, 10, (4, 16)), torch.randint(0, 9, (4, 16))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_transformer_baseline_iterates_a_pre_norm_layer_like_torchs_multi_head_attention():
    """layer_type="transformer" (hyperset.txt §5's baseline): R' iterations of x + MHA(RMSNorm x), then
    x + D_down ReLU(D_up RMSNorm x), against torch's own `nn.MultiheadAttention` (no bias) in float64, gradients
    too; no step-size network is built, and the config refuses the Hyper-SET-only options."""
    from energyzoo.modeling.configuration_hyperset import HyperSETConfig
    from energyzoo.modeling.modeling_hyperset import HyperSETModel

    config = HyperSETConfig(hidden_size=16, num_attention_heads=4, intermediate_size=64, num_iterations=3,
                            layer_type="transformer", step_size_mode="fixed", input_type="tokens", vocab_size=7,
                            max_position_embeddings=6, use_cls_token=False, position_embedding_type="learned")
    torch.manual_seed(0)
    model = HyperSETModel(config).double().eval()
    assert model.step_sizes is None and sum(p.numel() for p in model.layers[0].parameters()) == 4 * 256 + 2 * 1024 + 32
    layer = model.layers[0]
    reference = torch.nn.MultiheadAttention(16, 4, bias=False, batch_first=True).double()
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]))
        reference.out_proj.weight.copy_(layer.o_proj.weight)
    ids = torch.randint(0, 7, (2, 6))
    for iterations in (1, 3, 5):
        outputs = model(input_ids=ids, refinement_steps=iterations, output_hidden_states=True)
        ours, state = outputs.last_hidden_state, outputs.hidden_states[0]  # the embedding, x(0)
        for _ in range(iterations):
            normed = torch.nn.functional.rms_norm(state, (16,), layer.attention_norm.weight)
            state = state + reference(normed, normed, normed, need_weights=False)[0]
            normed = torch.nn.functional.rms_norm(state, (16,), layer.mlp_norm.weight)
            state = state + torch.relu(normed @ layer.up_proj.weight.T) @ layer.down_proj.weight.T
        torch.testing.assert_close(ours, state, rtol=1e-10, atol=1e-10)
        expected = torch.autograd.grad(state.sum(), layer.up_proj.weight, retain_graph=True)[0]
        torch.testing.assert_close(torch.autograd.grad(ours.sum(), layer.up_proj.weight)[0], expected)
    with pytest.raises(ValueError, match="step_size_mode must be 'fixed' with layer_type='transformer'"):
        HyperSETConfig(layer_type="transformer")
    with pytest.raises(ValueError, match="lora_rank must be 0 with layer_type='transformer'"):
        HyperSETConfig(layer_type="transformer", step_size_mode="fixed", lora_rank=4)
