"""``python -m streaming.tools.cli``: ``spark-abs``."""

import sys

from streaming.tools.cli.main import main

sys.exit(main())
