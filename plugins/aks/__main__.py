"""`python -m plugins.aks`: the same as the fleet-plugin-aks command."""

import sys

from plugins.aks.server import main

sys.exit(main())
