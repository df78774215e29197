"""`python -m plugins.gke`: the same as the fleet-plugin-gke command."""

import sys

from plugins.gke.server import main

sys.exit(main())
