"""The ``agentsession`` command: a thin click layer over :mod:`agentsession_cas`."""
