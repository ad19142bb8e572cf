"""The suites of `energyzoo eval`: lm-eval task lists with their few-shot setting, read without importing lm-eval or
torch (so that a mistyped ``--suite`` is answered at once)."""

SUITES = {
    "leaderboard": {"tasks": ["leaderboard"], "num_fewshot": None},
    "general": {"tasks": ["arc_challenge", "arc_easy", "hellaswag", "piqa", "boolq", "winogrande", "copa",
                          "openbookqa", "sciq"], "num_fewshot": 0},
    # zero-shot, the tasks' own setting (they name no few-shot count): passing 0 would be "overwriting" it, in lm-eval's
    # notice
    "local": {"tasks": ["energyzoo_pydoc_mc", "energyzoo_pydoc_ppl"], "num_fewshot": None},
}
