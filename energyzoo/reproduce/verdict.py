"""The verdict every `energyzoo reproduce` experiment prints: does the paper's claim hold against the paper's own
baseline, over paired seeds, by at least the smallest effect the paper makes worth having?

A claim compares an arm with its baseline on one metric (seed s of each paired: same data order, same initial draw
where the arms share shapes). Its per-seed differences d_s = arm - baseline (arm - target for ``reaches``) are
sign-adjusted so that positive favours the arm, and the claim names its **smallest effect of interest** ``effect``
(in the metric's units, taken from the paper's own numbers: ``effect_source`` says which) and the difference the
paper itself reports, ``paper_effect`` (what the power is computed at). By ``kind``:

- ``better``: the arm beats the baseline by at least ``effect``;
- ``not_worse``: the arm trails the baseline by less than ``effect`` (non-inferiority);
- ``equivalent``: the arm is within ``effect`` of the baseline either way (a "no difference" claim: TOST);
- ``reaches``: the arm reaches the paper's absolute ``target`` (the baseline is run and reported beside it);
- ``wins``: a count claim ("TEL wins 98 of 120 comparisons") whose comparisons cluster in units that share their
  data (TEL's: the widths of one dataset): the values are one per unit, the share of its comparisons the arm won,
  the baseline a coin's 1/2 each; the arm wins more often than a coin by at least ``effect``. The unit is what the
  test counts, since comparisons on one dataset are not independent: its tests, interval and power are the paired
  t's over the units' shares, as for ``better``.

Each claim is two one-sided paired t-tests (`scipy.stats.ttest_1samp` on the differences) at ``ALPHA`` against
the claim's bound: one that supports it (``better``: the lower confidence bound of the mean difference clears
``effect``; ``equivalent``: both one-sided tests of TOST reject) and one that refutes it (``better``: the upper
bound falls short of ``effect``; ``equivalent``: the difference lies beyond the margin on one side, Bonferroni over
the two sides). Only one of the two nulls can be false, so deciding on the smaller p errs at most at its level.
Where every seed gives the same difference the t statistic is infinite and the p is its limit: 0 for the side the
difference lies strictly on, 1 for the other (so identical values are equivalent, as they are).

**Families.** A paper's claims are judged together (`decide` is given one paper's records), apart from other
papers', so a verdict does not depend on how many claims of other papers ran. Each paper declares one ``primary``
claim in its experiment before it runs (the ledger's answer for the paper); the others are secondary and say so.
The primary is tested first, alone, at ``ALPHA``; only where it is decided (its test rejects, whichever way) are
the secondary claims tested, their p Holm-adjusted together (`statsmodels`' ``multipletests``) at ``ALPHA``: serial
gatekeeping, which keeps the chance of any false verdict in the paper at ``ALPHA``. Where the primary decides
nothing, no secondary claim is tested: its row shows its numbers and its own p and reads **untested (primary
undecided)**. (A family with no primary claim is one Holm family.)

- **reproduced** / **not reproduced**: the supporting / refuting test rejects after Holm;
- **inconclusive**: neither does, or fewer than ``MIN_SEEDS`` seeds ran;
- **regime differs**: the run cannot answer. With ``paper_baseline`` set, the baseline's mean must lie within
  ``paper_band`` of it. A ``better`` claim needs its baseline above ``chance`` and below ``ceiling`` by at least
  ``effect``; a gain claim (a difference of two levels, e.g. accuracy at 2R minus at R) needs each level behind the
  gains above the floor by at least the larger gain the run claims (and the effect), and below the ceiling by the
  effect: a model near the floor turns noise into a large relative "gain". A
  ``not_worse`` or ``equivalent`` claim is refused where both arms sit within ``effect`` of chance, or both of the
  ceiling: there "no difference" holds whatever the models are;
- **needs a GPU**: the experiment says its setting cannot reach the paper's regime on 2 CPU cores (a named setting
  can, on a GPU);
- **contradicted at this scale**: the interval lies wholly against the claim beyond its smallest effect of interest
  (``better``, ``not_worse``, ``reaches``, ``wins``: the arm trails by more than ``effect``; ``equivalent``: the
  difference lies beyond the margin), whatever the regime: a "regime differs" or "needs a GPU" row with enough seeds
  is tested for it (one-sided, at its Holm step: it joins its paper's family) and says so when it holds, so that no
  row hides an opposite effect behind the regime; a decided "not reproduced" row whose interval is that far says it too;
- **mechanism inert at this scale**: an ``equivalent`` claim about a mechanism (``mechanism_off``: the per-seed
  values with it switched off, e.g. EqT's refinement at K = 0) is judged only where switching it off moves some seed of
  either arm by at least the margin: two settings of a mechanism that does nothing are equal whatever the paper says;
- **smoke**: a quick setting ran: the numbers are shown, and no verdict is drawn from them.

**The printed interval matches the decision.** A claim of rank r (by p, from 0) among the m tested claims of its
Holm family (the primary is a family of one) is rejected by Holm's step-down at level ``ALPHA / (m - r)`` (when
every claim ranked before it was); its interval is the two-sided paired t interval at confidence 1 - 2 ``ALPHA /
(m - r)``, whose one-sided ends are the bounds that test. Where the step-down stopped at an earlier claim, the row
says so beside the interval.

**Power.** ``power`` is the chance that the supporting test rejects at the family's smallest Holm level
(``ALPHA / m``) with the run's seeds, if the true difference were the paper's (``paper_effect``) and the seeds
spread as this run's did (noncentral t, `scipy.stats.nct`; TOST's by the Bonferroni bound of its two tests);
``seeds_for_power`` is the fewest seeds (at least ``MIN_SEEDS``, at most ``MAX_SEEDS``) that give ``TARGET_POWER``.
An experiment sizes its full setting's seeds from its quick setting's (the pilot's) ``seeds_for_power``; a row
whose power falls short says it is underpowered.
"""

