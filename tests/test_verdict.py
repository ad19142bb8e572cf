"""The verdict rule of `energyzoo reproduce` on constructed per-seed results: its error rates by Monte-Carlo under a
known truth, its interval against the closed-form paired t interval, TOST on a true zero, the regime guard, and
Holm's adjustment against the step-down written out by hand."""

import gc
import math
import random
import statistics

import pytest

from energyzoo.modeling.errors import UserError
from energyzoo.reproduce.verdict import (
    ALPHA,
    CONTRADICTED,
    GATED,
    INERT,
    LEDGER_HEADER,
    MIN_SEEDS,
    Claim,
    decide,
    judge,
    judged,
)

ACCURACY = Claim("EqT beats Llama", "Table 2", "eqt", "llama", "accuracy", effect=0.02,
                 effect_source="half Table 2's gap", chance=0.5, ceiling=1.0)
LOSS = Claim("FEM-SM beats a Transformer", "Table 2", "fem", "llama", "loss", effect=0.05,
             effect_source="half Table 2's gap", higher_is_better=False)
T_95_4 = 2.1318467813  # the one-sided 95 % quantile of Student's t with 4 degrees of freedom (tables)


def _simulated(truth: float, spread: float, seeds: int, generator: random.Random) -> tuple[list, list]:
    baseline = [0.7 + generator.gauss(0, spread) for _ in range(seeds)]
    return [value + truth + generator.gauss(0, spread) for value in baseline], baseline


def _rate(claim: Claim, truth: float, verdict: str, trials: int = 1000, seeds: int = 5) -> float:
    generator = random.Random(0)
    return sum(judge(claim, *_simulated(truth, 0.03, seeds, generator)).verdict == verdict
               for _ in range(trials)) / trials


def test_the_false_positive_rate_at_five_seeds_is_alpha_at_the_bound_and_below_it_under_the_null():
    at_bound = Claim("a", "s", "a", "b", "accuracy", effect=0.0, effect_source="none", chance=0.0, ceiling=1.0)
    rate = _rate(at_bound, 0.0, "reproduced")
    assert abs(rate - ALPHA) < 3 * math.sqrt(ALPHA * (1 - ALPHA) / 1000)  # exactly alpha: a one-sided t-test
    assert _rate(ACCURACY, 0.0, "reproduced") < 0.01  # the effect of interest lies beyond a true zero
    # the old rule (every seed agrees and mean > 2 s.e.) called 9.2 % of these reproduced at 3 seeds


def test_an_effect_of_the_claimed_size_is_found_and_a_sub_noise_effect_is_not_reproduced():
    assert _rate(ACCURACY, 0.08, "reproduced") > 0.8  # 4 effects of interest, spread 0.03 per arm
    # the audit's case: +0.27 points when each arm's seeds spread 5 points
    generator = random.Random(1)
    baseline = [0.70 + generator.gauss(0, 0.05) for _ in range(5)]
    result = judge(ACCURACY, [value + 0.0027 + generator.gauss(0, 0.05) for value in baseline], baseline)
    assert result.verdict != "reproduced"
    # +0.11 points with no noise at all is still short of the smallest effect of interest (0.02): refuted
    steady = judge(ACCURACY, [0.7011 + 0.001 * seed for seed in range(5)], [0.7 + 0.001 * seed for seed in range(5)])
    assert steady.verdict != "reproduced"


def test_the_interval_and_one_sided_p_are_the_paired_t_ones():
    arm, baseline = [0.80, 0.82, 0.81, 0.83, 0.79], [0.70, 0.71, 0.69, 0.72, 0.70]
    differences = [a - b for a, b in zip(arm, baseline)]
    mean, error = statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(5)
    result = judge(ACCURACY, arm, baseline)
    assert result.difference == pytest.approx(mean)
    assert result.interval == pytest.approx((mean - T_95_4 * error, mean + T_95_4 * error))
    assert result.seeds == 5 and result.arm == pytest.approx((0.81, statistics.stdev(arm)))
    # the supporting test is "mean difference > effect": its statistic against the tabled quantile
    assert (mean - ACCURACY.effect) / error > T_95_4 and result.p_support < ALPHA
    assert result.p_support + result.p_refute == pytest.approx(1.0)
    assert result.verdict == "reproduced" and result.p == result.p_support == result.p_adjusted


