"""Hyper-SET models (hyperset.txt): the recurrent encoder and its image-classification, masked-image-modelling
(MaskGIT) and token-classification (Sudoku) heads.

`HyperSETModel` embeds the input (image patches or token ids, §5), then runs each of its L layers R times
(`num_iterations`; ``refinement_steps=R'`` at call time) on the shared refinement loop, with step sizes from one
step-size network shared by the layers (t restarts at 1 for each layer; x(0) is always the embedding). With
``output_energies=True`` each layer records, per iteration (after the update): ``energy`` = E_ATTN + E_FF,
``attention_energy`` and ``feedforward_energy`` (eq. 3-5, unit-gain normalisation as in Fig. 5), ``step_size``
and ``feedforward_step_size`` (mean alpha and gamma), ``residual`` (mean ||x_{t+1} - x_t|| over tokens),
``effective_rank`` and ``average_angle`` of the normalised per-head projections (eq. 17-18, mean over heads),
and ``iterations`` (R'). Quantities are per sample, stacked over the iterations.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_hyperset import HyperSETConfig
from .errors import UserError
from .hyperset_layer import (
    DepthwiseLoRA,
    FixedStepSizes,
    HyperSETLayer,
    HyperSETStepSizes,
    IteratedLayer,
    LearnedStepSizes,
    StepSizes,
    TransformerBaselineLayer,
)
from .inputs import (
    check_classifier_labels,
    check_kind,
    check_labels,
    check_pixel_values,
    check_token_inputs,
    check_unpadded,
    refuse_input,
)
from .outputs import (
    BaseModelOutputWithPoolingAndEnergies,
    ImageClassifierOutputAndEnergies,
    MaskedLMOutputWithEnergies,
    TokenClassifierOutputWithEnergies,
    record_energies,
    recording_energies,
    records_energies,
)
from .positions import sinusoidal_positions
from .refinement import refine, refinement_steps, takes_refinement_steps


def sincos2d_positions(count: int, width: int, device) -> torch.Tensor:
    """The fixed 2-D sin-cos table of MAE over a square grid (the MIM code's): half the channels encode the column,
    half the row, each as [sin, cos] of position * 1e4^(-k / (width / 4)); float64 (cast by the caller)."""
    side = math.isqrt(count)
    frequency = 1e4 ** -(torch.arange(width // 4, dtype=torch.float64, device=device) / (width / 4))
    rows, columns = torch.meshgrid(torch.arange(side, device=device), torch.arange(side, device=device),
                                   indexing="ij")

    def encode(coordinate):
        angles = coordinate.reshape(-1, 1).double() * frequency
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    return torch.cat([encode(columns), encode(rows)], dim=-1)


class HyperSETEmbeddings(nn.Module):
    """Patches (flattened in (row, column, channel) order -> LayerNorm -> Linear -> LayerNorm, the IC code) or token
    ids (an Embedding), an optional CLS token in front, positions, and dropout."""

    def __init__(self, config: HyperSETConfig):
        super().__init__()
        self.config = config
        width = config.hidden_size
        if config.input_type == "patches":
            features = config.patch_size**2 * config.num_channels
            self.patch_embeddings = nn.Sequential(
                nn.LayerNorm(features), nn.Linear(features, width), nn.LayerNorm(width)
            )
            self.positions = config.num_patches + int(config.use_cls_token)
        else:
            self.token_embeddings = nn.Embedding(config.vocab_size, width)
            self.positions = config.max_position_embeddings + int(config.use_cls_token)
        self.cls_token = nn.Parameter(torch.empty(1, 1, width)) if config.use_cls_token else None
        if config.position_embedding_type == "learned":
            self.position_embeddings = nn.Parameter(torch.empty(1, self.positions, width))
        self.dropout = nn.Dropout(config.embedding_dropout)

    def patches(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = pixel_values.shape
        size = self.config.patch_size
        grid = pixel_values.reshape(batch, channels, height // size, size, width // size, size)
        return grid.permute(0, 2, 4, 3, 5, 1).reshape(batch, -1, size * size * channels)

    def forward(self, pixel_values=None, input_ids=None, inputs_embeds=None) -> torch.Tensor:
        config, owner = self.config, "HyperSETModel"
        own = "pixel_values" if config.input_type == "patches" else "input_ids"
        given = [name for name, value in (("pixel_values", pixel_values), ("input_ids", input_ids),
                                          ("inputs_embeds", inputs_embeds)) if value is not None]
        if given not in ([own], ["inputs_embeds"]):
            raise UserError(f"{owner}: this Hyper-SET model (input_type={config.input_type!r}) takes exactly one of "
                             f"{own} or inputs_embeds, got {given or 'none'}")
        if pixel_values is not None:
            check_pixel_values(owner, pixel_values, config.num_channels, config.image_size)
            # float images of any dtype, as ViT; in the patch norm's dtype, which int8 quantizers leave as it is
            pixel_values = pixel_values.to(self.patch_embeddings[0].weight.dtype)
            inputs_embeds = self.patch_embeddings(self.patches(pixel_values))
        else:
            vocab_size = self.token_embeddings.num_embeddings if input_ids is not None else config.vocab_size
            check_token_inputs(owner, input_ids, inputs_embeds, None, vocab_size, config.hidden_size)
            if input_ids is not None:
                cells = self.positions - int(self.cls_token is not None)  # a board or grid: one id per cell
                refuse_input(owner, input_ids.shape[1] == cells, "input_ids", f"(batch, {cells}): one id per cell",
                             f"shape {tuple(input_ids.shape)}")
                inputs_embeds = self.token_embeddings(input_ids)
        if self.cls_token is not None:
            inputs_embeds = torch.cat([self.cls_token.expand(len(inputs_embeds), -1, -1).to(inputs_embeds.dtype),
                                       inputs_embeds], dim=1)
        length = inputs_embeds.shape[1]
        if length > self.positions:
            raise UserError(f"Hyper-SET got {length} positions; this configuration has {self.positions}")
        kind = self.config.position_embedding_type
        if kind == "learned":
            positions = self.position_embeddings[:, :length]
        else:
            indices = torch.arange(self.positions, device=inputs_embeds.device)
            if kind == "sinusoidal":
                table = sinusoidal_positions(indices, inputs_embeds.shape[-1])
            else:  # the grid of patches or cells; a CLS token in front gets zeros (MAE's convention)
                cls = int(self.cls_token is not None)
                table = F.pad(sincos2d_positions(self.positions - cls, inputs_embeds.shape[-1], inputs_embeds.device),
                              (0, 0, cls, 0))
            positions = table[None, :length]
        return self.dropout(inputs_embeds + positions.to(inputs_embeds.dtype))


class HyperSETPreTrainedModel(PreTrainedModel):
    config_class = HyperSETConfig
    config: HyperSETConfig
    base_model_prefix = "model"
    main_input_name = "pixel_values"
    supports_gradient_checkpointing = True
    _no_split_modules = ["HyperSETLayer", "TransformerBaselineLayer"]
    # an iteration's non-tensor arguments (`IteratedLayer.forward`'s ``others``: the step-size head module among
    # them) stay as they are when accelerate's dispatch moves a layer's inputs to its device: moving a module there
    # would move its (offloaded, meta) weights
    _skip_keys_device_placement = ["others"]
    _can_compile_fullgraph = True
    # a state per iteration of each layer, so indices (negative ones too) count layer iterations
    _can_record_outputs = {"hidden_states": OutputRecorder(IteratedLayer, num_hidden_layers_key="num_layer_iterations")}
    _hidden_states_per_step = True

    def _init_weights(self, module):
        """N(0, initializer_range) Linear and Embedding weights, zero biases, unit norm gains (the public Sudoku
        code's initialisation, which the paper does not state; PyTorch's default
        Embedding N(0, 1) did not learn 4x4 Sudoku when tried); CLS
        token N(0, 1) and learned positions N(0, initializer_range); depth-wise LoRA N(0, 0.02) (App. G.2); the
        step-size network's Linears zero-initialised as `step_zero_init` marks them (ReZero, §4.3)."""
        if getattr(module, "starts_at_zero", False):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
            return
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, HyperSETEmbeddings):
            if module.cls_token is not None:
                init.normal_(module.cls_token, std=1.0)
            if hasattr(module, "position_embeddings"):
                init.normal_(module.position_embeddings, std=std)
        elif isinstance(module, DepthwiseLoRA):
            for parameter in module.parameters():
                init.normal_(parameter, std=0.02)


