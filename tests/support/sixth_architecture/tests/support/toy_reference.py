"""The toy architecture's float64 oracle: Llama's own, which transformers' tests hold."""
