"""The command line frame: the typer app, shared options, rich output, one-line errors."""
