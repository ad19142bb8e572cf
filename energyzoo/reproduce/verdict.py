"""The verdict every `energyzoo reproduce` experiment prints: does the paper's claim hold against the paper's own
baseline, over paired seeds, by at least the smallest effect the paper makes worth having?

A claim compares an arm with its baseline on one metric (seed s of each paired: same data order, same initial draw
where the arms share shapes). Its per-seed differences d_s = arm - baseline (arm - target for ``reaches``) are
sign-adjusted so that positive favours the arm, and the claim names its **smallest effect of interest** ``effect``
(in the metric's units, taken from the paper's own numbers: ``effect_source`` says which). By ``kind``:

- ``better``: the arm beats the baseline by at least ``effect``;
- ``not_worse``: the arm trails the baseline by less than ``effect`` (non-inferiority);
- ``equivalent``: the arm is within ``effect`` of the baseline either way (a "no difference" claim: TOST);
- ``reaches``: the arm reaches the paper's absolute ``target`` (the baseline is run and reported beside it).

Each claim is two one-sided paired t-tests (`scipy.stats.ttest_rel`) at ``ALPHA`` against the claim's bound: one
that supports it (``better``: the lower 95 % confidence bound of the mean difference clears ``effect``;
``equivalent``: both one-sided tests of TOST reject) and one that refutes it (``better``: the upper bound falls
short of ``effect``, so an effect of interest is ruled out). The verdict's p is the smaller of the two, and the
verdicts of a ledger are decided together (`decide`) on Holm-adjusted p (`statsmodels`' ``multipletests``):

- **reproduced** / **not reproduced**: the supporting / refuting test rejects after Holm;
- **inconclusive**: neither does, or fewer than ``MIN_SEEDS`` seeds ran;
- **regime differs**: the baseline is not where the paper's experiment put it, so the run cannot answer. With
  ``paper_baseline`` set, the baseline's mean must lie within ``paper_band`` of it; otherwise it must sit above
  ``chance`` and below ``ceiling`` by at least ``effect`` (room for the claimed difference either way). A gain claim
  (a difference of two levels, e.g. accuracy at 2R minus at R) passes the levels behind the gain, and each must
  clear the same floor and ceiling;
- **needs a GPU**: the experiment says its setting cannot reach the paper's regime on 2 CPU cores (a named setting
  can, on a GPU);
- **smoke**: a quick setting ran: the numbers are shown, and no verdict is drawn from them.

The interval printed is the two-sided (1 - 2 ALPHA) paired t interval of the mean difference, the one whose ends
are the one-sided bounds above.
"""

import math
import statistics
from dataclasses import asdict, dataclass, replace

from ..extras import needs_extra
from ..modeling.errors import UserError

ALPHA = 0.05
MIN_SEEDS = 5
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "regime differs", "needs a GPU")
KINDS = ("better", "not_worse", "equivalent", "reaches")


@dataclass(frozen=True)
class Claim:
    """What a paper claims, quoted with its table or figure: ``arm`` is ``kind`` than ``baseline`` on ``metric`` by
    the smallest effect of interest ``effect`` (from ``effect_source``), or reaches ``target``. ``chance`` and
    ``ceiling`` are the metric's trivial and perfect values (None: unbounded); ``paper_baseline`` (with
    ``paper_band``) the baseline's level in the paper's own experiment, where our run should match it."""

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


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    seeds: int
    arm: tuple[float, float] | None  # mean, std over seeds; None where the claim was not run
    baseline: tuple[float, float] | None
    difference: float | None  # mean of the per-seed differences (to the baseline, or the target), positive: the arm
    interval: tuple[float, float] | None  # its two-sided (1 - 2 ALPHA) paired t interval; None under 2 seeds
    p_support: float | None  # one-sided p of the test that supports the claim; None where nothing is tested
    p_refute: float | None
    p: float | None  # the smaller of the two: the claim's p in the ledger's Holm family
    p_adjusted: float | None  # Holm-adjusted over the verdicts decided together (`decide`)


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _one_sided(arm: list[float], reference: list[float], bound: float, alternative: str) -> float:
    """p of the paired t-test that mean(arm - reference) is ``alternative`` ("greater" or "less") than ``bound``;
    1 where the differences do not vary (no spread, no evidence either way)."""
    with needs_extra("reproduce"):
        from scipy import stats
    if statistics.pstdev([own - other for own, other in zip(arm, reference)]) <= 1e-12 * max(map(abs, arm)):
        return 1.0
    p = float(stats.ttest_rel([value - bound for value in arm], reference, alternative=alternative).pvalue)
    return p if math.isfinite(p) else 1.0


def _tests(claim: Claim, arm: list[float], reference: list[float]) -> tuple[float, float]:
    """(p supporting, p refuting) the claim from the sign-adjusted arm and reference values."""
    if claim.kind == "equivalent":  # TOST: the difference is above -effect and below +effect
        support = max(_one_sided(arm, reference, -claim.effect, "greater"),
                      _one_sided(arm, reference, claim.effect, "less"))
        refute = min(_one_sided(arm, reference, claim.effect, "greater"),
                     _one_sided(arm, reference, -claim.effect, "less"))
        return support, refute
    bound = {"better": claim.effect, "not_worse": -claim.effect, "reaches": 0.0}[claim.kind]
    return _one_sided(arm, reference, bound, "greater"), _one_sided(arm, reference, bound, "less")


