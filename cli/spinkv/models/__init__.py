"""The model store: resolution of --model, registry pulls, GGUF import/export, model facts."""
