"""The skip reasons of transformers' common tests on the zoo, counted per family, as docs/contributing.md lists them.

Run transformers' suites with their slow tests and a JUnit report, then this script on the report:

    RUN_SLOW=1 ENERGYZOO_TRANSFORMERS_TESTS=... python -m pytest -q tests/test_*_transformers.py --junitxml=skips.xml
    python scripts/skip_reasons.py skips.xml

Each reason is marked "needs a GPU", "needs a package" or "not applicable" (`KINDS`: the first pattern its text
matches; the zoo's own reasons and transformers' "does not support" ones are not applicable).
"""

import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter

FAMILIES = {"EER": "EER", "EqTLlama": "EqT", "FEM": "FEM", "HyperSET": "Hyper-SET", "TEL": "TEL"}
KINDS = (("needs a GPU", r"accelerator|Flash Attention|MPS"),
         ("needs a package", r"ExecuTorch|ONNXScript|optimum-quanto|kernels library|ExportedModel\.module"))
MODEL_NAMES = re.compile(r"<class '[^']*'>|\b(?:EER|EqTLlama|EqT-LLaMA|FEM|HyperSET|TEL)\w*")


def kind(reason: str) -> str:
    return next((name for name, pattern in KINDS if re.search(pattern, reason)), "not applicable")


def skip_counts(report: str) -> Counter:
    """(reason, family) -> skipped tests, a reason's model names replaced by "the model"."""
    counts = Counter()
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None:
            continue
        test_class = case.get("classname").rsplit(".", 1)[-1]
        family = next(label for prefix, label in FAMILIES.items() if test_class.startswith(prefix))
        reason = MODEL_NAMES.sub("the model", " ".join((skipped.get("message") or "").split()))
        counts[reason, family] += 1
    return counts


def table(counts: Counter) -> str:
    families = list(FAMILIES.values())
    reasons = sorted({reason for reason, _ in counts}, key=lambda r: (kind(r), -sum(counts[r, f] for f in families)))
    lines = ["| reason | kind | " + " | ".join(families) + " |", "|---|---|" + "---|" * len(families)]
    for reason in reasons:
        cells = [str(counts[reason, family] or "") for family in families]
        lines.append(f"| {reason.replace('|', '/')} | {kind(reason)} | " + " | ".join(cells) + " |")
    totals = [str(sum(counts[reason, family] for reason in reasons)) for family in families]
    lines.append("| all skips | | " + " | ".join(totals) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(skip_counts(sys.argv[1])))
