"""The Thermodynamic Equilibrium Layer (tel.txt §2, Algorithm 1).

TEL replaces "linear map + activation" by K gradient steps on a Gibbs free energy (TEL eq. 2-5)

    G(y; x, T) = 1/2 ||y - Wx||^2 - T S(y),      grad_y S = phi  (the activation is the entropy force),

started at the anchor y0 = Wx (eq. 6), with a temperature T = exp(clip(tau)) (eq. 7) whose log tau follows
a dual update driven by an entropy estimate of the activations during training (eq. 9):

    y_{i+1} = y_i - eta_i [(y_i - Wx) - T_i phi(y_i)]                (eq. 8, Algorithm 1 lines 6-9)
    tau_{i+1} = clip(tau_i + alpha g_beta(s_hat(phi(y_i))))          (eq. 9, Algorithm 1 lines 10-12)

The fixed point of eq. 8 is y = Wx + T phi(y) (the "Wx - T phi" of Prop. C.4 is a sign slip).

`ThermodynamicRefinement` is the K-step part: it takes the anchor output Wx, so a model swaps it into the
activation slot right after its linear map (GPT-2 `mlp.act`, ViT `mlp.activation_fn`, ResNet conv+norm's
`activation`) and its checkpoints keep their weight names. `ThermodynamicEquilibriumLayer` wraps an anchor
module (nn.Linear, Conv1D, nn.Conv2d, any module computing Wx) for standalone use.

Choices where the paper is silent or contradicts itself (all in configuration_tel.py's `TELSettings`): eta_i and T
initialised at 0.5; the entropy estimate is clipped to |s| <= 10 (the S_max of Prop. C.6); the EMA of eq. 35 runs
over the refinement steps of one forward pass; the entropy estimator reads detached statistics (D.3: no feedback
into y), so only the MLP estimator has trainable weights. Pooling (``tel_entropy_pooling``): "batch" is D.4's
(statistics over every axis but the channel axis, so in training mode T is a batch statistic, like BatchNorm's);
"token" takes them over the channels of each position alone, so no position's temperature depends on another
position or sequence - what a causal LM needs (TEL-GPT2's default). At inference tau is frozen (Algorithm 1 line 14)
and the layer acts on each position alone with either pooling. Early exit (App. E) is per position. The temperature,
tau and the dual update are kept in fp32 (at least) whatever the model's dtype: a bf16 tau cannot resolve dual steps
of alpha ~ 1e-2.

Analytic estimators share one scale, eq. 35's: s = 1/2 log sigma^2 for Gaussian data, i.e. each returns its
closed-form differential entropy minus that of a unit Gaussian, 1/2 log(2 pi e) (D.4: they "only rescale the
input to equation 9"). On N(0, sigma^2) data they then read log sigma + c with c = 0 (gaussian,
robust_gaussian), 1 + log(2 sqrt(2 / pi)) - 1/2 log(2 pi e) = +0.048 (laplace, a misfit constant) and
H(t_nu with variance 1) - 1/2 log(2 pi e) (student_t: -0.047 at nu = 5), so switching the estimator never
flips the sign of the temperature drift unless sigma is within ~5% of 1. Default "gaussian": G.2 (eq. 35)
says so "unless otherwise noted"; D.4 calls robust_gaussian its default analytic choice (configurable).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_tel import TELSettings
from .errors import UserError
from .numerics import widened, work_dtype
from .outputs import record_energies, recording_energies
from .refinement import EarlyExit, refine, refinement_steps

UNIT_GAUSSIAN_ENTROPY = 0.5 * math.log(2 * math.pi * math.e)
MAD_TO_STD = 1.4826  # kappa of the robust Gaussian estimator (D.4): sigma = kappa * MAD for Gaussian data
VARIANCE_EPS = 1e-6
FP32_PARAMETERS = ("tel_log_step_sizes", "tel_log_temperature")  # kept in fp32 in half-precision models


class EntropyForce(nn.Module):
    """phi = grad_y S (TEL eq. 4) and, where it has a closed form, the entropy S itself (per element)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        if kind == "prelu":
            self.tel_slope = nn.Parameter(torch.empty(1))  # 1-D: FSDP2 shards no 0-d parameter
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.kind == "prelu":
            self.tel_slope.fill_(0.25)  # a tensor method: see ThermodynamicRefinement.reset_parameters

    def _slope(self) -> torch.Tensor:
        return self.tel_slope[0].clamp(0.0, 1.0)  # keeps 0 <= phi' <= 1 (Assumption A0)

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        if self.kind == "silu":
            return F.silu(y)
        if self.kind == "gelu":
            return F.gelu(y)
        if self.kind == "relu":
            return F.relu(y)
        if self.kind == "tanh":
            return torch.tanh(y)
        return torch.where(y >= 0, y, self._slope() * y)

    def entropy(self, y: torch.Tensor) -> torch.Tensor:
        """S(y) elementwise, up to a constant (D.2); silu has none in closed form."""
        if self.kind == "relu":
            return 0.5 * F.relu(y).square()
        if self.kind == "tanh":
            return y.abs() + F.softplus(-2 * y.abs()) - math.log(2.0)  # log cosh, overflow-free
        if self.kind == "gelu":
            cdf = 0.5 * (1 + torch.erf(y / math.sqrt(2.0)))
            pdf = torch.exp(-0.5 * y.square()) / math.sqrt(2 * math.pi)
            return 0.5 * ((y.square() - 1) * cdf + y * pdf)
        if self.kind == "prelu":
            return 0.5 * y.square() * torch.where(y >= 0, torch.ones_like(y), self._slope())
        raise UserError(f"the entropy of tel_activation={self.kind!r} has no closed form; use the gradient exit rule")