def _interval(differences: list[float]) -> tuple[float, float] | None:
    if len(differences) < 2:
        return None
    with needs_extra("reproduce"):
        from scipy import stats
    if statistics.pstdev(differences) <= 1e-12 * max(map(abs, differences), default=0.0):
        return statistics.fmean(differences), statistics.fmean(differences)
    interval = stats.ttest_1samp(differences, 0.0).confidence_interval(confidence_level=1 - 2 * ALPHA)
    return float(interval.low), float(interval.high)


def _regime(claim: Claim, baseline_mean: float, levels: dict[str, list[float]]) -> str | None:
    """Why the run cannot answer the claim (the baseline, or a level behind a gain, out of the paper's regime);
    None where it can."""
    if claim.kind == "reaches":
        return None
    if claim.paper_baseline is not None:
        if abs(baseline_mean - claim.paper_baseline) > claim.paper_band:
            return (f"{claim.baseline} at {baseline_mean:.4g}, the paper's at {claim.paper_baseline:.4g} (band "
                    f"{claim.paper_band:g})")
        return None
    sign = 1.0 if claim.higher_is_better else -1.0
    # a gain's own baseline is a difference: the floor and ceiling apply to the levels behind it
    checked = {name: statistics.fmean(values) for name, values in levels.items()} or {claim.baseline: baseline_mean}
    for name, mean in checked.items():
        if claim.chance is not None and sign * (mean - claim.chance) < claim.effect:
            return f"{name} at {mean:.4g}, within the effect {claim.effect:g} of chance {claim.chance:.4g}"
        if claim.ceiling is not None and sign * (claim.ceiling - mean) < claim.effect:
            return f"{name} at {mean:.4g}, within the effect {claim.effect:g} of the ceiling {claim.ceiling:.4g}"
    return None


def _wanted(claim: Claim) -> str:
    if claim.kind == "reaches":
        return f"at {claim.target:g} or better"
    return {"better": f"better than {claim.baseline} by >= {claim.effect:g}",
            "not_worse": f"within {claim.effect:g} below {claim.baseline} or above",
            "equivalent": f"within ±{claim.effect:g} of {claim.baseline}"}[claim.kind]


def judge(claim: Claim, arm: list[float], baseline: list[float], levels: dict[str, list[float]] | None = None,
          needs_gpu: str | None = None, smoke: bool = False) -> Verdict:
    """The verdict on ``claim`` from the per-seed values of the arm and the baseline (paired by index), on its own
    p (`decide` adjusts it with the rest of a ledger). ``levels``: for a gain claim, the per-seed levels behind each
    arm's gain; ``needs_gpu``: the setting that would reach the paper's regime, where this run cannot; ``smoke``:
    a quick setting (no verdict drawn). Non-finite values are refused: a diverged run is a finding to report, not a
    number to average."""
    levels = levels or {}
    if needs_gpu and not arm:  # not run: the row says which setting would answer
        return Verdict("needs a GPU", f"not run here: {needs_gpu}", 0, None, None, None, None, None, None, None, None)
    for name, values in {claim.baseline: baseline, **levels}.items():
        if len(values) != len(arm):
            raise UserError(f"{claim.arm} has {len(arm)} seeds and {name} {len(values)}: pair them by seed")
    if not all(math.isfinite(value) for values in (arm, baseline, *levels.values()) for value in values):
        raise UserError(f"non-finite {claim.metric} in {claim.arm} {arm}, {claim.baseline} {baseline} or {levels}")
    if not arm:
        raise UserError(f"no seeds of {claim.arm} and {claim.baseline} to judge {claim.quote!r} on")
    sign = 1.0 if claim.higher_is_better else -1.0
    references = [claim.target] * len(arm) if claim.kind == "reaches" else baseline
    signed_arm, signed_reference = [sign * value for value in arm], [sign * value for value in references]
    differences = [own - reference for own, reference in zip(signed_arm, signed_reference)]
    support, refute = _tests(claim, signed_arm, signed_reference) if len(arm) > 1 else (None, None)
    tested = dict(p_support=support, p_refute=refute, p=None if support is None else min(support, refute))
    result = Verdict("inconclusive", "", len(arm), mean_std(arm), mean_std(baseline), statistics.fmean(differences),
                     _interval(differences), **tested, p_adjusted=None)
    regime = _regime(claim, result.baseline[0], levels)
    if smoke:
        return replace(result, verdict="smoke", reason="quick setting: " + (
            f"regime differs ({regime}); " if regime else "") + _evidence(claim, result))
    if needs_gpu:
        return replace(result, verdict="needs a GPU", reason=f"this setting cannot reach the paper's regime: "
                                                             f"{needs_gpu}")
    if regime:
        return replace(result, verdict="regime differs", reason=regime)
    if len(arm) < MIN_SEEDS:
        return replace(result, reason=f"{len(arm)} seed{'' if len(arm) == 1 else 's'}; a verdict needs >= "
                                      f"{MIN_SEEDS}")
    return _decided(claim, result, result.p)