def test_lower_is_better_metrics_flip_the_sign():
    assert judge(LOSS, [2.00, 2.10, 2.05, 2.02, 2.07], [2.30, 2.35, 2.40, 2.31, 2.38]).verdict == "reproduced"
    worse = judge(LOSS, [2.50, 2.60, 2.55, 2.52, 2.58], [2.30, 2.35, 2.40, 2.31, 2.38])
    assert worse.verdict == CONTRADICTED and worse.difference == pytest.approx(-0.202)  # beyond -0.05: the opposite
    level = judge(LOSS, [2.30, 2.36, 2.39, 2.32, 2.37], [2.30, 2.35, 2.40, 2.31, 2.38])
    assert level.verdict == "not reproduced"  # no gain of 0.05, and no loss beyond it either


def test_tost_confirms_a_true_zero_and_refutes_a_difference_beyond_the_margin():
    same = Claim("K = 32 adds nothing", "s", "K32", "K0", "accuracy", effect=0.01, effect_source="1 point",
                 kind="equivalent", chance=0.5, ceiling=1.0)
    generator = random.Random(2)
    baseline = [0.8 + generator.gauss(0, 0.02) for _ in range(8)]
    assert judge(same, [value + generator.gauss(0, 0.002) for value in baseline], baseline).verdict == "reproduced"
    assert judge(same, [value + 0.05 + generator.gauss(0, 0.002) for value in baseline],
                 baseline).verdict == CONTRADICTED  # beyond the margin: what the claim denies
    at_margin = _rate(same, 0.01, "reproduced")  # a true difference at the margin is not equivalence
    assert at_margin < ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 1000)
    noisy = judge(same, [value + generator.gauss(0, 0.05) for value in baseline], baseline)
    assert noisy.verdict == "inconclusive"  # a zero mean with noise wider than the margin confirms nothing


def test_non_inferiority_holds_within_the_margin_and_fails_beyond_it():
    parity = Claim("FEM matches softmax", "s", "fem", "softmax", "accuracy", effect=0.01, effect_source="1 point",
                   kind="not_worse", chance=0.1, ceiling=1.0)
    baseline = [0.80, 0.81, 0.79, 0.80, 0.82]
    assert judge(parity, [value - 0.003 + 0.001 * seed for seed, value in enumerate(baseline)],
                 baseline).verdict == "reproduced"
    assert judge(parity, [value - 0.08 + 0.001 * seed for seed, value in enumerate(baseline)],
                 baseline).verdict == CONTRADICTED


def test_a_baseline_outside_the_papers_regime_gets_no_verdict():
    banded = Claim("a", "s", "a", "b", "accuracy", effect=0.02, effect_source="e", paper_baseline=0.99,
                   paper_band=0.05)
    result = judge(banded, [0.9] * 5, [0.5, 0.51, 0.5, 0.52, 0.5])
    assert result.verdict == "regime differs" and "the paper's at 0.99" in result.reason
    assert result.difference == pytest.approx(0.394)  # the numbers are still reported
    assert judge(banded, [0.99, 0.995, 1.0, 0.998, 0.999], [0.97, 0.96, 0.97, 0.97, 0.96]).verdict == "reproduced"
    near_ceiling = judge(ACCURACY, [1.0] * 5, [0.99, 0.985, 0.99, 0.99, 0.995])  # 0.99 + the effect > 1
    assert near_ceiling.verdict == "regime differs" and "ceiling" in near_ceiling.reason
    near_chance = judge(ACCURACY, [0.6] * 5, [0.51, 0.515, 0.51, 0.51, 0.505])
    assert near_chance.verdict == "regime differs" and "chance" in near_chance.reason
    loss = Claim("a", "s", "a", "b", "loss", effect=0.1, effect_source="e", higher_is_better=False, chance=2.5,
                 ceiling=0.0)
    assert "chance" in judge(loss, [1.0] * 5, [2.45, 2.42, 2.44, 2.46, 2.43]).reason  # within 0.1 below chance
    assert judge(ACCURACY.__class__(**{**ACCURACY.__dict__, "kind": "reaches", "target": 0.9}), [0.95] * 5,
                 [0.5] * 5).verdict != "regime differs"  # an absolute target is judged whatever the baseline does


def test_a_gain_claim_checks_the_levels_behind_the_gains():
    gain = Claim("scales better from R to 2R", "s", "h", "t", "gain", effect=0.02, effect_source="e", chance=None,
                 ceiling=None)
    floor = Claim(**{**gain.__dict__, "chance": 0.0, "ceiling": 1.0})
    arm, baseline = [0.10, 0.11, 0.12, 0.10, 0.11], [0.01, 0.0, 0.02, 0.01, 0.0]
    starved = judge(floor, arm, baseline, levels={"t at R": [0.01, 0.005, 0.015, 0.01, 0.01], "h at R": [0.5] * 5})
    assert starved.verdict == "regime differs" and "t at R" in starved.reason  # 1 % at R: nothing to lose
    assert judge(floor, arm, baseline, levels={"t at R": [0.5] * 5, "h at R": [0.5] * 5}).verdict == "reproduced"


