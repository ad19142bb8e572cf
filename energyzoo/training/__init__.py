"""Training code: offline data (embedded corpus, local tokenizer), training loops."""
