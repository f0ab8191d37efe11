"""`python -m spinkv` runs the CLI."""

from spinkv.cli.app import main

main()