def test_holm_adjusts_the_family_of_tested_claims_only():
    generator = random.Random(3)
    records = []
    for truth in (0.0, 0.03, 0.06):
        arm, baseline = _simulated(truth, 0.02, 6, generator)
        records.append(judged(ACCURACY, arm, baseline, task=f"truth {truth}"))
    records.append(judged(ACCURACY, [0.6] * 3, [0.55] * 3))  # 3 seeds: untested
    records.append(judged(ACCURACY, [0.99, 0.98, 0.99, 0.985, 0.99, 0.98], [0.99] * 6))  # at the ceiling: untested
    decided = decide(records)
    tested = [0, 1, 2, 4]  # the ceiling's row is in the family by its test of a contradiction
    raw = [decided[index]["p"] for index in tested]
    order = sorted(range(4), key=raw.__getitem__)
    by_hand, running = [0.0] * 4, 0.0
    for rank, index in enumerate(order):  # Holm's step-down: (m - rank) p, made monotone
        running = max(running, min(1.0, (4 - rank) * raw[index]))
        by_hand[index] = running
    assert [decided[index]["p_adjusted"] for index in tested] == pytest.approx(by_hand)
    assert [record["task"] for record in decided[:3]] == ["truth 0.0", "truth 0.03", "truth 0.06"]
    assert decided[3]["p_adjusted"] is None and decided[3]["verdict"] == "inconclusive"
    assert f">= {MIN_SEEDS}" in decided[3]["reason"] and decided[4]["verdict"] == "regime differs"
    assert "not contradicted either" in decided[4]["reason"]  # tested for the opposite effect only
    assert all(record["verdict"] == ("reproduced" if record["p_adjusted"] <= ALPHA and record["p"] ==
                                     record["p_support"] else record["verdict"]) for record in decided[:3])
    assert f"| **{decided[2]['verdict']}** |" in decided[2]["row"]


@pytest.mark.slow  # statsmodels' Holm collects garbage on every call: 0.2 s each in a test process
def test_holm_keeps_the_family_wise_error_at_alpha_over_ten_null_claims():
    boundary = Claim("a", "s", "a", "b", "accuracy", effect=0.0, effect_source="none", chance=0.0, ceiling=1.0)
    generator, ledgers, trials = random.Random(4), 0, 200
    gc.freeze()  # the test process's objects out of those collections: they scanned the whole heap every call
    try:
        for _ in range(trials):
            records = [judged(boundary, *_simulated(0.0, 0.03, 5, generator)) for _ in range(10)]
            ledgers += any(record["verdict"] == "reproduced" for record in decide(records))
    finally:
        gc.unfreeze()
    assert ledgers / trials < ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials)  # without Holm: about 40 %


def test_smoke_and_gpu_rows_carry_their_numbers_and_no_verdict():
    arm, baseline = [0.80, 0.82, 0.81, 0.83, 0.79], [0.70, 0.71, 0.69, 0.72, 0.70]
    smoke = decide([judged(ACCURACY, arm, baseline)], smoke=True)[0]
    assert smoke["verdict"] == "smoke" and smoke["p_adjusted"] is None and "+0.106" in smoke["reason"]
    gpu = judged(ACCURACY, arm, baseline, needs_gpu="setting X")
    assert gpu["verdict"] == "needs a GPU" and "setting X" in gpu["reason"] and gpu["p"] is not None
    assert decide([gpu])[0]["verdict"] == "needs a GPU"


def test_bad_input_is_refused_with_the_field_named():
    with pytest.raises(UserError, match="pair them by seed"):
        judge(ACCURACY, [0.8] * 5, [0.7] * 4)
    with pytest.raises(UserError, match="non-finite"):
        judge(ACCURACY, [0.8, math.nan, 0.8, 0.8, 0.8], [0.7] * 5)
    with pytest.raises(UserError, match="Claim.effect"):
        Claim("a", "s", "a", "b", "m", effect=0.0, effect_source="e", kind="equivalent")
    with pytest.raises(UserError, match="Claim.effect"):
        Claim("a", "s", "a", "b", "m", effect=-1.0, effect_source="e")
    with pytest.raises(UserError, match="paper_baseline"):
        Claim("a", "s", "a", "b", "m", effect=0.1, effect_source="e", paper_baseline=0.5)
    with pytest.raises(UserError, match="Claim.target"):
        Claim("a", "s", "a", "b", "m", effect=0.1, effect_source="e", kind="reaches")


