"""Plumbing (hand-written): `python -m dsml` runs the command line."""
import sys

from dsml.cli import main

sys.exit(main())