class HyperSETModel(HyperSETPreTrainedModel):
    def __init__(self, config: HyperSETConfig):
        super().__init__(config)
        self.embeddings = HyperSETEmbeddings(config)
        layer = HyperSETLayer if config.layer_type == "hyperset" else TransformerBaselineLayer
        self.layers = nn.ModuleList(layer(config) for _ in range(config.num_hidden_layers))
        learned = config.step_size_mode == "learned"
        self.step_sizes = HyperSETStepSizes(config, head=not config.step_head_per_layer) if learned else None
        self.depthwise_lora = DepthwiseLoRA(config) if config.lora_rank else None
        self.post_init()

    def _input_embedding_name(self) -> str:
        return "token_embeddings" if self.config.input_type == "tokens" else "patch_embeddings"

    def get_input_embeddings(self) -> nn.Module:
        return getattr(self.embeddings, self._input_embedding_name())

    def set_input_embeddings(self, value: nn.Module) -> None:
        setattr(self.embeddings, self._input_embedding_name(), value)

    @records_energies
    @takes_refinement_steps
    @capture_outputs
    def forward(self, pixel_values=None, input_ids=None, inputs_embeds=None, attention_mask=None,
                **kwargs) -> BaseModelOutputWithPoolingAndEnergies:
        """``refinement_steps=R'`` runs every layer R' times (None: ``num_iterations``); ``output_energies=True``
        adds the per-iteration `EnergyTrace` (module docstring); ``output_hidden_states=True`` returns the state
        after every iteration. An ``attention_mask`` must mask nothing: Hyper-SET has no padding mask."""
        check_unpadded(type(self).__name__, attention_mask, "Hyper-SET has no padding mask: every token attends to "
                       "every token, hyperset.txt eq. 9; pass inputs without padding")
        x0 = self.embeddings(pixel_values=pixel_values, input_ids=input_ids, inputs_embeds=inputs_embeds)
        iterations = refinement_steps(self.config.num_iterations)
        records = "detached" if recording_energies() else None
        times = self.step_sizes.time_embeddings(iterations, x0) if self.step_sizes is not None else None
        x = x0
        for layer in self.layers:

            def step(index, state, layer=layer):
                current, moments = state
                lora = self.depthwise_lora(index) if self.depthwise_lora is not None else None
                steps = self.step_sizes_of(times, index, x0, current, layer)
                updated, diagnostics, moments = layer.iteration(current, steps, lora, moments=moments, t=index + 1,
                                                                with_diagnostics=records is not None)
                return (updated, moments), None, diagnostics

            refined = refine(step, (x, ((), ())), iterations, records=records)  # the update rule restarts per layer
            x = refined.state[0]
            if records:
                record_energies({**refined.records, "iterations": refined.iterations})
        pooled = x[:, 0] if self.config.use_cls_token else None
        return BaseModelOutputWithPoolingAndEnergies(last_hidden_state=x, pooler_output=pooled)

    def step_sizes_of(self, times, index: int, x0: torch.Tensor, current: torch.Tensor,
                      layer: nn.Module) -> StepSizes | None:
        """The step sizes of iteration ``index``: the step-size network's (eq. 12; the shared one, or with
        ``step_head_per_layer`` the layer's own head), recomputed in backward when training (`LearnedStepSizes`), or
        the fixed ones (Table 4). None for the Transformer baseline, which takes none."""
        config = self.config
        if not isinstance(layer, HyperSETLayer):
            return None
        if self.step_sizes is None:
            def fixed(value):
                return torch.tensor(value, dtype=current.dtype, device=current.device)

            return FixedStepSizes(fixed(config.fixed_step_size), fixed(config.feedforward_step_size))
        head = layer.step_head if config.step_head_per_layer else self.step_sizes
        return LearnedStepSizes(head, times[index], x0 if config.step_condition == "input" else current)