import math
import statistics
from dataclasses import asdict, dataclass, replace

from ..modeling.errors import UserError, needs_extra

ALPHA = 0.05
MIN_SEEDS = 5
TARGET_POWER = 0.8
MAX_SEEDS = 40  # the most seeds a power plan asks for: beyond it, the claim needs a less noisy setting, not seeds
CONTRADICTED = "contradicted at this scale"
INERT = "mechanism inert at this scale"
GATED = "untested (primary undecided)"
UNDECIDED = ("regime differs", "needs a GPU")  # rows that cannot decide the claim (they can still contradict it)
VERDICTS = ("reproduced", "not reproduced", CONTRADICTED, "inconclusive", *UNDECIDED, INERT, GATED)
KINDS = ("better", "not_worse", "equivalent", "reaches", "wins")
COIN = 0.5  # a "wins" claim's baseline: the win rate of a coin


@dataclass(frozen=True)
class Claim:
    """What a paper claims, quoted with its table or figure: ``arm`` is ``kind`` than ``baseline`` on ``metric`` by
    the smallest effect of interest ``effect`` (from ``effect_source``), or reaches ``target``. ``paper_effect``:
    the difference the paper reports (arm minus baseline, positive favouring the arm; for a gain claim the gain),
    the truth the power is computed at (None: no power). ``chance`` and ``ceiling`` are the metric's trivial and
    perfect values (None: unbounded); ``paper_baseline`` (with ``paper_band``) the baseline's level in the paper's
    own experiment, where our run should match it, and ``regime_source`` where that band (or floor) comes from.
    ``primary``: the paper's one primary claim."""

    quote: str
    source: str
    arm: str
    baseline: str
    metric: str
    effect: float
    effect_source: str
    higher_is_better: bool = True
    kind: str = "better"
    chance: float | None = None
    ceiling: float | None = None
    paper_baseline: float | None = None
    paper_band: float | None = None
    target: float | None = None
    paper_effect: float | None = None
    primary: bool = False
    regime_source: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"Claim.kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "reaches") != (self.target is not None):
            raise UserError(f"Claim.target is the value a 'reaches' claim names, and only that (kind {self.kind!r}, "
                             f"target {self.target})")
        if not self.effect >= 0 or (self.kind in ("not_worse", "equivalent") and self.effect == 0):
            raise UserError(f"Claim.effect must be >= 0 (> 0 for a {self.kind!r} claim, its margin), got "
                             f"{self.effect}")
        if (self.paper_baseline is None) != (self.paper_band is None) or (self.paper_band or 0) < 0:
            raise UserError(f"Claim.paper_baseline and Claim.paper_band come together, the band >= 0 (got "
                             f"{self.paper_baseline} and {self.paper_band})")
        if self.paper_effect is not None and not math.isfinite(self.paper_effect):
            raise UserError(f"Claim.paper_effect must be a finite difference or None, got {self.paper_effect}")

    @property
    def role(self) -> str:
        return "primary" if self.primary else "secondary"


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    seeds: int
    arm: tuple[float, float] | None  # mean, std over seeds; None where the claim was not run
    baseline: tuple[float, float] | None
    difference: float | None  # mean of the per-seed differences (to the baseline, or the target), positive: the arm
    interval: tuple[float, float] | None  # its two-sided paired t interval at ``confidence``; None under 2 seeds
    confidence: float | None  # 1 - 2 x the level that decides the claim (its Holm step's)
    p_support: float | None  # one-sided p of the test that supports the claim; None where nothing is tested
    p_refute: float | None
    p: float | None  # the smaller of the two: the claim's p in its paper's Holm family
    p_adjusted: float | None  # Holm-adjusted over the paper's tested claims (`decide`)
    power: float | None  # of the supporting test at the paper's effect (module docstring); None: not computable
    seeds_for_power: int | None  # the fewest seeds for TARGET_POWER (MAX_SEEDS + 1: more than the cap)


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _paired(claim: Claim, arm: list[float], baseline: list[float]) -> tuple[list[float], float]:
    """The sign-adjusted per-seed differences (to the baseline, or the target), and the size below which their
    spread is rounding (1e-12 of the largest value compared)."""
    sign = 1.0 if claim.higher_is_better else -1.0
    references = [claim.target] * len(arm) if claim.kind == "reaches" else baseline
    differences = [sign * (own - reference) for own, reference in zip(arm, references)]
    return differences, 1e-12 * max([1.0, *(abs(value) for value in (*arm, *references))])


