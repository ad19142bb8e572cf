"""Fine-tuning any zoo model with the transformers `Trainer` (the README's example, as a function).

    >>> from energyzoo.training.finetune import finetune_with_trainer
    >>> finetune_with_trainer("runs/quickstart/train/model", "runs/finetuned", max_steps=100)

Language models fine-tune on packed blocks of the given texts (default: the embedded Python documentation);
image classifiers on scikit-learn's digits. The tuned model is saved in `output_dir` (tokenizer included).
"""

from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, Trainer, TrainingArguments

from ..hub_cards.export import head_auto_class
from .data import digits_split, pack_into_blocks, python_docs_corpus


def finetune_rows(model_dir: Path, auto_class, texts: list[str] | None, block_size: int):
    """Training rows for `Trainer` and the tokenizer (None for image classifiers)."""
    if auto_class.__name__ == "AutoModelForImageClassification":
        images, labels, _, _ = digits_split(validation_fraction=0.2, seed=0)
        return [{"pixel_values": image, "labels": label} for image, label in zip(images, labels)], None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    blocks = pack_into_blocks(texts if texts is not None else python_docs_corpus()[0], tokenizer, block_size)
    return [{"input_ids": block, "labels": block} for block in blocks], tokenizer


def finetune_with_trainer(model_dir: str | Path, output_dir: str | Path, max_steps: int = 100,
                          learning_rate: float = 1e-3, batch_size: int = 8, block_size: int = 128,
                          texts: list[str] | None = None) -> Trainer:
    """Fine-tune the zoo model saved in `model_dir` with `Trainer` on CPU or GPU; returns the trainer."""
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    auto_class = head_auto_class(config.model_type, config.architectures)
    model = auto_class.from_pretrained(model_dir)
    rows, tokenizer = finetune_rows(model_dir, auto_class, texts, block_size)
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
