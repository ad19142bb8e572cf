"""The verdict rule of `energyzoo reproduce` on constructed per-seed results, against hand-computed means and
standard errors."""

import math

import pytest

from energyzoo.reproduce.verdict import LEDGER_HEADER, Claim, judge, verdict_markdown

ACCURACY = Claim("EqT beats Llama", "Table 2", "eqt", "llama", "accuracy", chance=0.5, ceiling=1.0)
LOSS = Claim("FEM-SM beats a Transformer", "Table 2", "fem", "llama", "loss", higher_is_better=False)


def test_a_gain_on_every_seed_beyond_twice_its_standard_error_is_reproduced():
    result = judge(ACCURACY, [0.80, 0.82, 0.81], [0.70, 0.71, 0.69])
    assert result.verdict == "reproduced"
    assert result.difference == pytest.approx(0.11)
    assert result.standard_error == pytest.approx(0.01 / math.sqrt(3))  # stdev of the differences is 0.01
    assert result.arm == pytest.approx((0.81, 0.01)) and result.baseline == pytest.approx((0.70, 0.01))
    assert "on every seed" in result.reason


def test_lower_is_better_metrics_flip_the_sign():
    assert judge(LOSS, [2.00, 2.10, 2.05], [2.30, 2.35, 2.40]).verdict == "reproduced"
    worse = judge(LOSS, [2.50, 2.60, 2.55], [2.30, 2.35, 2.40])
    assert worse.verdict == "not reproduced" and worse.difference == pytest.approx(-0.2)


def test_seeds_that_split_are_inconclusive():
    result = judge(ACCURACY, [0.80, 0.60, 0.75], [0.70, 0.70, 0.70])
    assert result.verdict == "inconclusive" and "seeds disagree: 2 of 3" in result.reason


def test_an_agreeing_gain_inside_the_noise_is_inconclusive_not_reproduced():
    result = judge(ACCURACY, [0.701, 0.75, 0.702], [0.70, 0.70, 0.70])  # differences 0.001, 0.05, 0.002
    assert result.verdict == "inconclusive" and "within 2 standard errors" in result.reason


@pytest.mark.parametrize(("baseline", "where"), [([0.51, 0.50, 0.52], "chance"), ([0.30, 0.32, 0.31], "chance"),
                                                 ([0.99, 0.98, 1.0], "the ceiling")])
def test_a_baseline_at_chance_or_ceiling_cannot_answer(baseline, where):
    result = judge(ACCURACY, [0.9, 0.9, 0.9], baseline)
    assert result.verdict == "inconclusive" and f"sits at {where}" in result.reason


def test_chance_and_ceiling_follow_the_metrics_direction():
    loss = Claim("A lowers the loss", "Table 2", "a", "b", "loss", higher_is_better=False, chance=2.3, ceiling=0.0,
                 band=0.1)
    assert "sits at chance" in judge(loss, [1.0, 1.1, 1.0], [2.5, 2.45, 2.6]).reason  # above a loss's chance
    assert "sits at the ceiling" in judge(loss, [0.01, 0.02, 0.0], [0.05, 0.04, 0.06]).reason
    assert judge(loss, [1.0, 1.1, 1.05], [1.5, 1.45, 1.6]).verdict == "reproduced"


def test_fewer_than_three_seeds_give_no_verdict():
    two = judge(ACCURACY, [0.9, 0.9], [0.7, 0.7])
    assert (two.verdict, two.reason) == ("inconclusive", "2 seeds; a verdict needs >= 3")


def test_a_parity_claim_allows_the_margin_and_no_more():
    parity = Claim("matches ViT", "Table 1", "hyperset", "vit", "accuracy", kind="not_worse", margin=0.02)
    assert judge(parity, [0.79, 0.795, 0.79], [0.80, 0.80, 0.80]).verdict == "reproduced"
    assert judge(parity, [0.70, 0.71, 0.72], [0.80, 0.80, 0.80]).verdict == "not reproduced"


def test_an_absolute_number_is_judged_against_the_target_not_the_baseline():
    reaches = Claim("79.2% at L = 1000", "eer.txt Table 2", "eer", "ce", "accuracy", kind="reaches", target=0.792,
                    chance=1 / 3)
    short = judge(reaches, [0.36, 0.35, 0.37], [0.34, 0.35, 0.36])  # both near chance: still a verdict on 0.792
    assert (short.verdict, short.difference) == ("not reproduced", pytest.approx(0.36 - 0.792))
    assert "eer is not at 0.792 or better on any seed" in short.reason
    assert judge(reaches, [0.95, 0.94, 0.96], [0.34, 0.35, 0.36]).verdict == "reproduced"


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="eqt has 3 seeds and llama 2"):
        judge(ACCURACY, [0.8, 0.8, 0.8], [0.7, 0.7])
    with pytest.raises(ValueError, match="non-finite accuracy"):
        judge(ACCURACY, [0.8, math.nan, 0.8], [0.7, 0.7, 0.7])
    with pytest.raises(ValueError, match="Claim.kind must be one of"):
        Claim("q", "s", "a", "b", "m", kind="equal")
    with pytest.raises(ValueError, match="Claim.target is the value a 'reaches' claim names"):
        Claim("q", "s", "a", "b", "m", kind="reaches")


def test_the_ledger_row_quotes_the_claim_and_both_arms():
    row = verdict_markdown(ACCURACY, judge(ACCURACY, [0.80, 0.82, 0.81], [0.70, 0.71, 0.69]))
    assert row.startswith("| EqT beats Llama (Table 2) | eqt 0.81 ± 0.01 | llama 0.7 ± 0.01 | **reproduced** |")
    assert row.count("|") == LEDGER_HEADER.splitlines()[0].count("|")