def _one_sided(differences: list[float], bound: float, alternative: str, scale: float) -> float:
    """p of the paired t-test that the mean difference is ``alternative`` ("greater" or "less") than ``bound``."""
    sign = 1.0 if alternative == "greater" else -1.0
    if statistics.pstdev(differences) <= scale:  # no spread: the limit of the test (module docstring)
        return 0.0 if sign * (statistics.fmean(differences) - bound) > scale else 1.0
    with needs_extra("reproduce"):
        from scipy import stats
    return float(stats.ttest_1samp(differences, bound, alternative=alternative).pvalue)


def _bounds(claim: Claim) -> list[float]:
    """The bounds the supporting test(s) must clear from below (a second one, TOST's, from above)."""
    if claim.kind == "equivalent":
        return [-claim.effect, claim.effect]
    return [{"better": claim.effect, "not_worse": -claim.effect, "reaches": 0.0, "wins": claim.effect}[claim.kind]]


def _tests(claim: Claim, differences: list[float], scale: float) -> tuple[float, float]:
    """(p supporting, p refuting) the claim from the sign-adjusted differences."""
    if claim.kind == "equivalent":  # TOST: the difference is above -effect and below +effect
        support = max(_one_sided(differences, -claim.effect, "greater", scale),
                      _one_sided(differences, claim.effect, "less", scale))
        refute = min(1.0, 2 * min(_one_sided(differences, claim.effect, "greater", scale),
                                  _one_sided(differences, -claim.effect, "less", scale)))
        return support, refute
    bound = _bounds(claim)[0]
    return _one_sided(differences, bound, "greater", scale), _one_sided(differences, bound, "less", scale)


def _contradicting(claim: Claim, differences: list[float], scale: float) -> float:
    """p of the one-sided test that the difference lies against the claim beyond its smallest effect of interest
    (module docstring, "contradicted at this scale"): TOST's refuting side for an equivalence."""
    if claim.kind == "equivalent":
        return _tests(claim, differences, scale)[1]
    return _one_sided(differences, -claim.effect, "less", scale)


