"""`python -m plugins.eks`: the same as the fleet-plugin-eks command."""

import sys

from plugins.eks.server import main

sys.exit(main())
