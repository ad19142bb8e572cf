"""The experiments table of `energyzoo reproduce NAME [field=value ...]`: each experiment's module, its settings class
(whose fields the command line overrides, typed by their annotations), the function that runs it, and what it
compares, and its quick setting. Every experiment's report is written by `report.write_report` and carries its
``verdicts`` (`verdict.judged` records) for the ledger of `energyzoo reproduce all`; adding one adds a row here and a
module with a settings dataclass, a run function, ``format_markdown(report)`` and ``plot(report, path)``."""

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Experiment:
    """module: energyzoo.reproduce.<module>; settings and run: names in it (run(settings[, output_dir], progress)
    returns the report, a dict with its ``seconds``); trains_models: whether run keeps trained models in
    ``output_dir`` (and takes it); quick: the overrides of ``--quick`` (a few minutes on 2 CPU cores, still >= 3
    seeds and every arm), applied before the command line's."""

    module: str
    settings: str
    run: str
    description: str
    quick: tuple[str, ...]
    trains_models: bool = True

    def code(self) -> ModuleType:
        return importlib.import_module(f"{__package__}.{self.module}")


EXPERIMENTS = {
    "fem-argmax": Experiment("fem_argmax", "ArgmaxSettings", "run_argmax",
                             "fem.txt App. P: one softmax-attention vs one FEM layer on the channel-wise argmax",
                             ("length=32", "channels=128", "steps=1000", "validation_samples=500"),
                             trains_models=False),
    "fem-lm": Experiment("fem_lm", "LanguageModelSettings", "run_language_model",
                         "fem.txt Table 2 at CPU scale: FEM-SM vs Llama of the same shape on the embedded corpus",
                         ("steps=200",)),
    "fem-mad": Experiment("fem_mad", "MadSettings", "run_mad",
                          "fem.txt Table 1: the MAD ladder softmax -> +C -> +C,L -> +C,L,T -> FEM-SM on the six tasks",
                          ("steps=100", "test_examples=256"), trains_models=False),
    "tel-stage1": Experiment("tel_stage1", "StageOneSettings", "run_stage_one",
                             "tel.txt Stage I: Linear vs MLP vs TEL at matched width on embedded data",
                             ("seeds=3", "widths=[16,64]"), trains_models=False),
    "hyperset": Experiment("hyperset", "HypersetSettings", "run_hyperset",
                           "Hyper-SET vs its Transformer baseline: Sudoku at R-2R, digits; MaskGIT; traces",
                           ("sudoku_arms=[hyperset,transformer]", "sudoku_steps=600", "classification_steps=400",
                            "maskgit_steps=300", "evaluation_puzzles=300")),
    "eqt-parity": Experiment("eqt_parity", "ParitySettings", "run_parity",
                             "EqT-LLaMA vs Llama on cumulative parity (eqt.txt Table 2)",
                             ("steps=600", "test_sequences=512")),
    "eer-induction": Experiment("eer_induction", "InductionSettings", "run_induction",
                                "EER vs cross-entropy on induction heads, trained at L 16-64, evaluated at L 10 / "
                                "100 / 1000 (eer.txt App. C)", ("steps=200", "eval_every=200",
                                                                "eval_sequences=128")),
    "eer-block-screen": Experiment("eer_screen", "ScreenSettings", "run_screen",
                                   "EER's unstated block choices (norms, embedding scale, readout, length curriculum) "
                                   "screened at T = 4", ("steps=400",)),
}