def _against(claim: Claim, interval: tuple[float, float] | None) -> bool:
    """Whether ``interval`` lies wholly against the claim beyond its smallest effect of interest."""
    if interval is None:
        return False
    if claim.kind == "equivalent":
        return interval[1] < -claim.effect or interval[0] > claim.effect
    return interval[1] < -claim.effect


def _interval(differences: list[float], confidence: float, scale: float) -> tuple[float, float] | None:
    if len(differences) < 2:
        return None
    if statistics.pstdev(differences) <= scale:
        return statistics.fmean(differences), statistics.fmean(differences)
    with needs_extra("reproduce"):
        from scipy import stats
    interval = stats.ttest_1samp(differences, 0.0).confidence_interval(confidence_level=confidence)
    return float(interval.low), float(interval.high)


def power(claim: Claim, spread: float, seeds: int, level: float) -> float | None:
    """The chance that the supporting test rejects at ``level`` with ``seeds`` paired seeds whose differences
    spread by ``spread`` (their standard deviation), if the true difference is the paper's (``paper_effect``); None
    where the claim has no paper effect, is a ``reaches`` claim (its truth is its target) or under 2 seeds."""
    if claim.paper_effect is None or claim.kind == "reaches" or seeds < 2:
        return None
    with needs_extra("reproduce"):
        from scipy import stats
    degrees, truth = seeds - 1, claim.paper_effect
    critical = stats.t.ppf(1 - level, degrees)

    def rejects(bound: float, sign: float) -> float:  # P(the test of "sign * (d - bound) > 0" rejects)
        if spread <= 0:
            return 1.0 if sign * (truth - bound) > 0 else 0.0
        return float(stats.nct.sf(critical, degrees, sign * (truth - bound) * math.sqrt(seeds) / spread))

    if claim.kind == "equivalent":  # both of TOST's tests: at least the Bonferroni bound
        return max(0.0, rejects(-claim.effect, 1.0) + rejects(claim.effect, -1.0) - 1.0)
    return rejects(_bounds(claim)[0], 1.0)


def seeds_for_power(claim: Claim, spread: float, level: float) -> int | None:
    """The fewest seeds (``MIN_SEEDS`` to ``MAX_SEEDS``) whose `power` reaches ``TARGET_POWER``; MAX_SEEDS + 1
    where none does, None where no power is computable."""
    if power(claim, spread, MIN_SEEDS, level) is None:
        return None
    return next((seeds for seeds in range(MIN_SEEDS, MAX_SEEDS + 1)
                 if power(claim, spread, seeds, level) >= TARGET_POWER), MAX_SEEDS + 1)


def _regime(claim: Claim, arm_mean: float, baseline_mean: float, levels: dict[str, list[float]]) -> str | None:
    """Why the run cannot answer the claim (module docstring); None where it can."""
    if claim.kind == "reaches":
        return None
    if claim.paper_baseline is not None and abs(baseline_mean - claim.paper_baseline) > claim.paper_band:
        return (f"{claim.baseline} at {baseline_mean:.4g}, the paper's at {claim.paper_baseline:.4g} (band "
                f"{claim.paper_band:g})")
    sign = 1.0 if claim.higher_is_better else -1.0
    if claim.kind in ("equivalent", "not_worse"):
        for name, bound in (("chance", claim.chance), ("the ceiling", claim.ceiling)):
            if bound is not None and all(abs(mean - bound) < claim.effect for mean in (arm_mean, baseline_mean)):
                return (f"{claim.arm} at {arm_mean:.4g} and {claim.baseline} at {baseline_mean:.4g}, both within "
                        f"the margin {claim.effect:g} of {name} {bound:.4g}: no difference is possible")
        return None
    if claim.paper_baseline is not None:
        return None
    # a gain's own baseline is a difference: the floor and ceiling apply to the levels behind it, and a level
    # needs room above the floor for the gains claimed (a model near the floor turns noise into a large "gain")
    floor_room = max(claim.effect, abs(arm_mean), abs(baseline_mean)) if levels else claim.effect
    checked = {name: statistics.fmean(values) for name, values in levels.items()} or {claim.baseline: baseline_mean}
    for name, mean in checked.items():
        if claim.chance is not None and sign * (mean - claim.chance) < floor_room:
            room = f"the larger gain {floor_room:.3g}" if levels else f"the effect {floor_room:g}"
            return f"{name} at {mean:.4g}, within {room} of chance {claim.chance:.4g}"
        if claim.ceiling is not None and sign * (claim.ceiling - mean) < claim.effect:
            return f"{name} at {mean:.4g}, within the effect {claim.effect:g} of the ceiling {claim.ceiling:.4g}"
    return None


