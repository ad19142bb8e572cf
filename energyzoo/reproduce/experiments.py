"""The experiments table of `energyzoo reproduce NAME [field=value ...]`: each experiment's module (whose ``Settings``
fields the command line overrides, typed by their annotations), what it compares, and its quick setting. Every
experiment's report is written by `report.write_report` and carries its ``verdicts`` (`verdict.judged` records) for
the ledger of `energyzoo reproduce all`; adding one adds a row here and a module with the names `Experiment` lists."""

import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from ..modeling.errors import UserError

SETTINGS = ("quick", "full", "paper-scale")
TRAINING_LOOP = ("registry.py", "training")  # the inputs of an experiment that trains through `energyzoo train`
WORKERS = ("reproduce/processes.py",)  # the inputs of one that spreads its runs over processes


@dataclass(frozen=True)
class Experiment:
    """module: energyzoo.reproduce.<module>, which defines ``Settings`` (a dataclass), ``run(settings[, output_dir],
    progress)`` (the report, a dict with its ``seconds``; it takes ``output_dir`` where it keeps trained models
    there), ``format_markdown(report)`` and ``plot(report, path)``; quick: the overrides of ``--quick`` (a few
    minutes on 2 CPU cores, still >= 3 seeds and every arm: a smoke test, no verdicts), applied before the command
    line's; paper_scale: the overrides of ``--paper-scale`` (the paper's own scale, for a GPU); inputs: what else it
    reads (the training loop, data sources, recipes, presets: globs under energyzoo/, `code_paths`); cut: what the
    full setting leaves out of the paper's protocol (the module's docstring says why), shown beside the ledger;
    replay: the overrides that cut a report's own settings down to its designated part (a seed, a cell: minutes),
    which `energyzoo reproduce NAME --replay` reruns with the checkout's code against the report's numbers of that
    part (the module's ``replayed_part(report)``: those entries of a report), to ``replay_tolerance`` (0:
    bit-identical, the run being deterministic on one CPU thread; else the module's ``REPLAY_TOLERANCE``, where its
    code's rounding moved), so that a report of earlier code joins a ledger only where its numbers are shown to be
    this code's (`report.stale_code`); rows: the report's key of the per-seed results its module's ``verdicts(rows,
    settings)`` judges, from which a ledger derives the verdict records afresh with the checkout's claims and rule
    (`report.report_verdicts`; None: the records the report carries).
    The defaults are the full setting: the protocol at the largest scale that fits about two hours on 2 CPU cores
    (the whole ledger in about eight), >= 5 seeds. The family (whose model cards and docs page show the verdicts) is
    the module's first word."""

    module: str
    description: str
    quick: tuple[str, ...]
    paper_scale: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()  # what it reads besides its module and model code (globs under energyzoo/)
    cut: str = field(kw_only=True)  # required of every experiment: what its full setting leaves out
    replay: tuple[str, ...] = field(default=(), kw_only=True)  # () : no designated part yet
    rows: str | None = field(default=None, kw_only=True)

    @property
    def replay_tolerance(self) -> float:
        """How far a replay's numbers may lie from the report's: the module's ``REPLAY_TOLERANCE``, stated and
        justified there, else 0 (bit-identical)."""
        return getattr(self.code(), "REPLAY_TOLERANCE", 0.0)

    @property
    def family(self) -> str:
        """The paper family (its model card template and docs page): the module's first word."""
        return self.module.split("_")[0]

    def overrides(self, setting: str) -> tuple[str, ...]:
        if setting not in SETTINGS:
            raise UserError(f"setting must be one of {SETTINGS}, got {setting!r}")
        if setting == "paper-scale" and not self.paper_scale:
            raise UserError(f"{self.module} has no paper-scale setting: its paper's scale is out of reach offline "
                             f"(its module docstring says why)")
        return {"quick": self.quick, "full": (), "paper-scale": self.paper_scale}[setting]

    def code(self) -> ModuleType:
        return importlib.import_module(f"{__package__}.{self.module}")

    def code_paths(self) -> list[str]:
        """The files (relative to the checkout; git pathspecs, some globs) whose change can change this experiment's
        numbers: its module, its family's model code and the shared model code, and its ``inputs`` (the training
        loop and the registry among them where it trains through `energyzoo train`'s loop). The verdict rule and the
        report writer are not among them: a ledger applies them again to the per-seed values."""
        package = Path(__file__).parents[1]
        families = {experiment.family for experiment in EXPERIMENTS.values()}

        def owner(stem: str) -> str:  # the family prefix of a model file, "" for a shared one
            stem = stem.removeprefix("configuration_").removeprefix("modeling_")
            return stem.split("_")[0] if stem.split("_")[0] in families else ""

        modeling = sorted(f"energyzoo/modeling/{path.name}" for path in (package / "modeling").glob("*.py")
                          if owner(path.stem) in ("", self.family))
        return [f"energyzoo/reproduce/{self.module}.py", *modeling,
                *(f"energyzoo/{pattern}" for pattern in self.inputs)]

    @property
    def trains_models(self) -> bool:
        """Whether ``run`` keeps files (trained models, finished parts) in an ``output_dir`` it takes."""
        return "output_dir" in inspect.signature(self.code().run).parameters


