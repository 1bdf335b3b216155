"""``python -m miso.cli``: the ``miso`` command."""

import sys

from miso.cli.main import main

sys.exit(main())