def _wanted(claim: Claim) -> str:
    if claim.kind == "reaches":
        return f"at {claim.target:g} or better"
    return {"better": f"better than {claim.baseline} by >= {claim.effect:g}",
            "not_worse": f"within {claim.effect:g} below {claim.baseline} or above",
            "equivalent": f"within ±{claim.effect:g} of {claim.baseline}",
            "wins": f"winning more often than {claim.baseline} by >= {claim.effect:g}"}[claim.kind]


def judge(claim: Claim, arm: list[float], baseline: list[float], levels: dict[str, list[float]] | None = None,
          needs_gpu: str | None = None, smoke: bool = False, mechanism_off: list[float] | None = None) -> Verdict:
    """The verdict on ``claim`` from the per-seed values of the arm and the baseline (paired by index), as a family
    of one (`decide` adjusts it with the rest of its paper's). ``levels``: for a gain claim, the per-seed levels
    behind each arm's gain; ``needs_gpu``: the setting that would reach the paper's regime, where this run cannot;
    ``smoke``: a quick setting (no verdict drawn); ``mechanism_off``: for an equivalence claim about a mechanism, the
    per-seed values with it switched off. Non-finite values are refused: a diverged run is a finding to report, not a
    number to average."""
    result = _judged_in_family(claim, arm, baseline, levels or {}, needs_gpu, smoke, 1, mechanism_off)
    if result.verdict in UNDECIDED and result.p_adjusted is not None:
        result = _contradiction_decided(claim, result, result.p, ALPHA, _paired(claim, arm, baseline))
    return result


def _judged_in_family(claim: Claim, arm: list[float], baseline: list[float], levels: dict[str, list[float]],
                      needs_gpu: str | None, smoke: bool, family_size: int,
                      mechanism_off: list[float] | None = None) -> Verdict:
    """`judge`, with the power at the smallest Holm level of a family of ``family_size`` tested claims; a tested
    claim's verdict is decided on its own p at ``ALPHA`` (`decide` decides it again on Holm's). A row that cannot
    decide (regime differs, needs a GPU) with enough seeds carries the p of its contradiction test, undecided
    (`_contradiction_decided` decides it)."""
    if needs_gpu and not arm:  # not run: the row says which setting would answer
        return Verdict("needs a GPU", f"not run here: {needs_gpu}", 0, *[None] * 11)
    for name, values in {claim.baseline: baseline, **levels, **({"mechanism off": mechanism_off}
                                                                 if mechanism_off is not None else {})}.items():
        if len(values) != len(arm):
            raise UserError(f"{claim.arm} has {len(arm)} seeds and {name} {len(values)}: pair them by seed")
    if not all(math.isfinite(value) for values in (arm, baseline, *levels.values()) for value in values):
        raise UserError(f"non-finite {claim.metric} in {claim.arm} {arm}, {claim.baseline} {baseline} or {levels}")
    if not arm:
        raise UserError(f"no seeds of {claim.arm} and {claim.baseline} to judge {claim.quote!r} on")
    differences, scale = _paired(claim, arm, baseline)
    support, refute = _tests(claim, differences, scale) if len(arm) > 1 else (None, None)
    spread = statistics.stdev(differences) if len(arm) > 1 else 0.0
    level = ALPHA / family_size
    result = Verdict("inconclusive", "", len(arm), mean_std(arm), mean_std(baseline), statistics.fmean(differences),
                     _interval(differences, 1 - 2 * ALPHA, scale), 1 - 2 * ALPHA if len(arm) > 1 else None,
                     support, refute, None if support is None else min(support, refute), None,
                     power(claim, spread, len(arm), level), seeds_for_power(claim, spread, level) if len(arm) > 1
                     else None)
    regime = _regime(claim, result.arm[0], result.baseline[0], levels)
    if claim.kind == "equivalent" and mechanism_off is not None and not smoke:
        moved = max(abs(value - off) for values in (arm, baseline) for value, off in zip(values, mechanism_off))
        if moved < claim.effect:
            return replace(result, verdict=INERT, p_adjusted=None, reason=(
                f"switching the mechanism off moves no seed of {claim.arm} or {claim.baseline} by the margin "
                f"{claim.effect:g} (at most {moved:.2g}): two settings of a mechanism that does nothing here are "
                "equal whatever the claim"))
    if smoke:
        plan = "" if result.seeds_for_power is None else f"; a full run needs {_seeds_text(result)} seeds"
        return replace(result, verdict="smoke", reason="quick setting: " + (
            f"regime differs ({regime}); " if regime else "") + _evidence(claim, result) + plan)
    if needs_gpu or regime:
        undecided = replace(result, verdict="needs a GPU" if needs_gpu else "regime differs", reason=(
            f"this setting cannot reach the paper's regime: {needs_gpu}" if needs_gpu else regime))
        if len(arm) < MIN_SEEDS:
            return undecided
        contradicting = _contradicting(claim, differences, scale)
        return replace(undecided, p=contradicting, p_adjusted=contradicting)
    if len(arm) < MIN_SEEDS:
        return replace(result, reason=f"{_counted(claim, len(arm))}; a verdict needs >= "
                                      f"{MIN_SEEDS}")
    return _decided(claim, result, result.p, ALPHA, (differences, scale))


