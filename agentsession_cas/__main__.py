"""``python -m agentsession_cas``: the ``agentsession`` command, for a machine where the
script is not on the PATH. The library never imports the command (nor click): the
command's package is looked up by name here, only when run."""

import importlib

if __name__ == "__main__":
    importlib.import_module("agentsession_cli.main").main(prog_name="agentsession")