class HyperSETHead(HyperSETPreTrainedModel):
    """A head on `HyperSETModel`: ``model`` runs the encoder, passing on ``output_energies`` and
    ``refinement_steps``."""

    # a per-batch mean loss: `Trainer` must average the micro-batches of an accumulated step itself
    accepts_loss_kwargs = False
    def encode(self, output_energies, refinement_steps, **inputs):
        return self.model(output_energies=output_energies, refinement_steps=refinement_steps, **inputs)

    def per_cell(self, outputs, labels):
        """Logits of every token (the CLS token left out) through ``norm`` and ``classifier``, and the mean
        cross-entropy over labelled cells (-100 ignored; 0, not NaN, when no cell is labelled)."""
        hidden = outputs.last_hidden_state[:, int(self.config.use_cls_token):]
        logits = self.classifier(self.norm(hidden))
        loss = None
        if labels is not None:
            check_labels(type(self).__name__, labels, logits.shape[-1], logits.shape[:2])
            total = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="sum")
            loss = total / (labels != -100).sum().clamp_min(1)
        return logits, loss


class HyperSETForImageClassification(HyperSETHead):
    """Image classification (§5.2): LayerNorm -> Linear on the CLS token (the mean token without one). The loss is
    transformers' for classifiers: cross-entropy, or by `config.problem_type` / the labels' dtype, regression (MSE)
    or multi-label (BCE)."""

    def __init__(self, config: HyperSETConfig):
        super().__init__(config)
        self.model = HyperSETModel(config)
        self.norm = nn.LayerNorm(config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(self, pixel_values=None, labels=None, output_energies: bool = False,
                refinement_steps: int | None = None, **kwargs) -> ImageClassifierOutputAndEnergies:
        outputs = self.encode(output_energies, refinement_steps, pixel_values=pixel_values, **kwargs)
        pooled = outputs.pooler_output if outputs.pooler_output is not None else outputs.last_hidden_state.mean(1)
        logits = self.classifier(self.norm(pooled))
        check_classifier_labels(type(self).__name__, labels, self.config, len(logits))
        loss = None if labels is None else self.loss_function(labels, logits.float(), self.config)
        return ImageClassifierOutputAndEnergies(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                                energies=outputs.energies)


class HyperSETForTokenClassification(HyperSETHead):
    """Sudoku (§5.1): input_ids digits 0..9 (0 = blank) -> RMSNorm -> Linear(d, num_labels, no bias) per cell;
    labels digit - 1 on blanks and -100 on givens (the loss ignores -100)."""

    main_input_name = "input_ids"

    def __init__(self, config: HyperSETConfig):
        super().__init__(config)
        self.model = HyperSETModel(config)
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, labels=None, output_energies: bool = False,
                refinement_steps: int | None = None, **kwargs) -> TokenClassifierOutputWithEnergies:
        outputs = self.encode(output_energies, refinement_steps, input_ids=input_ids, **kwargs)
        logits, loss = self.per_cell(outputs, labels)
        return TokenClassifierOutputWithEnergies(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                                 energies=outputs.energies)


