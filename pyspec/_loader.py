"""Map llama_cpp's own libllama before pyspec._core (placeholder)."""