def _counted(claim: Claim, count: int) -> str:
    """``count`` seeds, or units for a count claim (whose values are one per unit: its ``wins`` kind)."""
    noun = "unit" if claim.kind == "wins" else "seed"
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _seeds_text(result: Verdict) -> str:
    return f"> {MAX_SEEDS}" if result.seeds_for_power > MAX_SEEDS else str(result.seeds_for_power)


def _evidence(claim: Claim, result: Verdict) -> str:
    interval = "" if result.interval is None else (f", {100 * result.confidence:.3g} % CI [{result.interval[0]:+.3g}, "
                                                   f"{result.interval[1]:+.3g}]")
    return f"{claim.arm} {_wanted(claim)}? difference {result.difference:+.4g}{interval}"


def _decided(claim: Claim, result: Verdict, p_adjusted: float, step_level: float,
             paired: tuple[list[float], float], stopped_before: bool = False) -> Verdict:
    """``result`` decided on ``p_adjusted`` (its own p, or Holm's), its interval at the level of its Holm step."""
    confidence = 1 - 2 * step_level
    result = replace(result, confidence=confidence, p_adjusted=p_adjusted,
                     interval=_interval(paired[0], confidence, paired[1]))
    evidence = f"{_evidence(claim, result)}, p {result.p:.2g} (Holm {p_adjusted:.2g})"
    if stopped_before:
        evidence += "; Holm's step-down stopped at a claim ranked before this one, so its interval decides nothing"
    if p_adjusted <= ALPHA:
        verdict = "reproduced" if result.p_support <= result.p_refute else "not reproduced"
        if verdict == "not reproduced" and _against(claim, result.interval) and not stopped_before:
            verdict = CONTRADICTED
    else:
        verdict = "inconclusive"
    if result.power is not None and result.power < TARGET_POWER:
        evidence += (f"; underpowered: power {result.power:.2f} at the paper's {claim.paper_effect:+.3g} with "
                     f"{_counted(claim, result.seeds)} ({_seeds_text(result)} would give {TARGET_POWER:g})")
    return replace(result, verdict=verdict, reason=evidence)