def test_the_row_has_one_cell_per_header_column():
    row = judged(ACCURACY, [0.80, 0.82, 0.81, 0.83, 0.79], [0.70, 0.71, 0.69, 0.72, 0.70])["row"]
    assert row.count("|") == LEDGER_HEADER.splitlines()[0].count("|")
    assert "(half Table 2's gap)" in row and "**reproduced**" in row


def test_identical_values_are_equivalent_and_a_constant_gap_is_decided_by_its_side():
    """The audit's case: TOST called identical accuracies (EqT's K = 8 and K = 32) inconclusive, while moving one seed
    by 1e-4 gave p 8e-10. With no spread the t statistic is infinite and p is its limit."""
    same = Claim("K = 8 and K = 32 identical", "s", "K32", "K8", "accuracy", effect=0.005, effect_source="e",
                 kind="equivalent", chance=0.5, ceiling=1.0)
    values = [0.81, 0.84, 0.79, 0.83, 0.80]
    identical = judge(same, values, values)
    assert identical.verdict == "reproduced" and identical.p_support == 0.0 and identical.interval == (0.0, 0.0)
    perturbed = judge(same, [values[0] + 1e-4, *values[1:]], values)
    assert perturbed.verdict == "reproduced"  # the two agree
    gap = judge(same, [value + 0.02 for value in values], values)  # every seed 2 points apart: beyond the margin
    assert gap.verdict == CONTRADICTED and gap.p_refute == 0.0
    assert judge(ACCURACY, [value + 0.05 for value in values], values).verdict == "reproduced"  # 0.05 > 0.02, exactly
    assert judge(ACCURACY, [value + 0.01 for value in values], values).verdict == "not reproduced"


def test_no_difference_is_refused_where_both_arms_sit_at_chance_or_at_the_ceiling():
    parity = Claim("FEM matches softmax", "s", "fem", "softmax", "accuracy", effect=0.01, effect_source="1 point",
                   kind="not_worse", chance=0.25, ceiling=1.0)
    at_chance = judge(parity, [0.251, 0.249, 0.25, 0.252, 0.248], [0.25, 0.251, 0.249, 0.25, 0.25])
    assert at_chance.verdict == "regime differs" and "chance 0.25" in at_chance.reason
    at_ceiling = judge(Claim(**{**parity.__dict__, "kind": "equivalent"}), [1.0, 0.999, 1.0, 1.0, 0.998],
                       [1.0] * 5)
    assert at_ceiling.verdict == "regime differs" and "ceiling" in at_ceiling.reason
    # one arm away from chance: "not worse" can be refuted, so the run answers
    refuted = judge(parity, [0.251, 0.249, 0.25, 0.252, 0.248], [0.60, 0.61, 0.59, 0.60, 0.62])
    assert refuted.verdict == CONTRADICTED


def test_a_gain_needs_room_above_the_floor_for_the_gain_it_claims():
    """The audit's case: a model at 2-3 % at R had a point of room, and Hyper-SET's larger gain was "reproduced"
    (p 0.0003). A level behind a gain needs room above the floor for the larger gain the run claims."""
    gain = Claim("scales better from R to 2R", "Fig. 3b", "h", "t", "gain", effect=0.01, effect_source="e",
                 chance=0.0, ceiling=1.0)
    arm, baseline = [0.06, 0.065, 0.06, 0.07, 0.06], [-0.02, -0.025, -0.02, -0.03, -0.02]
    starved = judge(gain, arm, baseline, levels={"h at R": [0.027, 0.02, 0.03, 0.025, 0.03],
                                                 "t at R": [0.5, 0.52, 0.49, 0.5, 0.51]})
    assert starved.verdict == "regime differs" and "h at R at 0.0264, within the larger gain 0.063" in starved.reason
    room = judge(gain, arm, baseline, levels={"h at R": [0.3, 0.32, 0.3, 0.29, 0.31],
                                              "t at R": [0.5, 0.52, 0.49, 0.5, 0.51]})
    assert room.verdict == "reproduced"


def _holm_step_interval(differences: list[float], level: float) -> tuple[float, float]:
    """The closed form: mean -+ t_{1 - level, n - 1} s / sqrt(n) (scipy's quantile; the interval is not scipy's)."""
    from scipy import stats

    mean, error = statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(len(differences))
    quantile = stats.t.ppf(1 - level, len(differences) - 1)
    return mean - quantile * error, mean + quantile * error


