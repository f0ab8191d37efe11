"""The `spinkv` command-line interface (typer + rich), a thin layer over `spinkv.api`."""
