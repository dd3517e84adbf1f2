"""Import and export of public checkpoints (Hugging Face Llama / Mistral / Qwen2 families)."""