def test_the_printed_interval_is_at_the_level_of_the_claims_holm_step():
    """Three claims: ranks 0, 1, 2 by p are tested at 0.05/3, 0.05/2, 0.05; each interval is the two-sided one whose
    one-sided ends are those tests, so it clears the effect exactly when its step rejects."""
    generator = random.Random(5)
    records, truths = [], (0.12, 0.07, 0.035)
    for truth in truths:
        arm, baseline = _simulated(truth, 0.01, 6, generator)
        records.append(judged(ACCURACY, arm, baseline))
    decided = decide(records)
    order = sorted(range(3), key=lambda index: decided[index]["p"])
    for rank, index in enumerate(order):
        level = ALPHA / (3 - rank)
        values = records[index]["values"]
        differences = [a - b for a, b in zip(values["arm"], values["baseline"])]
        assert decided[index]["interval"] == pytest.approx(_holm_step_interval(differences, level))
        assert decided[index]["confidence"] == pytest.approx(1 - 2 * level)
        clears = decided[index]["interval"][0] > ACCURACY.effect
        assert clears == (decided[index]["p_support"] <= level)
    assert f"({100 * (1 - 2 * ALPHA / 3):.3g} %)" in decided[order[0]]["row"]


def _differences_with_p(p: float, seeds: int = 5) -> list[float]:
    """Differences whose one-sided t-test of "mean > 0" has p exactly ``p`` (a fixed zero-mean pattern, shifted)."""
    from scipy import stats

    pattern = [-2.0, -1.0, 0.0, 1.0, 2.0][:seeds]
    spread = statistics.stdev(pattern)
    return [stats.t.ppf(1 - p, seeds - 1) * spread / math.sqrt(seeds) + value for value in pattern]


def test_a_step_down_that_stopped_before_a_claim_says_so_beside_its_interval():
    """p 0.03 and 0.04 in a family of two: the first is tested at 0.025 and kept, so Holm stops; the second's own
    step (0.05) would reject, and its interval clears zero, yet it is not decided: the row says why."""
    at_zero = Claim("a", "s", "a", "b", "difference", effect=0.0, effect_source="none")
    decided = decide([judged(at_zero, _differences_with_p(p), [0.0] * 5) for p in (0.03, 0.04)])
    assert [record["p"] for record in decided] == pytest.approx([0.03, 0.04])
    assert [record["p_adjusted"] for record in decided] == pytest.approx([0.06, 0.06])
    assert [record["verdict"] for record in decided] == ["inconclusive", "inconclusive"]
    assert decided[0]["interval"][0] < 0 < decided[1]["interval"][0]  # at 0.025 and 0.05 respectively
    assert "stopped at a claim ranked before this one" in decided[1]["reason"]
    assert "stopped" not in decided[0]["reason"]


def test_holm_is_within_a_paper_so_another_papers_claims_do_not_move_a_verdict():
    from energyzoo.reproduce.report import build_ledger, code_state

    generator = random.Random(6)

    def report(truth: float, count: int) -> dict:
        pairs = [_simulated(truth, 0.02, 5, generator) for _ in range(count)]
        return {"setting": "full", "seconds": 1.0, "settings": {}, "machine": "here", "verdicts": [
            judged(ACCURACY, arm, baseline) for arm, baseline in pairs]}

    alone = {"fem-argmax": report(0.06, 2) | {"code": code_state("fem-argmax")}}
    crowded = {**alone, "hyperset": report(0.0, 20) | {"code": code_state("hyperset")}}
    first = build_ledger(alone, "alone")["experiments"]["fem-argmax"]["verdicts"]
    second = build_ledger(crowded, "crowded")["experiments"]["fem-argmax"]["verdicts"]
    assert [record["p_adjusted"] for record in first] == [record["p_adjusted"] for record in second]
    assert [record["verdict"] for record in first] == [record["verdict"] for record in second]