def _digamma(x: float) -> float:
    """psi(x) for x > 0: recurrence up to x >= 6, then the asymptotic series (error < 1e-10). Plain Python, so
    that models build on the meta device."""
    shift = 0.0
    while x < 6:
        shift -= 1 / x
        x += 1
    inverse_square = 1 / (x * x)
    series = inverse_square * (1 / 12 - inverse_square * (1 / 120 - inverse_square / 252))
    return shift + math.log(x) - 0.5 / x - series


def _student_t_entropy_offset(dof: float) -> float:
    """Entropy of a unit-scale Student-t with `dof` degrees of freedom."""
    log_beta = math.lgamma(dof / 2) + math.lgamma(0.5) - math.lgamma((dof + 1) / 2)
    return (dof + 1) / 2 * (_digamma((dof + 1) / 2) - _digamma(dof / 2)) + 0.5 * math.log(dof) + log_beta


class EntropyEstimator(nn.Module):
    """s_hat(z) of TEL eq. 9 / eq. 35 from statistics of the entropy force z = phi(y), detached (D.3), on
    eq. 35's Gaussian-equivalent scale (module docstring). ``pooling`` "batch" pools every axis but the channel
    axis and returns one estimate per channel, (channels,) (D.4); "token" pools the channels of each position
    and returns z's shape with the channel axis reduced to 1."""

    def __init__(self, settings: TELSettings):
        super().__init__()
        self.kind = settings.tel_estimator
        self.pooling = settings.tel_entropy_pooling
        dof = settings.tel_student_t_dof
        self.student_t_offset = _student_t_entropy_offset(dof) - UNIT_GAUSSIAN_ENTROPY
        self.student_t_scale = (dof - 2) / dof
        if self.kind == "mlp":
            hidden = settings.tel_estimator_hidden
            self.tel_estimator_in = nn.Linear(3, hidden)
            self.tel_estimator_out = nn.Linear(hidden, 1)
            self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.kind == "mlp":
            for linear in (self.tel_estimator_in, self.tel_estimator_out):
                linear.weight.normal_(std=1.0 / math.sqrt(linear.in_features))  # tensor methods: see
                linear.bias.zero_()  # ThermodynamicRefinement.reset_parameters

    def forward(self, z: torch.Tensor, channel_dim: int) -> torch.Tensor:
        z = z.detach().movedim(channel_dim, -1)
        z = z.to(work_dtype(z.dtype))
        if self.pooling == "batch":
            return self._estimate(z.reshape(-1, z.shape[-1]), dim=0)
        return self._estimate(z, dim=-1, keepdim=True).movedim(-1, channel_dim)

    def _estimate(self, samples: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
        """The estimate from the samples along ``dim``."""
        if self.kind in ("robust_gaussian", "laplace"):
            median = samples.median(dim=dim, keepdim=True).values
            deviation = (samples - median).abs()
            if self.kind == "laplace":  # entropy 1 + log(2b) of a Laplace of scale b = mean |z - median|
                scale = deviation.mean(dim=dim, keepdim=keepdim)
                return 1 + torch.log(2 * scale + VARIANCE_EPS) - UNIT_GAUSSIAN_ENTROPY
            sigma = MAD_TO_STD * deviation.median(dim=dim, keepdim=keepdim).values
            return 0.5 * torch.log(sigma.square() + VARIANCE_EPS)
        variance, mean = torch.var_mean(samples, dim=dim, correction=0, keepdim=keepdim)
        log_variance = torch.log(variance + VARIANCE_EPS)
        if self.kind == "gaussian":
            return 0.5 * log_variance
        if self.kind == "student_t":
            return 0.5 * torch.log(variance * self.student_t_scale + VARIANCE_EPS) + self.student_t_offset
        centered = samples - (mean if keepdim else mean.unsqueeze(dim))
        fourth = centered.pow(4).mean(dim=dim, keepdim=keepdim)
        kurtosis = (fourth / (variance.square() + VARIANCE_EPS)).clamp(max=100.0)
        moments = torch.stack([mean, 0.5 * log_variance, torch.log1p(kurtosis)], dim=-1)
        weight = self.tel_estimator_in.weight
        features = torch.tanh(F.linear(moments.to(weight.dtype), weight, self.tel_estimator_in.bias))
        return self.tel_estimator_out(features).squeeze(-1).to(samples.dtype)


class ThermodynamicRefinement(nn.Module):
    """TEL Algorithm 1 on a given anchor output Wx: K steps of eq. 8 with the temperature of eq. 7 and the
    dual update of eq. 9 (training, or `tel_adapt_at_inference`), optional early exit at inference (App. E),
    run by the shared loop `refinement.refine`.

    Args:
        width: n_out, the number of output channels.
        channel_dim: the channel axis of Wx (-1 for Linear/Conv1D outputs, 1 for Conv2d outputs).
        settings: a `TELSettings` (or a TEL config, which has the same fields).

    Parameters: ``tel_log_step_sizes`` (K learned log eta_i, eq. 30), ``tel_log_temperature`` (tau^(0),
    scalar or per channel), plus the PReLU slope or MLP estimator when chosen.

    K is ``tel_steps`` unless a forward sets ``refinement_steps``; steps beyond the K learned step sizes reuse
    the last one (which the design rule keeps non-expansive). While a forward records energies
    (``output_energies=True``), each call adds its per-step diagnostics (tel.txt §3.4, App. H.7) to the trace:
    ``temperature`` T_i, ``step_size`` eta_i, ``residual`` ||g_G||, ``enthalpy_entropy_ratio`` rho_i,
    ``gradient_alignment`` kappa_i, where S has a closed form ``energy`` G and ``free_energy_change`` Delta G,
    and ``iterations`` K_eff.
    """

    def __init__(self, width: int, channel_dim: int, settings: TELSettings):
        super().__init__()
        self.width = width
        self.channel_dim = channel_dim
        self.settings = settings.tel_settings()
        s = self.settings
        self.log_temperature_bounds = (math.log(s.tel_temperature_min), math.log(s.tel_resolved_temperature_max))
        self.step_size_bounds = (s.tel_step_size_min, s.tel_step_size_max)
        self.ema_decay = 0.0 if s.tel_entropy_ema_half_life is None else 0.5 ** (1.0 / s.tel_entropy_ema_half_life)
        self.entropy_force = EntropyForce(s.tel_activation)
        self.entropy_estimator = EntropyEstimator(s)
        self.tel_log_step_sizes = nn.Parameter(torch.empty(s.tel_steps, dtype=torch.float32))
        self.tel_log_temperature = nn.Parameter(
            torch.empty(width if s.tel_temperature == "channel" else 1, dtype=torch.float32)  # 1-D for FSDP2
        )
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The layer's initial values (eta_i^(0), tau^(0), the force's and the estimator's), set when it is built, with
        tensor methods rather than `nn.init`: transformers builds a model for DeepSpeed ZeRO-3 with `nn.init` switched
        off and initialises it afterwards through the `_init_weights` of the transformers model the layer sits in,
        which does not know it, so `nn.init` left these parameters uninitialised memory
        (tests/test_sharded_training.py's ZeRO-3 initialisation check)."""
        self.tel_log_step_sizes.fill_(math.log(self.settings.tel_initial_step_size))
        self.tel_log_temperature.fill_(math.log(self.settings.tel_initial_temperature))
        self.entropy_force.reset_parameters()
        self.entropy_estimator.reset_parameters()

    def _apply(self, fn, recurse=True):
        """Casting the module to half precision leaves the log step sizes and log-temperature in fp32 (device
        moves still apply): a bf16 tau could not resolve the dual update's steps."""
        kept = {name: getattr(self, name).data for name in FP32_PARAMETERS}
        super()._apply(fn, recurse)
        for name, original in kept.items():
            parameter = getattr(self, name)
            half = (torch.float16, torch.bfloat16)
            if parameter.dtype in half and original.dtype not in half:
                parameter.data = original.to(parameter.device)
        return self

    def extra_repr(self) -> str:
        s = self.settings
        return (f"width={self.width}, steps={s.tel_steps}, phi={s.tel_activation}, temperature={s.tel_temperature}, "
                f"estimator={s.tel_estimator}")

    def step_sizes(self) -> torch.Tensor:
        """eta_i = exp(learned), clipped to [eta_min, min(1, 2 / (1 + T_max L_phi))] (eq. 30, 31, 13), in fp32
        (or wider)."""
        return widened(self.tel_log_step_sizes).exp().clamp(*self.step_size_bounds)

    def _per_channel(self, value: torch.Tensor, ndim: int) -> torch.Tensor:
        """Broadcast a scalar or per-channel (channels,) value against a tensor of `ndim` dims."""
        if value.dim() == 0 or self.channel_dim in (-1, ndim - 1):
            return value
        return value.view(-1, *([1] * (ndim - 1 - self.channel_dim % ndim)))

    def _channel_norm(self, value: torch.Tensor) -> torch.Tensor:
        wide = work_dtype(value.dtype)
        return torch.linalg.vector_norm(value, dim=self.channel_dim, dtype=wide)

    def free_energy(self, y: torch.Tensor, anchor: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
        """G(y; x, T) = 1/2 ||y - Wx||^2 - T S(y) per position (TEL eq. 2-3), where S has a closed form;
        ``temperature`` broadcasts against y."""
        wide = work_dtype(y.dtype)
        enthalpy = 0.5 * (y - anchor).to(wide).square()
        entropy = self.entropy_force.entropy(y.to(wide))
        return (enthalpy - temperature.to(wide) * entropy).sum(dim=self.channel_dim)

    def step(self, y: torch.Tensor, anchor: torch.Tensor, eta: torch.Tensor, temperature: torch.Tensor,
             force: torch.Tensor | None = None) -> torch.Tensor:
        """One refinement step (TEL eq. 8, Algorithm 1 lines 6-9), written as
        y - eta ((y - Wx) - T phi(y)) = lerp(y, Wx, eta) + eta T phi(y); `force` is phi(y) when already known,
        ``temperature`` broadcasts against y."""
        force = self.entropy_force(y) if force is None else force
        return torch.addcmul(torch.lerp(y, anchor, eta.to(y.dtype)), (eta * temperature).to(y.dtype), force)

    def _dual_update(self, tau: torch.Tensor, force: torch.Tensor, smoothed: torch.Tensor | None):
        """tau <- clip(tau + alpha g_beta(EMA(s_hat(phi(y))))) (TEL eq. 9, Algorithm 1 lines 11-12), in tau's
        fp32. Batch pooling gives one estimate per channel (averaged for a global tau); token pooling one per
        position, which then drives that position's temperature (every channel's, for channel-wise tau)."""
        s = self.settings
        estimate = self.entropy_estimator(force, self.channel_dim).clamp(-s.tel_entropy_clip, s.tel_entropy_clip)
        if s.tel_entropy_pooling == "batch":
            estimate = estimate.mean() if s.tel_temperature == "global" else self._per_channel(estimate, force.dim())
        smoothed = estimate if smoothed is None else self.ema_decay * smoothed + (1 - self.ema_decay) * estimate
        drive = s.tel_entropy_scale * smoothed + s.tel_entropy_shift
        return (tau + s.tel_dual_step * drive.to(tau.dtype)).clamp(*self.log_temperature_bounds), smoothed

    def _diagnostics(self, y, y_next, anchor, temperature, force, with_energy: bool) -> dict[str, torch.Tensor]:
        """Per-position quantities of one step (§3.4, App. H.7): ||g_G||, rho, kappa and G, Delta G."""
        wide = work_dtype(y.dtype)
        enthalpy_gradient = (y - anchor).to(wide)  # g_H, Algorithm 1 line 6
        entropy_term = temperature.to(wide) * force.to(wide)  # T g_S
        enthalpy_norm = self._channel_norm(enthalpy_gradient)
        values = {
            "residual": self._channel_norm(enthalpy_gradient - entropy_term),  # ||g_G||, line 8
            "enthalpy_entropy_ratio": enthalpy_norm / self._channel_norm(entropy_term).clamp_min(1e-12),
            "gradient_alignment": F.cosine_similarity(enthalpy_gradient, entropy_term, dim=self.channel_dim, eps=1e-12),
        }
        if with_energy:  # option B of Algorithm 1 line 17
            values["energy"] = self.free_energy(y, anchor, temperature)
            values["free_energy_change"] = self.free_energy(y_next, anchor, temperature) - values["energy"]
        return values

    def forward(self, anchor: torch.Tensor) -> torch.Tensor:
        s = self.settings
        steps = refinement_steps(s.tel_steps)
        adapt = s.tel_dual_step > 0 and (self.training or s.tel_adapt_at_inference)
        early_exit = EarlyExit(s.tel_exit_tolerance, s.tel_exit_patience, self.channel_dim) \
            if s.tel_early_exit and not self.training else None
        record = recording_energies()
        with_energy = s.tel_activation != "silu" and (record or early_exit is not None and s.tel_exit_rule == "energy")
        exit_rule = "residual" if s.tel_exit_rule == "gradient" else "free_energy_change"
        etas = self.step_sizes()
        tau = widened(self.tel_log_temperature if s.tel_temperature == "channel" else self.tel_log_temperature[0])
        tau = tau.clamp(*self.log_temperature_bounds)  # Algorithm 1 line 2
        tau = self._per_channel(tau, anchor.dim())

        def step(index: int, state: tuple):
            y, tau, smoothed_entropy = state
            eta = etas[min(index, len(etas) - 1)]
            temperature = tau.exp()  # eq. 7 (tau is kept clipped)
            force = self.entropy_force(y)  # g_S, line 7
            y_next = self.step(y, anchor, eta, temperature, force)
            records, residual = {}, None
            if record or early_exit is not None:  # outside autograd: recording must not change the graph
                with torch.no_grad():
                    diagnostics = self._diagnostics(y, y_next, anchor, temperature, force, with_energy)
                residual = diagnostics[exit_rule].abs() if early_exit is not None else None  # lines 16-25
                if record:
                    records = {"temperature": temperature.mean(), "step_size": eta,
                               **{name: value.mean() for name, value in diagnostics.items()}}
            if adapt:
                tau, smoothed_entropy = self._dual_update(tau, force, smoothed_entropy)
            return (y_next, tau, smoothed_entropy), residual, records

        refined = refine(step, (anchor, tau, None), steps, early_exit=early_exit,
                         records="detached" if record else None)
        if record:
            record_energies({**refined.records, "iterations": refined.iterations.float().mean().to(anchor.device)})
        return refined.state[0]


class ThermodynamicEquilibriumLayer(nn.Module):
    """A TEL layer (tel.txt §2.2, eq. 10): Phi(x) = y^(K) of `ThermodynamicRefinement` started at y0 = anchor(x).

    Args:
        anchor: the module computing Wx: nn.Linear, GPT-2's Conv1D, nn.Conv2d (channel axis 1), or any module
            whose output has its channels on `channel_dim`.
        settings: `TELSettings` (defaults: tel.txt's).
        channel_dim: None picks 1 for nn.Conv1d/2d/3d anchors and -1 otherwise.

        >>> layer = ThermodynamicEquilibriumLayer(nn.Linear(8, 32), TELSettings(tel_steps=3))
        >>> layer(torch.randn(4, 8)).shape
        torch.Size([4, 32])
    """

    def __init__(self, anchor: nn.Module, settings: TELSettings | None = None, channel_dim: int | None = None):
        super().__init__()
        if channel_dim is None:
            channel_dim = 1 if isinstance(anchor, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) else -1
        self.anchor = anchor
        self.refinement = ThermodynamicRefinement(_output_width(anchor), channel_dim, settings or TELSettings())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.refinement(self.anchor(x))



def _output_width(anchor: nn.Module) -> int:
    for attribute in ("out_features", "out_channels", "nf"):
        if hasattr(anchor, attribute):
            return getattr(anchor, attribute)
    raise UserError(f"cannot tell the output width of anchor {type(anchor).__name__}; give it `out_features`")
