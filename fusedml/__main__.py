"""``python -m fusedml``: the same command line as the ``fusedml`` console script."""
import sys

from .cli import main

sys.exit(main())
