"""`python -m spinkv` runs the CLI."""

from spinkv.commands.app import main

main()
