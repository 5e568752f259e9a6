"""python -m attncourse validate NOTEBOOK: the learner's command line (attncourse.cli)."""
import sys

from .cli import main

sys.exit(main())
