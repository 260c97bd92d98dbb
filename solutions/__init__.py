"""Reference solutions of the exercises (kept apart from the notebooks)."""
