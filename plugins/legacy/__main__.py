"""`python -m plugins.legacy`: the same as the fleet-plugin-legacy command."""

import sys

from plugins.legacy.server import main

sys.exit(main())