def test_the_primary_is_tested_alone_first_and_opens_the_secondary_claims_holm():
    """Serial gatekeeping: the primary at full alpha; the secondary claims Holm-adjusted among themselves only once it
    is decided, and left untested (their numbers shown, the reason given) where it is not."""
    primary = Claim(**{**ACCURACY.__dict__, "primary": True, "quote": "the headline"})
    secondary_p = (0.001, 0.02, 0.3)
    secondary = [judged(Claim(f"secondary {p}", "s", "a", "b", "difference", effect=0.0, effect_source="none"),
                        _differences_with_p(p), [0.0] * 5) for p in secondary_p]
    decided = decide([judged(primary, [0.80, 0.82, 0.81, 0.83, 0.79], [0.70, 0.71, 0.69, 0.72, 0.70]), *secondary])
    assert decided[0]["verdict"] == "reproduced" and decided[0]["p_adjusted"] == decided[0]["p"]
    assert decided[0]["confidence"] == pytest.approx(1 - 2 * ALPHA)  # a family of one: its own level
    holm_by_hand = [3 * 0.001, max(3 * 0.001, 2 * 0.02), max(3 * 0.001, 2 * 0.02, 0.3)]
    assert [record["p_adjusted"] for record in decided[1:]] == pytest.approx(holm_by_hand)
    assert [record["verdict"] for record in decided[1:]] == ["reproduced", "reproduced", "inconclusive"]

    undecided = decide([judged(primary, [0.71, 0.69, 0.73, 0.70, 0.70], [0.70, 0.71, 0.69, 0.72, 0.70]), *secondary])
    assert undecided[0]["verdict"] == "inconclusive" and undecided[0]["p"] > ALPHA
    for record in undecided[1:]:  # p 0.001 would pass any Holm step, yet the gate is shut
        assert record["verdict"] == GATED and record["p_adjusted"] is None
        assert "gatekeeping" in record["reason"] and f"p {record['p']:.2g}" in record["reason"]
    assert undecided[1]["p"] == pytest.approx(0.001)
    # a row that could not decide (regime differs) and lies wholly against its claim is untested too, and says both
    at_ceiling = Claim("solves it better", "s", "a", "b", "accuracy", effect=0.01, effect_source="e", ceiling=1.0)
    behind = judged(at_ceiling, [0.70, 0.75, 0.68, 0.72, 0.74], [1.0, 0.995, 1.0, 1.0, 0.998])
    gated = decide([judged(primary, [0.71, 0.69, 0.73, 0.70, 0.70], [0.70, 0.71, 0.69, 0.72, 0.70]), behind])[1]
    assert gated["verdict"] == GATED and "would be regime differs" in gated["reason"]


@pytest.mark.slow  # statsmodels' Holm collects garbage on every call
def test_gatekeeping_keeps_the_papers_family_wise_error_at_alpha():
    """A primary whose truth is the claim (p tiny, the gate opens) and nine null secondary claims at their bound:
    a false "reproduced" among the secondaries in at most alpha of the papers."""
    boundary = Claim("a", "s", "a", "b", "accuracy", effect=0.0, effect_source="none", chance=0.0, ceiling=1.0)
    primary = Claim(**{**boundary.__dict__, "primary": True, "quote": "headline"})
    generator, false_papers, trials = random.Random(12), 0, 200
    gc.freeze()
    try:
        for _ in range(trials):
            records = [judged(primary, *_simulated(0.2, 0.03, 5, generator)),
                       *(judged(boundary, *_simulated(0.0, 0.03, 5, generator)) for _ in range(9))]
            false_papers += any(record["verdict"] == "reproduced" for record in decide(records)[1:])
    finally:
        gc.unfreeze()
    assert false_papers / trials < ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / trials)


def test_a_paper_has_one_primary_claim_and_its_rows_say_which():
    primary = Claim(**{**ACCURACY.__dict__, "primary": True})
    arm, baseline = [0.80, 0.82, 0.81, 0.83, 0.79], [0.70, 0.71, 0.69, 0.72, 0.70]
    decided = decide([judged(primary, arm, baseline), judged(ACCURACY, arm, baseline)])
    assert "(Table 2; primary)" in decided[0]["row"] and "(Table 2; secondary)" in decided[1]["row"]
    other = Claim(**{**primary.__dict__, "quote": "another headline"})
    with pytest.raises(UserError, match="one primary claim"):
        decide([judged(primary, arm, baseline), judged(other, arm, baseline)])


def _rejection_rate(claim: Claim, truth: float, spread: float, seeds: int, level: float, trials: int = 4000):
    """How often the supporting test rejects at ``level``, by simulation with scipy's t-test (independent of
    `power`'s noncentral t)."""
    from scipy import stats

    generator = random.Random(7)
    rejected = 0
    for _ in range(trials):
        differences = [truth + generator.gauss(0, spread) for _ in range(seeds)]
        if claim.kind == "equivalent":
            p = max(stats.ttest_1samp(differences, -claim.effect, alternative="greater").pvalue,
                    stats.ttest_1samp(differences, claim.effect, alternative="less").pvalue)
        else:
            bound = claim.effect if claim.kind == "better" else -claim.effect
            p = stats.ttest_1samp(differences, bound, alternative="greater").pvalue
        rejected += p <= level
    return rejected / trials


