"""`python -m plugins.ocm`: the same as the fleet-plugin-ocm command."""

import sys

from plugins.ocm.server import main

sys.exit(main())
