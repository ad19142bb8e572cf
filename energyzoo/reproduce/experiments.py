"""The experiments table of `energyzoo reproduce NAME [field=value ...]`: each experiment's module (whose ``Settings``
fields the command line overrides, typed by their annotations), what it compares, and its quick setting. Every
experiment's report is written by `report.write_report` and carries its ``verdicts`` (`verdict.judged` records) for
the ledger of `energyzoo reproduce all`; adding one adds a row here and a module with the names `Experiment` lists."""

import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Experiment:
    """module: energyzoo.reproduce.<module>, which defines ``Settings`` (a dataclass), ``run(settings[,
    output_dir], progress)`` (the report, a dict with its ``seconds``; it takes ``output_dir`` where it keeps trained
    models there), ``format_markdown(report)`` and ``plot(report, path)``; quick: the overrides of ``--quick`` (a few
    minutes on 2 CPU cores, still >= 3 seeds and every arm), applied before the command line's."""

    module: str
    description: str
    quick: tuple[str, ...]

    def code(self) -> ModuleType:
        return importlib.import_module(f"{__package__}.{self.module}")

    @property
    def trains_models(self) -> bool:
        """Whether ``run`` keeps trained models in an ``output_dir`` it takes."""
        return "output_dir" in inspect.signature(self.code().run).parameters


EXPERIMENTS = {
    "fem-argmax": Experiment("fem_argmax",
                             "fem.txt App. P: one softmax-attention vs one FEM layer on the channel-wise argmax",
                             ("length=32", "channels=128", "steps=1000", "validation_samples=500")),
    "fem-lm": Experiment("fem_lm",
                         "fem.txt Table 2 at CPU scale: FEM-SM vs Llama of the same shape on the embedded corpus",
                         ("steps=200",)),
    "fem-mad": Experiment("fem_mad",
                          "fem.txt Table 1: the MAD ladder softmax -> +C -> +C,L -> +C,L,T -> FEM-SM on the six tasks",
                          ("steps=100", "test_examples=256")),
    "tel-stage1": Experiment("tel_stage1",
                             "tel.txt Stage I: Linear vs MLP vs TEL at matched width on embedded data",
                             ("seeds=3", "widths=[16,64]")),
    "hyperset": Experiment("hyperset",
                           "Hyper-SET vs its Transformer baseline: Sudoku at R-2R, digits; MaskGIT; traces",
                           ("sudoku_arms=[hyperset,transformer]", "sudoku_steps=600", "classification_steps=400",
                            "maskgit_steps=300", "evaluation_puzzles=300")),
    "eqt-parity": Experiment("eqt_parity",
                             "EqT-LLaMA vs Llama on cumulative parity (eqt.txt Table 2)",
                             ("steps=600", "test_sequences=512")),
    "eer-induction": Experiment("eer_induction",
                                "EER vs cross-entropy on induction heads, trained at L 16-64, evaluated at L 10 / "
                                "100 / 1000 (eer.txt App. C)", ("steps=200", "eval_every=200",
                                                                "eval_sequences=128")),
    "eer-block-screen": Experiment("eer_screen",
                                   "EER's unstated block choices (norms, embedding scale, readout, length curriculum) "
                                   "screened at T = 4", ("steps=400",)),
}
