"""The verdict every `energyzoo reproduce` experiment prints: does the paper's claim hold against the paper's own
baseline, over seeds?

A claim compares an arm with its baseline on one metric: the arm is ``better``, or ``not_worse`` within a margin
(a claim of parity), or, for a paper's absolute number, ``reaches`` a target value (the baseline is still run and
reported beside it). Arms are paired by seed (same data order, same initial draw where the arms share shapes), and
the verdict reads the per-seed differences d_s = arm - baseline (arm - target for ``reaches``), sign-adjusted so that
positive favours the arm:

- **inconclusive** when fewer than `MIN_SEEDS` seeds ran, when the baseline's mean sits within ``band`` of chance (or
  below it) or of the ceiling (the task cannot separate the arms; not asked of ``reaches``), or when the difference
  is within seed noise;
- **reproduced** when every seed agrees with the claim and the mean difference clears `NOISE_MULTIPLE` standard
  errors of the mean difference (for ``not_worse``: the mean clears -margin that way);
- **not reproduced** when every seed contradicts the claim beyond that noise.

Seeds that split (some favour the arm, some the baseline) are "seeds disagree": inconclusive. The rule is
deliberately strict for 3-5 seeds, where a t-test has little power: it reports agreement of all seeds plus a mean
beyond twice its standard error, not a p-value.
"""

import math
import statistics
from dataclasses import asdict, dataclass

from ..modeling.errors import UserError

MIN_SEEDS = 3
NOISE_MULTIPLE = 2.0
VERDICTS = ("reproduced", "not reproduced", "inconclusive")
KINDS = ("better", "not_worse", "reaches")


