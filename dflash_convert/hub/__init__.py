"""Layer 3, the Hugging Face Hub: resolve/pull/push through huggingface_hub's own API (client), the
model card (card) and token handling (tokens). Imports the format and I/O layers only."""