class HyperSETForMaskedImageModeling(HyperSETHead):
    """MaskGIT masked image modelling (§5.3): input_ids are visual-token codes, with ``mask_token_id`` at masked
    cells (or codes plus ``bool_masked_pos``, which puts the mask token there); RMSNorm -> Linear(d, codebook_size)
    per cell; labels the codes at masked cells and -100 elsewhere. With ``bool_masked_pos`` and no labels, the
    labels are the masked cells' codes in ``input_ids`` (MaskGIT's objective, as `ViTForMaskedImageModeling`
    reconstructs the masked patches)."""

    main_input_name = "input_ids"

    def __init__(self, config: HyperSETConfig):
        super().__init__(config)
        if config.input_type != "tokens" or config.mask_token_id is None:
            raise UserError("HyperSETForMaskedImageModeling needs input_type='tokens' and a mask_token_id (got "
                             f"{config.input_type!r}, {config.mask_token_id!r})")
        self.model = HyperSETModel(config)
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.codebook_size)
        self.post_init()

    @can_return_tuple
    def forward(self, input_ids=None, bool_masked_pos=None, labels=None, output_energies: bool = False,
                refinement_steps: int | None = None, **kwargs) -> MaskedLMOutputWithEnergies:
        if bool_masked_pos is not None:
            check_kind(type(self).__name__, "bool_masked_pos", bool_masked_pos, input_ids.shape)
            masked = bool_masked_pos.bool()
            if labels is None:
                labels = input_ids.masked_fill(~masked, -100)
            input_ids = input_ids.masked_fill(masked, self.config.mask_token_id)
        outputs = self.encode(output_energies, refinement_steps, input_ids=input_ids, **kwargs)
        logits, loss = self.per_cell(outputs, labels)
        return MaskedLMOutputWithEnergies(loss=loss, logits=logits, hidden_states=outputs.hidden_states,
                                          energies=outputs.energies)

    @torch.no_grad()
    def generate_codes(self, input_ids: torch.Tensor, steps: int = 24, temperature: float = 1.0,
                       generator: torch.Generator | None = None, refinement_steps: int | None = None) -> torch.Tensor:
        """MaskGIT iterative decoding (Chang et al. 2022; hyperset.txt §5.3, D.4): fill every ``mask_token_id`` cell
        of ``input_ids`` in ``steps`` rounds. Each round samples a code for every masked cell from
        softmax(logits / temperature) and keeps the most confident samples (confidence = the sampled code's
        probability, no Gumbel noise: the paper's r_temp = 0); how many cells each round keeps follows the arccos
        schedule, arccos(r) / (pi / 2) at r = 1 .. 0, normalised to the cells masked in each sample. Cells given
        in ``input_ids`` never change. Returns the completed codes."""
        if steps < 1 or not temperature > 0:
            raise UserError(f"generate_codes needs steps >= 1 and temperature > 0, got {steps}, {temperature}")
        codes = input_ids.clone()
        masked = codes == self.config.mask_token_id
        schedule = torch.arccos(torch.linspace(1.0, 0.0, steps)) / (math.pi / 2)
        revealed_by = torch.cumsum(schedule / schedule.sum(), 0)  # fraction of the masked cells known after a round
        initially = masked.sum(-1, keepdim=True)
        for round_index in range(steps):
            logits = self(input_ids=codes, refinement_steps=refinement_steps).logits.float() / temperature
            probabilities = logits.softmax(-1)
            sampled = torch.multinomial(probabilities.flatten(0, 1), 1, generator=generator).view(codes.shape)
            confidence = probabilities.gather(-1, sampled[..., None]).squeeze(-1).masked_fill(~masked, -1.0)
            target = (revealed_by[round_index] * initially).round().long() if round_index < steps - 1 else initially
            reveal_count = target - (initially - masked.sum(-1, keepdim=True))
            rank = confidence.argsort(-1, descending=True).argsort(-1)
            reveal = masked & (rank < reveal_count)
            codes = torch.where(reveal, sampled, codes)
            masked &= ~reveal
        return codes