def _contradiction_decided(claim: Claim, result: Verdict, p_adjusted: float, step_level: float,
                           paired: tuple[list[float], float]) -> Verdict:
    """A row that cannot decide its claim (regime differs, needs a GPU), tested for a contradiction at its Holm step:
    "contradicted at this scale" where that test rejects (its interval then lies wholly beyond the effect, against the
    claim), else the row as it was, with that test's p and interval."""
    confidence = 1 - 2 * step_level
    result = replace(result, confidence=confidence, p_adjusted=p_adjusted,
                     interval=_interval(paired[0], confidence, paired[1]))
    if p_adjusted <= ALPHA and _against(claim, result.interval):
        return replace(result, verdict=CONTRADICTED, reason=(
            f"{_evidence(claim, result)}: against it beyond the effect, p {result.p:.2g} (Holm {p_adjusted:.2g}); "
            f"and {result.verdict} ({result.reason})"))
    return replace(result, reason=f"{result.reason}; not contradicted either: p {result.p:.2g} (Holm "
                                  f"{p_adjusted:.2g}) that it lies beyond the effect against the claim")


def decide(records: list[dict], smoke: bool = False) -> list[dict]:
    """The records (`judged`) of one paper judged again together: the primary claim tested first at ``ALPHA``, then,
    where it is decided, the tested secondary ones (>= ``MIN_SEEDS`` seeds; a row that cannot decide its claim, by
    its contradiction test) on Holm's step-down adjustment of their p, so that the chance of any false verdict in the
    paper stays at ``ALPHA`` (module docstring, "Families"), each interval at its Holm step's level. At most one
    record may be the paper's primary claim. ``smoke`` marks them all as a quick setting's (they stay so in any later
    family)."""
    with needs_extra("reproduce"):
        from statsmodels.stats.multitest import multipletests
    claims = [Claim(**record["claim"]) for record in records]
    primaries = sorted({claim.quote for claim in claims if claim.primary})
    if len(primaries) > 1:
        raise UserError(f"a paper has one primary claim; these records declare {len(primaries)}: {primaries}")

    def judged_all(family_sizes: list[int]) -> list[Verdict]:
        return [_judged_in_family(claim, record["values"]["arm"], record["values"]["baseline"],
                                  record["values"]["levels"], record["needs_gpu"], smoke or record["smoke"],
                                  size, record["values"].get("mechanism_off"))
                for claim, record, size in zip(claims, records, family_sizes)]

    verdicts = judged_all([1] * len(records))
    families, gated = _families(claims, verdicts)
    sizes = [1] * len(records)
    for family in families:
        for index in family:
            sizes[index] = len(family)
    verdicts = judged_all(sizes)  # the power at each family's smallest Holm level
    for family in families:
        adjusted = multipletests([verdicts[index].p for index in family], alpha=ALPHA, method="holm")[1]
        for rank, index in enumerate(sorted(family, key=lambda index: verdicts[index].p)):
            step_level = ALPHA / (len(family) - rank)
            p_adjusted = float(adjusted[family.index(index)])
            paired = _paired(claims[index], records[index]["values"]["arm"], records[index]["values"]["baseline"])
            if verdicts[index].verdict in UNDECIDED:
                verdicts[index] = _contradiction_decided(claims[index], verdicts[index], p_adjusted, step_level, paired)
            else:
                verdicts[index] = _decided(claims[index], verdicts[index], p_adjusted, step_level, paired,
                                           stopped_before=verdicts[index].p <= step_level and p_adjusted > ALPHA)
    primary = next((verdicts[index] for index, claim in enumerate(claims) if claim.primary), None)
    for index in gated:
        verdicts[index] = _gated(claims[index], verdicts[index], primary)
    return [_with_verdict({**record, "smoke": smoke or record["smoke"]}, claim, verdict)
            for record, claim, verdict in zip(records, claims, verdicts)]


def _families(claims: list[Claim], verdicts: list[Verdict]) -> tuple[list[list[int]], list[int]]:
    """The Holm families of a paper's tested claims (those with a p), in the order they are tested, and the tested
    secondary claims the gate keeps untested: the primary alone first; the secondary claims together where the
    primary was decided at ``ALPHA``, else none of them (module docstring, "Families")."""
    tested = [index for index, verdict in enumerate(verdicts) if verdict.p_adjusted is not None]
    primary = next((index for index, claim in enumerate(claims) if claim.primary), None)
    if primary is None:
        return [tested] if tested else [], []
    secondary = [index for index in tested if index != primary]
    families = [[primary]] if primary in tested else []
    if primary in tested and verdicts[primary].p <= ALPHA:
        return families + ([secondary] if secondary else []), []
    return families, secondary


