"""Fine-tuning any zoo model with the transformers `Trainer` (docs/usage.md's example, as a function).

    >>> from energyzoo.training.finetune import finetune_with_trainer
    >>> finetune_with_trainer("runs/quickstart/train/model", "runs/finetuned", max_steps=100)

The saved head's task (registry) picks the data and the batch mapping (`training.tasks`): language models
fine-tune on packed blocks of the given texts (default: the embedded Python documentation), image classifiers
on scikit-learn's digits, and so on. The tuned model is saved in `output_dir` (tokenizer included).
"""

from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, Trainer, TrainingArguments

from ..data.text import pack_into_blocks
from ..registry import architecture
from .recipe import DataSection
from .tasks import TrainingData, training_task


def finetune_with_trainer(model_dir: str | Path, output_dir: str | Path, max_steps: int = 100,
                          learning_rate: float = 1e-3, batch_size: int = 8, block_size: int = 128,
                          texts: list[str] | None = None) -> Trainer:
    """Fine-tune the zoo model saved in `model_dir` with `Trainer` on CPU or GPU; returns the trainer."""
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    task_name, head = architecture(config.model_type).head(config.architectures)
    task = training_task(task_name)
    model = head.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir) if task.tokenized else None
    if texts is not None:
        blocks = pack_into_blocks(texts, tokenizer, block_size)
        data = TrainingData(blocks, blocks, blocks[:0], blocks[:0])
    else:
        data = task.load(DataSection(source=next(iter(task.sources)), block_size=block_size), tokenizer, 0)
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