@dataclass(frozen=True)
class Claim:
    """What a paper claims, quoted with its table or figure: ``arm`` is ``kind`` ("better" or "not_worse" within
    ``margin``, in the metric's units) than ``baseline`` on ``metric``, or ("reaches") at least ``target``.
    ``chance`` and ``ceiling`` are the metric's trivial and perfect values (None: unbounded), ``band`` how near them
    a baseline is too near."""

    quote: str
    source: str
    arm: str
    baseline: str
    metric: str
    higher_is_better: bool = True
    kind: str = "better"
    margin: float = 0.0
    chance: float | None = None
    ceiling: float | None = None
    band: float = 0.05
    target: float | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise UserError(f"Claim.kind must be one of {KINDS}, got {self.kind!r}")
        if (self.kind == "reaches") != (self.target is not None):
            raise UserError(f"Claim.target is the value a 'reaches' claim names, and only that (kind {self.kind!r}, "
                             f"target {self.target})")
        if self.margin < 0 or self.band < 0:
            raise UserError(f"Claim.margin and Claim.band must be >= 0, got {self.margin} and {self.band}")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    arm: tuple[float, float]  # mean, std over seeds
    baseline: tuple[float, float]
    difference: float  # mean of the per-seed differences (to the baseline, or the target), positive favours the arm
    standard_error: float | None  # of that mean; None with fewer than 2 seeds


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def judge(claim: Claim, arm: list[float], baseline: list[float]) -> Verdict:
    """The verdict on ``claim`` from the per-seed values of the arm and the baseline (paired by index: seed s of
    each). Non-finite values are refused: a diverged run is a finding to report, not a number to average."""
    if len(arm) != len(baseline):
        raise UserError(f"{claim.arm} has {len(arm)} seeds and {claim.baseline} {len(baseline)}: pair them by seed")
    if not all(math.isfinite(value) for value in (*arm, *baseline)):
        raise UserError(f"non-finite {claim.metric} in {claim.arm} {arm} or {claim.baseline} {baseline}")
    sign = 1.0 if claim.higher_is_better else -1.0
    references = [claim.target] * len(arm) if claim.kind == "reaches" else baseline
    differences = [sign * (own - reference) for own, reference in zip(arm, references)]
    difference = statistics.fmean(differences) if differences else 0.0
    error = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else math.inf
    summary = dict(arm=mean_std(arm) if arm else (math.nan, math.nan),
                   baseline=mean_std(baseline) if baseline else (math.nan, math.nan),
                   difference=difference, standard_error=error if math.isfinite(error) else None)

    def verdict(label: str, reason: str) -> Verdict:
        return Verdict(label, reason, **summary)

    if len(arm) < MIN_SEEDS:
        return verdict("inconclusive", f"{len(arm)} seed{'' if len(arm) == 1 else 's'}; a verdict needs >= "
                                       f"{MIN_SEEDS}")
    base_mean = summary["baseline"][0]
    # how far the baseline is from chance towards the ceiling, and from the ceiling back towards chance (a baseline
    # below chance, which an untrained model can be, has learned nothing either)
    for bound, name, room in ((claim.chance, "chance", lambda bound: sign * (base_mean - bound)),
                              (claim.ceiling, "the ceiling", lambda bound: sign * (bound - base_mean))):
        if claim.kind != "reaches" and bound is not None and room(bound) <= claim.band:
            return verdict("inconclusive", f"{claim.baseline} sits at {name} ({claim.metric} {base_mean:.4g}, "
                                           f"{name} {bound:.4g}): the task cannot separate the arms")
    # for a parity claim, the arm may trail by the margin
    shifted = [value + claim.margin for value in differences] if claim.kind == "not_worse" else differences
    cleared = statistics.fmean(shifted) - NOISE_MULTIPLE * error
    fell_short = statistics.fmean(shifted) + NOISE_MULTIPLE * error
    if claim.kind == "reaches":
        wanted = f"at {claim.target:g} or better"
    else:
        wanted = f"better than {claim.baseline}" if claim.kind == "better" else f"within {claim.margin:g} of " \
            f"{claim.baseline}"
    if all(value > 0 for value in shifted) and cleared > 0:
        return verdict("reproduced", f"{claim.arm} is {wanted} on every seed, by {difference:+.4g} "
                                     f"({NOISE_MULTIPLE:g} x s.e. {error:.2g})")
    if all(value <= 0 for value in shifted) and fell_short < 0:
        return verdict("not reproduced", f"{claim.arm} is not {wanted} on any seed ({difference:+.4g}, s.e. "
                                         f"{error:.2g})")
    if any(value > 0 for value in shifted) and any(value <= 0 for value in shifted):
        return verdict("inconclusive", f"seeds disagree: {sum(value > 0 for value in shifted)} of "
                                       f"{len(shifted)} favour the claim ({difference:+.4g}, s.e. {error:.2g})")
    return verdict("inconclusive", f"the difference {difference:+.4g} is within {NOISE_MULTIPLE:g} standard errors "
                                   f"({error:.2g}) of the claim's bound")


def verdict_markdown(claim: Claim, result: Verdict) -> str:
    """One ledger row: claim (source), arms as mean ± std, verdict and reason."""
    arm, base = result.arm, result.baseline
    return (f"| {claim.quote} ({claim.source}) | {claim.arm} {arm[0]:.4g} ± {arm[1]:.2g} | {claim.baseline} "
            f"{base[0]:.4g} ± {base[1]:.2g} | **{result.verdict}** | {result.reason} |")


LEDGER_HEADER = ("| claim | arm (mean ± std) | baseline (mean ± std) | verdict | why |\n"
                 "|---|---|---|---|---|")


def judged(claim: Claim, arm: list[float], baseline: list[float], **where) -> dict:
    """A report's record of one verdict: ``where`` (e.g. length=64), the claim, the verdict's fields and its
    ledger row."""
    verdict = judge(claim, arm, baseline)
    return dict(where, claim=asdict(claim), **asdict(verdict), row=verdict_markdown(claim, verdict))


def ledger_lines(records: list[dict], heading: str) -> list[str]:
    """The markdown section of a report's verdict records: a heading line, then the ledger table."""
    return ["", heading, "", LEDGER_HEADER, *(record["row"] for record in records)]

