"""A learner's self-check before submitting: python tools/validate.py path/to/notebook.ipynb

What `make validate NB=...` runs; the logic is the learner package's (attncourse.validate), which a
learner without make runs as `attncourse validate path/to/notebook.ipynb`.
"""
import sys

from attncourse.validate import main

if __name__ == "__main__":
    sys.exit(main())
