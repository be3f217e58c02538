"""``python -m agentsession_cas``: the ``agentsession`` command."""

from agentsession_cli.main import main

if __name__ == "__main__":
    main(prog_name="agentsession")
