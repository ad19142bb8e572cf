"""Training: run recipes (`recipe`, `recipe_files`), the run itself with accelerate (`run`, `engines`, `schedule`), its
tasks and validation (`tasks`, `validation`), run folders and checkpoints (`checkpoints`), and fine-tuning with the
transformers `Trainer` (`finetune`). The data they read is in `energyzoo.data`."""
