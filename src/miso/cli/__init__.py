"""The ``miso`` command line (entry point ``miso.cli:app``): one module per command group.

* :mod:`~miso.cli.main` - the root command, local commands (hardware, optimizer) and wiring;
* :mod:`~miso.cli.text` - the one ``fail()`` / ``safe()`` / ``plain()`` (terminal-safe output);
* :mod:`~miso.cli.checks` - flag and file checks (one-line usage errors);
* :mod:`~miso.cli.client` - commands that talk to a running cluster over HTTP (``status``,
  ``submit``, ...); they import neither the server nor Ray, so they start fast;
* :mod:`~miso.cli.cluster`, :mod:`~miso.cli.users`, :mod:`~miso.cli.events`,
  :mod:`~miso.cli.simulate`, :mod:`~miso.cli.predictor`, :mod:`~miso.cli.demo`
  (:mod:`~miso.cli.demo_cluster` runs it), :mod:`~miso.cli.doctor`.
"""

from miso.cli.main import app

__all__ = ["app"]