EXPERIMENTS = {
    "fem-argmax": Experiment("fem_argmax",
                             "fem.txt App. P: one softmax-attention vs one FEM layer on the channel-wise argmax",
                             ("seeds=[0,1,2]", "steps=300", "validation_samples=500"),
                             ("length=128", "channels=512", "steps=2000", "validation_samples=2000", "device=cuda"),
                             cut=("T = 32, D = 128 and 1,000 steps instead of App. P's T = 128, D = 512 and 2,000 "
                                  "steps"), replay=("seeds=[0]",)),
    "fem-lm": Experiment("fem_lm",
                         "fem.txt Table 2 at CPU scale: FEM-SM vs Llama of the same shape on the embedded corpus",
                         ("seeds=[0,1,2]", "steps=100", "evaluations=2"),
                         inputs=(*TRAINING_LOOP, "data/text.py", "recipes/fem-lm-tiny.yaml",
                                 "presets/fem-lm-tiny.json", "presets/llama-tiny.json"),
                         cut=("1.3M parameters on 2M tokens of Python source, judged by held-out loss, instead of "
                              "340M on 15B tokens of FineWeb-Edu judged by lm-eval's tasks"),
                         replay=("seeds=[0]", "learning_rates=[3e-3]")),
    "fem-mad": Experiment("fem_mad",
                          "fem.txt Table 1: the MAD ladder softmax -> +C -> +C,L -> +C,L,T -> FEM-SM",
                          ("seeds=[0,1,2]", "steps=100", "learning_rates=[1e-3]", "test_examples=256"),
                          ("tasks=[compress,fuzzy_recall,in_context_recall,memorize,noisy_recall,selective_copy]",
                           "hidden_size=128", "max_length=null", "steps=20000", "batch_size=128",
                           "learning_rates=[1e-4,5e-4,1e-3]", "weight_decays=[0.0,0.1]", "workers=1",
                           "device=cuda"), inputs=(*WORKERS, "data/mad.py"),
                          cut=("width 64, sequences of 64, 300 steps of batch 32 and two learning rates instead of "
                               "MAD's width 128, full lengths, 20,000 steps of batch 128 and six grid points; "
                               "compress and fuzzy recall, which nothing learns there, need a GPU"),
                          replay=("tasks=[in_context_recall]", "seeds=[0]"), rows="rows"),
    "tel-stage1": Experiment("tel_stage1",
                             "tel.txt Stage I: Linear vs MLP vs TEL at matched width on embedded data",
                             ("seeds=3", "selection_seeds=3", "widths=[16,64]", "learning_rates=[3e-3]",
                              "dropouts=[0.0]", "weight_decays=[0.01]", "max_epochs=60"),
                             inputs=(*WORKERS, "reproduce/parts.py"),
                             cut=("G.1's grid picked on 3 of the 20 runs; embedded scikit-learn data and two of "
                                  "H.1's five baselines instead of MNIST, CIFAR and UCI against five"),
                             replay=("datasets=[wine]", "widths=[16]", "seeds=3"), rows="records"),
    "hyperset": Experiment("hyperset",
                           "Hyper-SET vs its Transformer baseline: Sudoku at R-2R, digits; MaskGIT; traces",
                           ("seeds=[0,1,2]", "sudoku_steps=600", "classification_seeds=[0,1,2]", "grid_seeds=1",
                            "classification_learning_rates=[1e-3,3e-3]", "classification_steps=400",
                            "maskgit_steps=300", "evaluation_puzzles=300"),
                           ("sudoku_side=9", "sudoku_givens=[17,34]", "sudoku_steps=112500",
                            "evaluation_puzzles=1000"),
                           inputs=(*TRAINING_LOOP, *WORKERS, "reproduce/parts.py", "data/sudoku.py",
                                   "data/digits.py", "data/image_tokenizer.py", "recipes/hyperset-*.yaml",
                                   "presets/hyperset-*.json"),
                           cut=("4x4 Sudoku, 8x8 digits and k-means digit codes instead of 9x9 Sudoku, CIFAR / "
                                "ImageNet and a VQ tokenizer; tiny models trained for minutes"),
                           replay=("seeds=[0]", "classification_seeds=[0]", "grid_seeds=1")),
    "eqt-parity": Experiment("eqt_parity",
                             "EqT-LLaMA vs Llama on cumulative parity (eqt.txt Table 2)",
                             ("seeds=[0,1,2]", "steps=300", "test_sequences=512"),
                             ("lengths=[64,192]", "model_scale=paper", "steps=3200", "test_sequences=4096"),
                             inputs=(*TRAINING_LOOP, "data/parity.py", "recipes/eqt-parity*.yaml",
                                     "presets/eqt-parity*.json", "presets/llama-parity*.json"),
                             cut=("a 0.2M-parameter model, 1,200 steps of batch 64, L = 64 only, instead of 6.3M "
                                  "parameters, 25 epochs in batches of 256, L = 64 and 192"), replay=("seeds=[0]",),
                             rows="rows"),
    "eer-induction": Experiment("eer_induction",
                                "EER vs cross-entropy on induction heads, trained at L 16-64, evaluated at L 10 / "
                                "100 / 1000 (eer.txt App. C)", ("seeds=[0,1,2]", "steps=200", "eval_every=200",
                                                                "eval_sequences=128"),
                                ("steps=20000", "eval_every=500", "tf32=true"),
                                inputs=(*TRAINING_LOOP, "data/induction.py", "recipes/eer-induction.yaml",
                                        "presets/eer-induction*.json"),
                                cut="1,000 steps instead of Table 1's 20,000; TF32 on against off needs a GPU",
                                replay=("seeds=[0]",), rows="runs"),
    "eer-block-screen": Experiment("eer_screen",
                                   "EER's unstated block choices (norms, embedding scale, readout, length curriculum, "
                                   "App. C's initial energy) screened at T = 4", ("seeds=[0,1,2]", "steps=300"),
                                   inputs=(*TRAINING_LOOP, "data/induction.py", "recipes/eer-induction.yaml",
                                           "presets/eer-induction*.json"),
                                   cut=("T = 4 loops instead of 25 (a screen of choices the paper leaves unstated, "
                                        "not a claim of the paper)"), replay=("seeds=[0]",)),
}
