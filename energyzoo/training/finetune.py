"""Fine-tuning any zoo model with the transformers `Trainer` (docs/usage.md's example, as a function).

    >>> from energyzoo.training.finetune import finetune_with_trainer
    >>> finetune_with_trainer("runs/quickstart/train/model", "runs/finetuned", max_steps=100)

The saved head's task (registry) picks the data and the batch mapping (`training.tasks`): language models
fine-tune on packed blocks of the given texts (default: the embedded Python documentation), image classifiers
on scikit-learn's digits, and so on; ``data`` names other data as a recipe's data section does, one's own image
folder for instance:

    >>> finetune_with_trainer("runs/own-images/model", "runs/tuned", data={"source": "hf-images",
    ...                       "name": "imagefolder", "paths": ["my-images"]})

The tuned model is saved in `output_dir` (tokenizer included).
"""

from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, Trainer, TrainingArguments

from ..data.text import pack_into_blocks
from ..modeling.errors import UserError
from ..registry import architecture
from .recipe import DataSection, typed_settings
from .tasks import TrainingData, training_task


def _data_section(data: dict | None, task, config, block_size: int) -> DataSection:
    """The data to tune on, as a recipe's data section (its checks and paths as `energyzoo train`'s): ``data``, else
    the task's default source. Images are read at the model's size and channels."""
    settings = {"source": next(iter(task.sources)), "block_size": block_size, **(data or {})}
    settings.setdefault("image_size", getattr(config, "image_size", None))
    settings.setdefault("num_channels", getattr(config, "num_channels", None))
    section = typed_settings(DataSection, base=settings, owner="finetune_with_trainer data")
    section.paths = [str(Path(name).expanduser().absolute()) for name in section.paths]
    section.validate(task.name)
    return section


def _check_classes(fields: dict, config) -> None:
    """An image folder's classes are the ones the model's head was trained for (their number; their names where the
    model has its own)."""
    names = fields.get("id2label")
    if names is not None and len(names) != config.num_labels:
        raise UserError(f"finetune_with_trainer data: {len(names)} classes ({', '.join(names.values())}), but the "
                        f"model's head has {config.num_labels} (num_labels): train a new head with energyzoo train")


def finetune_with_trainer(model_dir: str | Path, output_dir: str | Path, max_steps: int = 100,
                          learning_rate: float = 1e-3, batch_size: int = 8, block_size: int = 128,
                          texts: list[str] | None = None, data: dict | None = None) -> Trainer:
    """Fine-tune the zoo model saved in `model_dir` with `Trainer` on CPU or GPU; returns the trainer. ``texts``
    (a language model's) or ``data`` (a recipe's data section as a dict: source, paths, ...) replace the default
    data; an image folder's class names become the tuned model's ``id2label``."""
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    task_name, head = architecture(config.model_type).head(config.architectures)
    task = training_task(task_name)
    model = head.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir) if task.tokenized else None
    if texts is not None:
        blocks = pack_into_blocks(texts, tokenizer, block_size, "finetune_with_trainer texts")
        data = TrainingData(blocks, blocks, blocks[:0], blocks[:0])
    else:
        data = task.load(_data_section(data, task, config, block_size), tokenizer, 0)
        _check_classes(data.config_fields, config)
        for name in ("id2label", "label2id"):
            if name in data.config_fields:
                setattr(model.config, name, data.config_fields[name])
    rows = [task.model_inputs(inputs, labels) for inputs, labels in zip(data.train_inputs, data.train_labels)]
    arguments = TrainingArguments(output_dir=str(output_dir), max_steps=max_steps, learning_rate=learning_rate,
                                  per_device_train_batch_size=batch_size, lr_scheduler_type="cosine",
                                  warmup_steps=max(1, max_steps // 10), weight_decay=0.1, max_grad_norm=1.0,
                                  logging_steps=max(1, max_steps // 10), save_strategy="no", report_to=[])
    trainer = Trainer(model=model, args=arguments, train_dataset=rows)
    trainer.train()
    trainer.save_model(str(output_dir))
    if tokenizer is not None:
        tokenizer.save_pretrained(output_dir)
    return trainer