def _evidence(claim: Claim, result: Verdict) -> str:
    interval = "" if result.interval is None else (f", {1 - 2 * ALPHA:.0%} CI [{result.interval[0]:+.3g}, "
                                                   f"{result.interval[1]:+.3g}]")
    return f"{claim.arm} {_wanted(claim)}? difference {result.difference:+.4g}{interval}"


def _decided(claim: Claim, result: Verdict, p_adjusted: float) -> Verdict:
    """``result`` decided on ``p_adjusted`` (its own p, or Holm's)."""
    evidence = f"{_evidence(claim, result)}, p {result.p:.2g} (Holm {p_adjusted:.2g})"
    if p_adjusted <= ALPHA:
        verdict = "reproduced" if result.p_support <= result.p_refute else "not reproduced"
    else:
        verdict = "inconclusive"
    return replace(result, verdict=verdict, reason=evidence, p_adjusted=p_adjusted)


def decide(records: list[dict], smoke: bool = False) -> list[dict]:
    """The records (`judged`) judged again together: the tested ones (>= ``MIN_SEEDS`` seeds, in the paper's regime)
    decided on Holm's step-down adjustment of their p over the family, so that the chance of any false verdict among
    them stays at ``ALPHA``. ``smoke`` marks them all as a quick setting's (they stay so in any later family)."""
    with needs_extra("reproduce"):
        from statsmodels.stats.multitest import multipletests
    claims = [Claim(**record["claim"]) for record in records]
    verdicts = [judge(claim, record["values"]["arm"], record["values"]["baseline"], record["values"]["levels"],
                      record["needs_gpu"], smoke or record["smoke"]) for claim, record in zip(claims, records)]
    family = [index for index, verdict in enumerate(verdicts) if verdict.p_adjusted is not None]
    if family:
        adjusted = multipletests([verdicts[index].p for index in family], alpha=ALPHA, method="holm")[1]
        for index, p_adjusted in zip(family, adjusted):
            verdicts[index] = _decided(claims[index], verdicts[index], float(p_adjusted))
    return [_with_verdict({**record, "smoke": smoke or record["smoke"]}, claim, verdict)
            for record, claim, verdict in zip(records, claims, verdicts)]


def verdict_markdown(claim: Claim, result: Verdict) -> str:
    """One ledger row: claim (source), smallest effect of interest, arms as mean ± std, the difference with its
    interval, raw and adjusted p, verdict and reason."""
    def level(name: str, values: tuple[float, float] | None) -> str:
        return f"{name}: not run" if values is None else f"{name} {values[0]:.4g} ± {values[1]:.2g}"

    interval = "" if result.interval is None else f" [{result.interval[0]:+.3g}, {result.interval[1]:+.3g}]"
    difference = "–" if result.difference is None else f"{result.difference:+.3g}{interval}"
    p = "–" if result.p is None else f"{result.p:.2g}"
    adjusted = "–" if result.p_adjusted is None else f"{result.p_adjusted:.2g}"
    effect = f"≥ {claim.target:g}" if claim.kind == "reaches" else f"{claim.kind} by {claim.effect:g}"
    return (f"| {claim.quote} ({claim.source}) | {effect} ({claim.effect_source}) | {level(claim.arm, result.arm)} | "
            f"{level(claim.baseline, result.baseline)} | {difference} | {p} | {adjusted} | **{result.verdict}** | "
            f"{result.reason} |")


LEDGER_HEADER = ("| claim | smallest effect of interest | arm (mean ± std) | baseline (mean ± std) | difference "
                 f"({1 - 2 * ALPHA:.0%} CI) | p | p (Holm) | verdict | why |\n|---|---|---|---|---|---|---|---|---|")


def _with_verdict(record: dict, claim: Claim, verdict: Verdict) -> dict:
    return {**record, **asdict(verdict), "row": verdict_markdown(claim, verdict)}


def judged(claim: Claim, arm: list[float], baseline: list[float], levels: dict[str, list[float]] | None = None,
           needs_gpu: str | None = None, **where) -> dict:
    """A report's record of one claim: ``where`` (e.g. length=64), the claim, the per-seed ``values`` it is judged
    on, the verdict's fields on its own p (`decide` judges a report's or a ledger's records together) and its
    ledger row."""
    levels = {name: list(values) for name, values in (levels or {}).items()}
    record = dict(where, claim=asdict(claim), values=dict(arm=list(arm), baseline=list(baseline), levels=levels),
                  needs_gpu=needs_gpu, smoke=False)
    return _with_verdict(record, claim, judge(claim, arm, baseline, levels, needs_gpu))


def ledger_lines(records: list[dict], heading: str) -> list[str]:
    """The markdown section of a report's verdict records: a heading line, then the ledger table."""
    return ["", heading, "", LEDGER_HEADER, *(record["row"] for record in records)]