def _gated(claim: Claim, result: Verdict, primary: Verdict) -> Verdict:
    """A secondary claim left untested because its paper's primary decided nothing (gatekeeping): its numbers, its
    own p, what it would have been tested as, and why it carries no verdict."""
    why = (f"the primary claim's p is {primary.p:.2g}" if primary.p is not None
           else f"the primary claim was not tested ({primary.verdict})")
    note = (f"not tested: secondary claims are tested only once the paper's primary claim is decided at {ALPHA:g} "
            f"(gatekeeping), and {why}")
    seen = f"{result.verdict} ({result.reason})" if result.verdict in UNDECIDED else "tested"
    return replace(result, verdict=GATED, p_adjusted=None,
                   reason=f"{_evidence(claim, result)}, p {result.p:.2g}; would be {seen}; {note}")


def verdict_markdown(claim: Claim, result: Verdict) -> str:
    """One ledger row: claim (source, role), smallest effect of interest, arms as mean ± std, the difference with
    its interval at the deciding level, raw and adjusted p, power, verdict and reason."""
    def level(name: str, values: tuple[float, float] | None) -> str:
        return f"{name}: not run" if values is None else f"{name} {values[0]:.4g} ± {values[1]:.2g}"

    interval = "" if result.interval is None else (f" [{result.interval[0]:+.3g}, {result.interval[1]:+.3g}] "
                                                   f"({100 * result.confidence:.3g} %)")
    difference = "–" if result.difference is None else f"{result.difference:+.3g}{interval}"
    p = "–" if result.p is None else f"{result.p:.2g}"
    adjusted = "–" if result.p_adjusted is None else f"{result.p_adjusted:.2g}"
    power_cell = "–" if result.power is None else f"{result.power:.2f}"
    effect = f"≥ {claim.target:g}" if claim.kind == "reaches" else f"{claim.kind} by {claim.effect:g}"
    regime = f"; regime: {claim.regime_source}" if claim.regime_source else ""
    return (f"| {claim.quote} ({claim.source}; {claim.role}) | {effect} ({claim.effect_source}{regime}) | "
            f"{level(claim.arm, result.arm)} | {level(claim.baseline, result.baseline)} | {difference} | {p} | "
            f"{adjusted} | {power_cell} | **{result.verdict}** | {result.reason} |")


LEDGER_HEADER = ("| claim | smallest effect of interest | arm (mean ± std) | baseline (mean ± std) | difference "
                 "[CI] (its confidence: Holm's step) | p | p (Holm, per paper) | power | verdict | why |\n"
                 "|---|---|---|---|---|---|---|---|---|---|")


def _with_verdict(record: dict, claim: Claim, verdict: Verdict) -> dict:
    return {**record, **asdict(verdict), "row": verdict_markdown(claim, verdict)}


def judged(claim: Claim, arm: list[float], baseline: list[float], levels: dict[str, list[float]] | None = None,
           needs_gpu: str | None = None, mechanism_off: list[float] | None = None, **where) -> dict:
    """A report's record of one claim: ``where`` (e.g. length=64), the claim, the per-seed ``values`` it is judged
    on, the verdict's fields on its own p (`decide` judges a paper's records together) and its ledger row."""
    levels = {name: list(values) for name, values in (levels or {}).items()}
    values = dict(arm=list(arm), baseline=list(baseline), levels=levels)
    if mechanism_off is not None:
        values["mechanism_off"] = list(mechanism_off)
    record = dict(where, claim=asdict(claim), values=values, needs_gpu=needs_gpu, smoke=False)
    return _with_verdict(record, claim, judge(claim, arm, baseline, levels, needs_gpu, mechanism_off=mechanism_off))


def ledger_lines(records: list[dict], heading: str) -> list[str]:
    """The markdown section of a report's verdict records: a heading line, then the ledger table."""
    return ["", heading, "", LEDGER_HEADER, *(record["row"] for record in records)]