@pytest.mark.parametrize("kind, truth", [("better", 0.04), ("not_worse", 0.0), ("equivalent", 0.0)])
def test_power_is_the_simulated_rejection_rate_at_the_papers_effect(kind, truth):
    from energyzoo.reproduce.verdict import power

    claim = Claim(**{**ACCURACY.__dict__, "kind": kind, "paper_effect": truth})
    computed = power(claim, spread=0.015, seeds=6, level=ALPHA / 3)
    simulated = _rejection_rate(claim, truth, 0.015, 6, ALPHA / 3)
    if kind == "equivalent":  # the Bonferroni bound of TOST's two tests: a lower bound, close when both are strong
        assert simulated + 0.02 >= computed >= simulated - 0.2
    else:
        assert computed == pytest.approx(simulated, abs=3 * math.sqrt(0.25 / 4000))


def test_seeds_for_power_is_the_fewest_that_reach_the_target_and_the_row_says_when_it_falls_short():
    from energyzoo.reproduce.verdict import MAX_SEEDS, TARGET_POWER, power, seeds_for_power

    claim = Claim(**{**ACCURACY.__dict__, "paper_effect": 0.04})
    needed = seeds_for_power(claim, 0.03, ALPHA)
    assert MIN_SEEDS < needed <= MAX_SEEDS
    assert power(claim, 0.03, needed, ALPHA) >= TARGET_POWER > power(claim, 0.03, needed - 1, ALPHA)
    assert seeds_for_power(claim, 1.0, ALPHA) == MAX_SEEDS + 1  # a noise 50x the effect: no seed count is enough
    assert seeds_for_power(ACCURACY, 0.03, ALPHA) is None  # no paper effect, no power
    generator = random.Random(8)
    arm, baseline = _simulated(0.04, 0.03, 5, generator)
    row = judged(claim, arm, baseline)
    assert row["power"] == pytest.approx(power(claim, statistics.stdev(
        [a - b for a, b in zip(arm, baseline)]), 5, ALPHA))
    assert row["power"] < TARGET_POWER and "underpowered: power" in row["reason"]
    pilot = decide([judged(claim, arm[:3], baseline[:3])], smoke=True)[0]
    assert pilot["verdict"] == "smoke" and f"a full run needs {pilot['seeds_for_power']} seeds" in pilot["reason"]


def test_the_refuting_side_of_tost_keeps_its_error_at_alpha_inside_the_margin():
    same = Claim("no difference", "s", "a", "b", "accuracy", effect=0.01, effect_source="e", kind="equivalent",
                 chance=0.0, ceiling=1.0)
    generator = random.Random(9)
    refuted = sum(judge(same, *_simulated(0.0, 0.03, 5, generator)).verdict == "not reproduced" for _ in range(1000))
    # a true zero lies inside the margin: "not equivalent" is a false verdict; one side alone erred up to 2 alpha
    assert refuted / 1000 < ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 1000)


COUNT = Claim("TEL wins 98 of 120 comparisons", "tel.txt §3.1", "tel", "a coin", "share of a dataset's cells won",
              kind="wins", effect=0.158, effect_source="half the paper's excess over a coin", paper_effect=0.317,
              primary=True)


def test_a_count_claim_tests_the_units_shares_not_the_comparisons():
    """Six datasets of three widths each: the unit is the dataset (its widths share its data), so the test is the t
    over the six shares, written out here, and the same 14 wins of 18 read as independent cells would say more."""
    from scipy import stats

    shares = [1.0, 1.0, 1.0, 1.0, 1 / 3, 1 / 3]  # 14 of 18 cells won
    result = judge(COUNT, shares, [0.5] * 6)
    excess = [share - 0.5 for share in shares]
    mean, spread = statistics.fmean(excess), statistics.stdev(excess)
    t = (mean - 0.158) / (spread / math.sqrt(6))
    assert result.p_support == pytest.approx(stats.t.sf(t, 5))
    half_width = stats.t.ppf(0.95, 5) * spread / math.sqrt(6)
    assert result.interval == pytest.approx((mean - half_width, mean + half_width))
    assert result.verdict == "inconclusive" and result.seeds == 6
    assert result.p_support > stats.binomtest(14, 18, 0.658, alternative="greater").pvalue  # the cells' sign test
    assert judge(COUNT, [1.0, 1.0, 2 / 3, 1.0, 1.0, 1.0], [0.5] * 6).verdict == "reproduced"
    behind = judge(COUNT, [0.0, 1 / 3, 0.0, 0.0, 1 / 3, 0.0], [0.5] * 6)
    assert behind.verdict == CONTRADICTED and behind.interval[1] < -0.158


