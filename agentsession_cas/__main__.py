"""``python -m agentsession_cas``: the ``agentsession`` command.

The command lives in the ``agentsession_cli`` package (the ``cli/`` folder of the
project); it is found at run time, since the library itself never imports it."""

from importlib import import_module

if __name__ == "__main__":
    import_module("agentsession_cli.main").main(prog_name="agentsession")
