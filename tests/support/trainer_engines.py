"""transformers' `Trainer` on a zoo model, data parallel or under DeepSpeed, 2 processes on CPU (gloo).

Run under ``python -m torch.distributed.run --nproc_per_node 2 tests/support/trainer_engines.py OUT ENGINE``
(ENGINE: "ddp", "zero2" or "zero3"): a tiny FEM-LM, 4 SGD steps of 2 processes x 2 accumulated micro-batches of 2 on
fixed random sequences, saved by `Trainer.save_model` to OUT. The engines see the same batches (the same sampler
over 2 processes), so their weights agree up to the reductions' rounding.

On a CPU, `TrainingArguments(deepspeed=...)` sets up accelerate's state without a backend, and each process then
takes itself for the only one; a state set up first over gloo (`use_configured_state`) is what it needs
(docs/training.md, "Scaling out")."""

import os
import sys

import torch
from accelerate import PartialState
from transformers import Trainer, TrainingArguments

import energyzoo

STEPS, SEQUENCE, EXAMPLES = 4, 12, 16


def deepspeed_config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": stage, "stage3_gather_16bit_weights_on_model_save": True}}


def main(output_dir: str, engine: str) -> None:
    on_deepspeed = engine != "ddp"
    if on_deepspeed:
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="gloo")
    torch.manual_seed(0)
    model = energyzoo.model_from_preset("fem-lm-tiny", hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    ids = torch.randint(0, model.config.vocab_size, (EXAMPLES, SEQUENCE), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": row, "labels": row} for row in ids]
    arguments = TrainingArguments(
        output_dir, per_device_train_batch_size=2, gradient_accumulation_steps=2, max_steps=STEPS, learning_rate=0.05,
        optim="sgd", lr_scheduler_type="constant", save_strategy="no", report_to=[], seed=0, data_seed=0,
        ddp_backend="gloo", use_cpu=not on_deepspeed, accelerator_config={"use_configured_state": on_deepspeed},
        deepspeed=deepspeed_config(int(engine[-1])) if on_deepspeed else None)
    trainer = Trainer(model=model, args=arguments, train_dataset=rows)
    trainer.train()
    accelerator = trainer.accelerator
    assert accelerator.num_processes == 2, accelerator.num_processes
    assert str(accelerator.distributed_type).endswith("DEEPSPEED" if on_deepspeed else "MULTI_CPU")
    trainer.save_model(output_dir)
    # every process leaves the gloo group before exiting: a process that exits inside it can abort in gloo's
    # thread teardown ("terminate called without an active exception") while another still writes
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:])