def test_an_interval_wholly_against_the_claim_is_said_whatever_the_regime():
    """The audit's rows: Hyper-SET 27 points behind a Transformer at the ceiling, and a "needs a GPU" row wholly below
    zero, both read as undecided. An interval beyond the effect against the claim is a verdict of its own."""
    at_ceiling = Claim("Hyper-SET solves Sudoku better", "s", "hyperset", "transformer", "accuracy", effect=0.01,
                       effect_source="1 point", chance=0.0, ceiling=1.0)
    behind = judge(at_ceiling, [0.70, 0.75, 0.68, 0.72, 0.74], [1.0, 0.995, 1.0, 1.0, 0.998])
    assert behind.verdict == CONTRADICTED and behind.interval[1] < -0.01 and "regime differs" in behind.reason
    beside = judge(at_ceiling, [0.999, 1.0, 0.998, 1.0, 0.999], [1.0, 0.995, 1.0, 1.0, 0.998])
    assert beside.verdict == "regime differs" and beside.p_adjusted is not None  # tested, not contradicted
    gpu = judge(ACCURACY, [0.60, 0.61, 0.62, 0.60, 0.61], [0.70, 0.70, 0.71, 0.69, 0.70], needs_gpu="setting X")
    assert gpu.verdict == CONTRADICTED and gpu.interval[1] < -ACCURACY.effect and "needs a GPU" in gpu.reason
    short = judge(ACCURACY, [0.69, 0.70, 0.70, 0.68, 0.70], [0.70, 0.70, 0.71, 0.69, 0.70], needs_gpu="setting X")
    assert short.verdict == "needs a GPU"  # behind, but within the effect: nothing to say at this scale
    # in a family, the contradiction test takes its Holm step like the tested claims
    decided = decide([judged(at_ceiling, [0.70, 0.75, 0.68, 0.72, 0.74], [1.0, 0.995, 1.0, 1.0, 0.998]),
                      judged(ACCURACY, [0.72, 0.73, 0.74, 0.72, 0.73], [0.70, 0.70, 0.71, 0.69, 0.70])])
    assert decided[0]["verdict"] == CONTRADICTED and decided[0]["p_adjusted"] <= ALPHA
    assert decided[0]["confidence"] in (pytest.approx(1 - ALPHA), pytest.approx(1 - 2 * ALPHA))


def test_the_false_contradiction_rate_at_the_bound_stays_at_alpha():
    """A true difference of exactly -effect (the boundary of "against the claim beyond the effect"), at a baseline
    at the ceiling so the row cannot decide otherwise: contradicted in at most alpha of the trials."""
    claim = Claim("not worse", "s", "a", "b", "accuracy", effect=0.02, effect_source="e", kind="not_worse",
                  ceiling=0.7)
    generator = random.Random(5)
    rate = sum(judge(claim, *_simulated(-0.02, 0.03, 5, generator)).verdict == CONTRADICTED
               for _ in range(1000)) / 1000
    assert rate < ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 1000)


def test_an_equivalence_of_a_mechanism_that_does_nothing_is_not_judged():
    """EqT's K = 8 against K = 32 on parity: equal to 1.5e-4, and so is K = 0 (refinement inert at that scale)."""
    same = Claim("K = 8 and K = 32 identical", "s", "K32", "K8", "accuracy", effect=0.005, effect_source="e",
                 kind="equivalent", chance=0.5, ceiling=1.0)
    k8 = [0.6015, 0.5573, 0.6380, 0.5901, 0.6102]
    k32 = [value + 1e-5 for value in k8]
    inert = judge(same, k32, k8, mechanism_off=[value - 1.5e-4 for value in k8])
    assert inert.verdict == INERT and inert.p_adjusted is None and "at most 0.00016" in inert.reason
    acting = judge(same, k32, k8, mechanism_off=[value - 0.05 for value in k8])
    assert acting.verdict == "reproduced"
    record = judged(same, k32, k8, mechanism_off=[value - 1.5e-4 for value in k8])
    assert decide([record])[0]["verdict"] == INERT and record["values"]["mechanism_off"][0] == pytest.approx(0.60135)
