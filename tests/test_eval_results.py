"""lm-eval's results read in one place (`harness.scores`) and printed by lm-eval's own table writer."""

from energyzoo.eval.harness import Score, format_results_table, scores

# The shape `lm_eval.simple_evaluate` returns (and `energyzoo eval` saves): "metric,filter" keys, a stderr per
# metric ("N/A" where lm-eval has none), an alias, and a filtered task with two filters.
RESULTS = {
    "results": {
        "arc_easy": {"alias": "arc_easy", "acc,none": 0.25, "acc_stderr,none": 0.0125,
                     "acc_norm,none": 0.5, "acc_norm_stderr,none": 0.015},
        "energyzoo_pydoc_ppl": {"alias": "energyzoo_pydoc_ppl", "bits_per_byte,none": 1.75,
                                "bits_per_byte_stderr,none": "N/A"},
        "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.125, "exact_match_stderr,strict-match": 0.01,
                  "exact_match,flexible-extract": 0.375, "exact_match_stderr,flexible-extract": 0.02},
    },
    "versions": {"arc_easy": 1.0, "energyzoo_pydoc_ppl": 1.0, "gsm8k": 3.0},
    "n-shot": {"arc_easy": 0, "energyzoo_pydoc_ppl": 0, "gsm8k": 5},
    "higher_is_better": {"arc_easy": {"acc": True, "acc_norm": True}, "energyzoo_pydoc_ppl": {"bits_per_byte": False},
                         "gsm8k": {"exact_match": True}},
}


def test_scores_are_every_metric_and_filter_with_its_stderr():
    assert scores(RESULTS) == [
        Score("arc_easy", "acc", "none", 0.25, 0.0125),
        Score("arc_easy", "acc_norm", "none", 0.5, 0.015),
        Score("energyzoo_pydoc_ppl", "bits_per_byte", "none", 1.75, None),
        Score("gsm8k", "exact_match", "strict-match", 0.125, 0.01),
        Score("gsm8k", "exact_match", "flexible-extract", 0.375, 0.02),
    ]
    assert scores({"results": {}}) == []


def test_the_table_is_lm_evals_own_with_every_score():
    table = format_results_table(RESULTS)
    assert table.splitlines()[0].replace(" ", "") == "|Tasks|Version|Filter|n-shot|Metric||Value||Stderr|"
    for score in scores(RESULTS):
        row = next(line for line in table.splitlines()
                   if f"|{score.metric}" in line.replace(" ", "") and f"|{score.filter}|" in line.replace(" ", "")
                   and f"|{score.value:.3f}|" in line.replace(" ", ""))
        assert (score.stderr is None) == ("N/A" in row)
